#include "kernels/cpu/linear_bf16.hpp"

#include <immintrin.h>

#include <algorithm>
#include <vector>

#include "kernels/cpu/avx2.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

void linear_bf16_ref(const float* x, const uint16_t* w, const float* bias, int n, int in, int out, float* y) {
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o) {
      double acc = bias ? bias[o] : 0.0;
      for (int k = 0; k < in; ++k)
        acc += static_cast<double>(x[size_t(i) * in + k]) * bf16_to_float(w[size_t(o) * in + k]);
      y[size_t(i) * out + o] = static_cast<float>(acc);
    }
}

namespace {

float dot_tail(const float* x, const uint16_t* w, int k0, int in) {
  float s = 0;
  for (int k = k0; k < in; ++k) s += x[k] * bf16_to_float(w[k]);
  return s;
}

// 16 bf16 weights in a 256-bit load are 8 pairs: shifting each 32-bit lane left by 16 gives the
// even-indexed weights as floats, masking off the low half gives the odd ones, with no shuffles.
// x is split to match once per call: per 16 inputs, the 8 even ones, then the 8 odd ones. Rows go
// one at a time (one sequential stream per thread, prefetched 1 KB ahead) into four accumulators,
// against each of the n tokens while the row is in cache.
__attribute__((target("avx2,fma"))) void gemv_bf16_avx2(const float* x, const uint16_t* w, int n, int in, int out,
                                                        float* y) {
  const int k32 = in / 32 * 32;
  std::vector<float> xs(size_t(n) * size_t(k32));
  for (int b = 0; b < n; ++b)
    for (int k = 0; k < k32; k += 16)
      for (int j = 0; j < 8; ++j) {
        xs[size_t(b) * k32 + k + j] = x[size_t(b) * in + k + 2 * j];
        xs[size_t(b) * k32 + k + 8 + j] = x[size_t(b) * in + k + 2 * j + 1];
      }
  const __m256i odd_mask = _mm256_set1_epi32(static_cast<int>(0xFFFF0000u));
  constexpr int kPrefetch = 512;  // weights ahead
#pragma omp parallel for schedule(static)
  for (int o = 0; o < out; ++o) {
    const uint16_t* row = w + size_t(o) * in;
    for (int b = 0; b < n; ++b) {
      const float* xp = xs.data() + size_t(b) * k32;
      __m256 a0 = _mm256_setzero_ps(), a1 = a0, a2 = a0, a3 = a0;
      for (int k = 0; k < k32; k += 32) {
        _mm_prefetch(reinterpret_cast<const char*>(row + k + kPrefetch), _MM_HINT_T0);
        const __m256i v0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k));
        const __m256i v1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(row + k + 16));
        a0 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k), _mm256_castsi256_ps(_mm256_slli_epi32(v0, 16)), a0);
        a1 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 8), _mm256_castsi256_ps(_mm256_and_si256(v0, odd_mask)), a1);
        a2 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 16), _mm256_castsi256_ps(_mm256_slli_epi32(v1, 16)), a2);
        a3 = _mm256_fmadd_ps(_mm256_loadu_ps(xp + k + 24), _mm256_castsi256_ps(_mm256_and_si256(v1, odd_mask)), a3);
      }
      y[size_t(b) * out + o] = hsum_avx2(_mm256_add_ps(_mm256_add_ps(a0, a1), _mm256_add_ps(a2, a3))) +
                               dot_tail(x + size_t(b) * in, row, k32, in);
    }
  }
}

void gemv_bf16_portable(const float* x, const uint16_t* w, int n, int in, int out, float* y) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < out; ++o)
    for (int b = 0; b < n; ++b) y[size_t(b) * out + o] = dot_tail(x + size_t(b) * in, w + size_t(o) * in, 0, in);
}

}  // namespace

void linear_bf16_tokens(const float* x, const uint16_t* w, const float* bias, int n, int in, int out, float* y) {
  // AVX2 already streams the weights at the memory's pace; wider vectors would not read faster.
  if (cpu_has_avx2())
    gemv_bf16_avx2(x, w, n, in, out, y);
  else
    gemv_bf16_portable(x, w, n, in, out, y);
  if (bias) add_bias(y, bias, n, out);
}

void linear_bf16(const float* x, const uint16_t* w, const float* bias, int n, int in, int out, float* y) {
  if (n == 1) return linear_bf16_tokens(x, w, bias, 1, in, out, y);
  linear_widened(x, bias, n, in, out, y, [&](int o0, int rows, float* dst) {
    const uint16_t* src = w + size_t(o0) * in;
#pragma omp parallel for schedule(static)
    for (int r = 0; r < rows; ++r)
      for (int k = 0; k < in; ++k) dst[size_t(r) * in + k] = bf16_to_float(src[size_t(r) * in + k]);
  });
}

}  // namespace kvb
