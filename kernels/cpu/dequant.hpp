#pragma once
// Dequantization of GGUF/safetensors tensor data to fp32. The block layouts are ggml's; the order of
// floating-point operations follows ggml's reference dequantizers so that results are bit-identical
// to other implementations that follow them (checked against the gguf Python package).
#include <cstddef>
#include <cstdint>

#include "harness/model/dtype.hpp"

namespace kvb {

// Plain reference: n elements (a whole number of blocks) from src to dst, one block after another.
void dequantize_ref(DType type, const uint8_t* src, float* dst, size_t n);

// Same result, split over OpenMP threads by blocks; used by the model loader.
void dequantize(DType type, const uint8_t* src, float* dst, size_t n);

}  // namespace kvb
