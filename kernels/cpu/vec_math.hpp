#pragma once
// Scalar building blocks written so that the compiler vectorises the loops that call them, and the
// run-time choice of instruction set for those loops.
#include <algorithm>
#include <bit>
#include <cstdint>
#include <limits>

namespace kvb {

// exp(v) for v <= 88: Cody-Waite range reduction and a degree-6 minimax polynomial (Cephes), within
// 2 ulp of std::exp on [-87, 88]; 0 below -87, where the true value is under FLT_MIN and attention
// weights that small are zero. Loops over it vectorise (with -fno-trapping-math, which lets the
// compiler compute both sides of the selects).
inline float exp_poly(float x) {
  constexpr float log2e = 1.44269504088896341f;
  constexpr float ln2_hi = 0.693359375f, ln2_lo = -2.12194440e-4f;
  constexpr float round_magic = 12582912.0f;  // 1.5 * 2^23: adding it rounds to an integer
  const float v = std::min(std::max(x, -87.0f), 88.0f);
  const float fn = (v * log2e + round_magic) - round_magic;
  const float r = (v - fn * ln2_hi) - fn * ln2_lo;
  float p = 1.9875691500e-4f;
  p = p * r + 1.3981999507e-3f;
  p = p * r + 8.3334519073e-3f;
  p = p * r + 4.1665795894e-2f;
  p = p * r + 1.6666665459e-1f;
  p = p * r + 5.0000001201e-1f;
  p = p * r * r + r + 1.0f;
  const float scale = std::bit_cast<float>((static_cast<int32_t>(fn) + 127) << 23);
  return x < -87.0f ? 0.0f : p * scale;
}

// The largest of x[0, n), -inf for none. Written as a select, which the compiler vectorises as a max
// reduction; std::max (NaN-ordered) keeps the loop scalar, ten times slower on softmax rows.
inline float max_of(const float* x, int n) {
  float m = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : m)
  for (int i = 0; i < n; ++i) m = x[i] > m ? x[i] : m;
  return m;
}

}  // namespace kvb

// One binary runs on every x86-64 machine (it is built for the baseline level), so the loops that
// carry the time are compiled once per vector width and the loader picks the widest the processor
// has (GCC/clang function multi-versioning). Elsewhere, one version.
#if defined(__x86_64__) && !defined(__AVX512F__)
#define KVB_VECTOR_CLONES __attribute__((target_clones("avx512f", "avx2", "default")))
#else
#define KVB_VECTOR_CLONES
#endif
