#include "kernels/cpu/quantize.hpp"

#include <algorithm>
#include <cmath>
#include <cstring>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"

namespace kvb {

namespace {

constexpr int QKK = 256;

// The fp16 a block stores, and the value a reader gets back from it.
float store_half(uint8_t* p, float v) {
  const uint16_t h = float_to_half(v);
  std::memcpy(p, &h, 2);
  return half_to_float(h);
}

int clamp_round(float v, int lo, int hi) { return std::clamp(static_cast<int>(std::lround(v)), lo, hi); }

// value = d sc_j q - dmin m_j, q in 0..15, per sub-block j of 32; sc_j, m_j 6-bit.
void block_q4_k(const float* x, uint8_t* b) {
  float scale[8], min[8];
  for (int j = 0; j < 8; ++j) {
    const float* s = x + 32 * j;
    const float lo = std::min(0.0f, *std::min_element(s, s + 32)), hi = std::max(lo, *std::max_element(s, s + 32));
    scale[j] = (hi - lo) / 15.0f;
    min[j] = -lo;
  }
  const float d = store_half(b, *std::max_element(scale, scale + 8) / 63.0f);
  const float dmin = store_half(b + 2, *std::max_element(min, min + 8) / 63.0f);
  uint8_t sc[8], m[8];
  for (int j = 0; j < 8; ++j) {
    sc[j] = static_cast<uint8_t>(d > 0 ? clamp_round(scale[j] / d, 0, 63) : 0);
    m[j] = static_cast<uint8_t>(dmin > 0 ? clamp_round(min[j] / dmin, 0, 63) : 0);
  }
  // The 12-byte packing scale_min_k4 (dequant.hpp) reads back.
  uint8_t* q = b + 4;
  for (int j = 0; j < 4; ++j) {
    q[j] = static_cast<uint8_t>(sc[j] | (sc[j + 4] >> 4) << 6);
    q[j + 4] = static_cast<uint8_t>(m[j] | (m[j + 4] >> 4) << 6);
    q[j + 8] = static_cast<uint8_t>((sc[j + 4] & 0xF) | (m[j + 4] & 0xF) << 4);
  }
  uint8_t* qs = b + 16;
  for (int c = 0; c < 4; ++c)
    for (int l = 0; l < 32; ++l) {
      int v[2];
      for (int h = 0; h < 2; ++h) {
        const int j = 2 * c + h;
        const float ds = d * sc[j], dm = dmin * m[j];
        v[h] = ds > 0 ? clamp_round((x[64 * c + 32 * h + l] + dm) / ds, 0, 15) : 0;
      }
      qs[32 * c + l] = static_cast<uint8_t>(v[0] | v[1] << 4);
    }
}

// value = d sc_k (q - 32), q in 0..63, per sub-block k of 16; sc_k int8.
void block_q6_k(const float* x, uint8_t* b) {
  float scale[16];
  for (int k = 0; k < 16; ++k) {
    float amax = 0;
    for (int l = 0; l < 16; ++l) amax = std::max(amax, std::fabs(x[16 * k + l]));
    scale[k] = amax / 31.0f;
  }
  const float d = store_half(b + 208, *std::max_element(scale, scale + 16) / 127.0f);
  auto* sc = reinterpret_cast<int8_t*>(b + 192);
  int q[QKK];
  for (int k = 0; k < 16; ++k) {
    sc[k] = static_cast<int8_t>(d > 0 ? clamp_round(scale[k] / d, -128, 127) : 0);
    const float ds = d * sc[k];
    for (int l = 0; l < 16; ++l) q[16 * k + l] = (ds > 0 ? clamp_round(x[16 * k + l] / ds, -32, 31) : 0) + 32;
  }
  for (int half = 0; half < 2; ++half) {
    uint8_t* ql = b + 64 * half;
    uint8_t* qh = b + 128 + 32 * half;
    const int* v = q + 128 * half;
    for (int l = 0; l < 32; ++l) {
      ql[l] = static_cast<uint8_t>((v[l] & 0xF) | (v[l + 64] & 0xF) << 4);
      ql[l + 32] = static_cast<uint8_t>((v[l + 32] & 0xF) | (v[l + 96] & 0xF) << 4);
      qh[l] = static_cast<uint8_t>(v[l] >> 4 | (v[l + 32] >> 4) << 2 | (v[l + 64] >> 4) << 4 | (v[l + 96] >> 4) << 6);
    }
  }
}

}  // namespace

void quantize_kquant(DType t, const float* x, uint8_t* out, size_t n) {
  if (t != DType::Q4_K && t != DType::Q6_K) fail("quantize_kquant: {} is not Q4_K or Q6_K", dtype_name(t));
  if (n % QKK) fail("quantize_kquant: {} values are not whole blocks of {}", n, QKK);
  const size_t bb = dtype_info(t).block_bytes;
  for (size_t i = 0; i < n / QKK; ++i) (t == DType::Q4_K ? block_q4_k : block_q6_k)(x + i * QKK, out + i * bb);
}

}  // namespace kvb
