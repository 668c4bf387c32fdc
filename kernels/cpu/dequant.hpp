#pragma once
// Dequantization of GGUF/safetensors tensor data to fp32. The block layouts are ggml's; the order of
// floating-point operations follows ggml's reference dequantizers so that results are bit-identical
// to other implementations that follow them (checked against the gguf Python package).
#include <cstddef>
#include <cstdint>
#include <cstring>

#include "kernels/dtype.hpp"

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

// All eight scales and mins of a Q4_K/Q5_K block at once, by whole-word masks (the vector kernels'
// way): out[0..7] = the scales of sub-blocks 0-7, out[8..15] their mins, as scale_min_k4 gives them.
inline void unpack_scales_mins_k4(const uint8_t* q, uint8_t out[16]) {
  uint32_t w[3];
  std::memcpy(w, q, 12);
  constexpr uint32_t six = 0x3F3F3F3F, four = 0x0F0F0F0F, two = 0x03030303;
  const uint32_t u[4] = {w[0] & six,                                        // scales 0-3: bytes 0-3
                         (w[2] & four) | ((w[0] >> 6) & two) << 4,          // scales 4-7
                         w[1] & six,                                        // mins 0-3: bytes 4-7
                         ((w[2] >> 4) & four) | ((w[1] >> 6) & two) << 4};  // mins 4-7
  std::memcpy(out, u, 16);
}

// Plain reference: n elements (a whole number of blocks) from src to dst, one block after another.
void dequantize_ref(DType type, const uint8_t* src, float* dst, size_t n);

// Same result, split over OpenMP threads by blocks; used by the model loader.
void dequantize(DType type, const uint8_t* src, float* dst, size_t n);

}  // namespace kvb
