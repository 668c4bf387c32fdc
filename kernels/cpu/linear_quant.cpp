#include "kernels/cpu/linear_quant.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>

#include "kernels/cpu/dequant.hpp"
#include "kernels/cpu/avx2.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

namespace {

constexpr int QK = 32;

float rdh(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return half_to_float(h);
}

size_t block_bytes(DType t) { return dtype_info(t).block_bytes; }

// Integer sum of one weight block against 32 quantized activations, and the block's two scales:
// the product is d * isum (+ m * s for Q4_1).
int block_isum(DType t, const uint8_t* b, const int8_t* q) {
  int sum = 0;
  if (t == DType::Q8_0) {
    const auto* w = reinterpret_cast<const int8_t*>(b + 2);
    for (int j = 0; j < QK; ++j) sum += w[j] * q[j];
    return sum;
  }
  const uint8_t* qs = b + (t == DType::Q4_1 ? 4 : 2);
  const int off = t == DType::Q4_0 ? 8 : 0;
  for (int j = 0; j < QK / 2; ++j) sum += ((qs[j] & 0x0F) - off) * q[j] + ((qs[j] >> 4) - off) * q[j + QK / 2];
  return sum;
}

float dot_row_portable(DType t, const uint8_t* row, const Q8Row& x, int blocks) {
  const size_t bb = block_bytes(t);
  float acc = 0;
  for (int i = 0; i < blocks; ++i) {
    const uint8_t* b = row + i * bb;
    acc += rdh(b) * x.d[i] * static_cast<float>(block_isum(t, b, x.q.data() + size_t(i) * QK));
    if (t == DType::Q4_1) acc += rdh(b + 2) * x.s[i];
  }
  return acc;
}

__attribute__((target("avx2,fma,f16c"))) inline float rdh_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Eight int32 partial sums of 32 byte products; u unsigned (0..255), s signed.
__attribute__((target("avx2,fma"))) inline __m256i dot_us8(__m256i u, __m256i s, __m256i ones16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones16);
}

// The 32 nibbles of a Q4 block as bytes, low nibbles (elements 0..15) then high (16..31).
__attribute__((target("avx2,fma"))) inline __m256i nibbles(const uint8_t* qs, __m256i low4) {
  const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), low4);
}

// One weight row against the quantized x; the block type is a template argument so that each
// loop is straight-line code, and two accumulators keep the FMA chain short.
template <DType T>
__attribute__((target("avx2,fma,f16c"))) float dot_row_avx2(const uint8_t* row, const Q8Row& x, int blocks) {
  constexpr size_t bb = T == DType::Q8_0 ? 34 : T == DType::Q4_1 ? 20 : 18;
  const __m256i ones16 = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F), eight = _mm256_set1_epi8(8);
  __m256 acc[2] = {_mm256_setzero_ps(), _mm256_setzero_ps()};
  float extra = 0;  // Q4_1: sum of m x s
  for (int i = 0; i < blocks; ++i) {
    const uint8_t* b = row + i * bb;
    const __m256i q = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.q.data() + size_t(i) * QK));
    __m256i isum;
    if constexpr (T == DType::Q8_0) {
      const __m256i w = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 2));
      // signed x signed through the unsigned x signed instruction: |w| x (q with w's sign)
      isum = dot_us8(_mm256_sign_epi8(w, w), _mm256_sign_epi8(q, w), ones16);
    } else if constexpr (T == DType::Q4_1) {
      isum = dot_us8(nibbles(b + 4, low4), q, ones16);
      extra += rdh_f16c(b + 2) * x.s[i];
    } else {  // Q4_0: (n - 8) q = n q - 8 q
      isum = _mm256_sub_epi32(dot_us8(nibbles(b + 2, low4), q, ones16), dot_us8(eight, q, ones16));
    }
    acc[i & 1] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(rdh_f16c(b) * x.d[i]), acc[i & 1]);
  }
  return hsum_avx2(_mm256_add_ps(acc[0], acc[1])) + extra;
}

template <DType T>
void gemv_rows_avx2(const uint8_t* w, size_t row_bytes, const Q8Row& x, int blocks, int out, float* y) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < out; ++o) y[o] = dot_row_avx2<T>(w + size_t(o) * row_bytes, x, blocks);
}

}  // namespace

bool linear_quant_supports(DType t) { return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q8_0; }

void quantize_row_q8(const float* x, int n, Q8Row& out) {
  const int blocks = n / QK;
  out.d.resize(blocks);
  out.s.resize(blocks);
  out.q.resize(size_t(n));
  for (int i = 0; i < blocks; ++i) {
    const float* xb = x + size_t(i) * QK;
    float amax = 0;
    for (int j = 0; j < QK; ++j) amax = std::max(amax, std::fabs(xb[j]));
    const float d = amax / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    int sum = 0;
    for (int j = 0; j < QK; ++j) {
      const auto v = static_cast<int8_t>(std::round(xb[j] * id));
      out.q[size_t(i) * QK + j] = v;
      sum += v;
    }
    out.d[i] = half_to_float(float_to_half(d));
    out.s[i] = half_to_float(float_to_half(static_cast<float>(sum) * d));
  }
}

void gemv_quant_ref(DType t, const uint8_t* w, const Q8Row& x, int in, int out, float* y) {
  const int blocks = in / QK;
  const size_t bb = block_bytes(t);
  for (int o = 0; o < out; ++o) {
    double acc = 0;
    for (int i = 0; i < blocks; ++i) {
      const uint8_t* b = w + (size_t(o) * blocks + i) * bb;
      acc += double(rdh(b)) * x.d[i] * block_isum(t, b, x.q.data() + size_t(i) * QK);
      if (t == DType::Q4_1) acc += double(rdh(b + 2)) * x.s[i];
    }
    y[o] = static_cast<float>(acc);
  }
}

void linear_quant(DType t, const uint8_t* w, const float* bias, const float* x, int n, int in, int out, float* y) {
  const int blocks = in / QK;
  const size_t row_bytes = blocks * block_bytes(t);
  if (n == 1) {
    Q8Row xq;
    quantize_row_q8(x, in, xq);
    if (!cpu_has_avx2()) {
#pragma omp parallel for schedule(static)
      for (int o = 0; o < out; ++o) y[o] = dot_row_portable(t, w + size_t(o) * row_bytes, xq, blocks);
    } else if (t == DType::Q4_1) {
      gemv_rows_avx2<DType::Q4_1>(w, row_bytes, xq, blocks, out, y);
    } else if (t == DType::Q8_0) {
      gemv_rows_avx2<DType::Q8_0>(w, row_bytes, xq, blocks, out, y);
    } else {
      gemv_rows_avx2<DType::Q4_0>(w, row_bytes, xq, blocks, out, y);
    }
    if (bias) add_bias(y, bias, 1, out);
  } else {
    linear_widened(x, bias, n, in, out, y, [&](int o0, int rows, float* dst) {
      dequantize(t, w + size_t(o0) * row_bytes, dst, size_t(rows) * in);
    });
  }
}

}  // namespace kvb
