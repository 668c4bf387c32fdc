#pragma once
// Dequantization of GGUF/safetensors tensor data to fp32. The block layouts are ggml's; the order of
// floating-point operations follows ggml's reference dequantizers so that results are bit-identical
// to other implementations that follow them (checked against the gguf Python package).
#include <cstddef>
#include <cstdint>

#include "harness/model/dtype.hpp"

namespace kvb {

// 6-bit scale and min of sub-block j (of 8) from the 12-byte packed array of a Q4_K/Q5_K block.
inline void scale_min_k4(int j, const uint8_t* q, uint8_t& sc, uint8_t& m) {
  if (j < 4) {
    sc = q[j] & 63;
    m = q[j + 4] & 63;
  } else {
    sc = static_cast<uint8_t>((q[j + 4] & 0xF) | ((q[j - 4] >> 6) << 4));
    m = static_cast<uint8_t>((q[j + 4] >> 4) | ((q[j] >> 6) << 4));
  }
}

// Plain reference: n elements (a whole number of blocks) from src to dst, one block after another.
void dequantize_ref(DType type, const uint8_t* src, float* dst, size_t n);

// Same result, split over OpenMP threads by blocks; used by the model loader.
void dequantize(DType type, const uint8_t* src, float* dst, size_t n);

}  // namespace kvb
