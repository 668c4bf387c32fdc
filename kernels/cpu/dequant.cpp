#include "kernels/cpu/dequant.hpp"

#include <algorithm>
#include <cstring>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"

namespace kvb {
namespace {

inline uint16_t rd16(const uint8_t* p) { return static_cast<uint16_t>(p[0] | p[1] << 8); }
inline float rdh(const uint8_t* p) { return half_to_float(rd16(p)); }

constexpr int QK = 32;
constexpr int QK_K = 256;

void block_q4_0(const uint8_t* b, float* y) {
  const float d = rdh(b);
  const uint8_t* qs = b + 2;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * static_cast<float>((qs[j] & 0x0F) - 8);
    y[j + QK / 2] = d * static_cast<float>((qs[j] >> 4) - 8);
  }
}

void block_q4_1(const uint8_t* b, float* y) {
  const float d = rdh(b), m = rdh(b + 2);
  const uint8_t* qs = b + 4;
  for (int j = 0; j < QK / 2; ++j) {
    y[j] = d * static_cast<float>(qs[j] & 0x0F) + m;
    y[j + QK / 2] = d * static_cast<float>(qs[j] >> 4) + m;
  }
}

// The fifth bit of element j lives in bit j of a little-endian 32-bit word.
inline uint32_t rd32(const uint8_t* p) {
  return static_cast<uint32_t>(p[0]) | static_cast<uint32_t>(p[1]) << 8 | static_cast<uint32_t>(p[2]) << 16 |
         static_cast<uint32_t>(p[3]) << 24;
}

void block_q5_0(const uint8_t* b, float* y) {
  const float d = rdh(b);
  const uint32_t qh = rd32(b + 2);
  const uint8_t* qs = b + 6;
  for (int j = 0; j < QK / 2; ++j) {
    const int x0 = static_cast<int>((qs[j] & 0x0F) | ((qh >> j) & 1u) << 4) - 16;
    const int x1 = static_cast<int>((qs[j] >> 4) | ((qh >> (j + 16)) & 1u) << 4) - 16;
    y[j] = d * static_cast<float>(x0);
    y[j + QK / 2] = d * static_cast<float>(x1);
  }
}

void block_q5_1(const uint8_t* b, float* y) {
  const float d = rdh(b), m = rdh(b + 2);
  const uint32_t qh = rd32(b + 4);
  const uint8_t* qs = b + 8;
  for (int j = 0; j < QK / 2; ++j) {
    const uint32_t x0 = (qs[j] & 0x0Fu) | ((qh >> j) & 1u) << 4;
    const uint32_t x1 = (qs[j] >> 4u) | ((qh >> (j + 16)) & 1u) << 4;
    y[j] = d * static_cast<float>(x0) + m;
    y[j + QK / 2] = d * static_cast<float>(x1) + m;
  }
}

void block_q8_0(const uint8_t* b, float* y) {
  const float d = rdh(b);
  const auto* qs = reinterpret_cast<const int8_t*>(b + 2);
  for (int j = 0; j < QK; ++j) y[j] = static_cast<float>(qs[j]) * d;
}

void block_q4_k(const uint8_t* b, float* y) {
  const float d = rdh(b), dmin = rdh(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* q = b + 16;
  for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, q += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>(q[l] & 0xF) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>(q[l] >> 4) - m2;
  }
}

void block_q5_k(const uint8_t* b, float* y) {
  const float d = rdh(b), dmin = rdh(b + 2);
  const uint8_t* scales = b + 4;
  const uint8_t* qh = b + 16;
  const uint8_t* ql = b + 48;
  uint8_t u1 = 1, u2 = 2;
  for (int j = 0, is = 0; j < QK_K; j += 64, is += 2, ql += 32) {
    uint8_t sc, m;
    scale_min_k4(is, scales, sc, m);
    const float d1 = d * sc, m1 = dmin * m;
    scale_min_k4(is + 1, scales, sc, m);
    const float d2 = d * sc, m2 = dmin * m;
    for (int l = 0; l < 32; ++l) *y++ = d1 * static_cast<float>((ql[l] & 0xF) + ((qh[l] & u1) ? 16 : 0)) - m1;
    for (int l = 0; l < 32; ++l) *y++ = d2 * static_cast<float>((ql[l] >> 4) + ((qh[l] & u2) ? 16 : 0)) - m2;
    u1 = static_cast<uint8_t>(u1 << 2);
    u2 = static_cast<uint8_t>(u2 << 2);
  }
}

void block_q6_k(const uint8_t* b, float* y) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  const float d = rdh(b + 208);
  for (int n = 0; n < QK_K; n += 128, y += 128, ql += 64, qh += 32, sc += 8) {
    for (int l = 0; l < 32; ++l) {
      const int is = l / 16;
      const int q1 = ((ql[l] & 0xF) | ((qh[l] >> 0) & 3) << 4) - 32;
      const int q2 = ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) - 32;
      const int q3 = ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) - 32;
      const int q4 = ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) - 32;
      y[l + 0] = d * static_cast<float>(sc[is + 0]) * static_cast<float>(q1);
      y[l + 32] = d * static_cast<float>(sc[is + 2]) * static_cast<float>(q2);
      y[l + 64] = d * static_cast<float>(sc[is + 4]) * static_cast<float>(q3);
      y[l + 96] = d * static_cast<float>(sc[is + 6]) * static_cast<float>(q4);
    }
  }
}

using BlockFn = void (*)(const uint8_t*, float*);

BlockFn block_fn(DType t) {
  switch (t) {
    case DType::Q4_0:
      return block_q4_0;
    case DType::Q4_1:
      return block_q4_1;
    case DType::Q5_0:
      return block_q5_0;
    case DType::Q5_1:
      return block_q5_1;
    case DType::Q8_0:
      return block_q8_0;
    case DType::Q4_K:
      return block_q4_k;
    case DType::Q5_K:
      return block_q5_k;
    case DType::Q6_K:
      return block_q6_k;
    default:
      return nullptr;
  }
}

// Converts blocks [b0, b1) of a tensor.
void dequant_range(DType type, const uint8_t* src, float* dst, size_t b0, size_t b1) {
  const auto& info = dtype_info(type);
  switch (type) {
    case DType::F32:
      std::memcpy(dst + b0, src + b0 * 4, (b1 - b0) * 4);
      return;
    case DType::F16:
      for (size_t i = b0; i < b1; ++i) dst[i] = half_to_float(rd16(src + 2 * i));
      return;
    case DType::BF16:
      for (size_t i = b0; i < b1; ++i) dst[i] = bf16_to_float(rd16(src + 2 * i));
      return;
    default:
      break;
  }
  BlockFn fn = block_fn(type);
  for (size_t i = b0; i < b1; ++i) fn(src + i * info.block_bytes, dst + i * info.block_elems);
}

// Validates the request up front so that no thread throws inside a parallel region.
size_t block_count(DType type, size_t n) {
  const auto& info = dtype_info(type);
  if (!info.dequantizable) fail("dequantization of {} tensors is not supported", info.name);
  if (n % info.block_elems != 0)
    fail("dequantize: {} elements is not a whole number of {}-element {} blocks", n, info.block_elems, info.name);
  return n / info.block_elems;
}

}  // namespace

void dequantize_ref(DType type, const uint8_t* src, float* dst, size_t n) {
  dequant_range(type, src, dst, 0, block_count(type, n));
}

void dequantize(DType type, const uint8_t* src, float* dst, size_t n) {
  const size_t nb = block_count(type, n);
  const size_t chunk = 4096;
#pragma omp parallel for schedule(static)
  for (size_t c = 0; c < (nb + chunk - 1) / chunk; ++c)
    dequant_range(type, src, dst, c * chunk, std::min(nb, (c + 1) * chunk));
}

}  // namespace kvb
