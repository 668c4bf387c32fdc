#pragma once
// Quantization to GGUF's K-quant blocks (Q4_K, Q6_K), for random-weight models of real shapes in the
// formats of Q4_K_M files (harness/model/random_model.hpp). Each sub-block takes the scale that spans
// its values and each value the nearest step: simpler than ggml's searched scales, which fit real
// weight distributions better, but the same blocks for every reader.
#include <cstddef>
#include <cstdint>

#include "kernels/dtype.hpp"

namespace kvb {

// n values (a multiple of 256) into n / 256 blocks of type Q4_K or Q6_K.
void quantize_kquant(DType t, const float* x, uint8_t* out, size_t n);

}  // namespace kvb
