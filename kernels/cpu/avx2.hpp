#pragma once
// Pieces shared by the AVX2 kernels, which are compiled for AVX2 by target attribute and called only
// where kv_rows.hpp's cpu_has_avx2() holds (the binary's baseline has no AVX).
#include <immintrin.h>

namespace kvb {

__attribute__((target("avx2,fma"))) inline float hsum_sse(__m128 s) {
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

__attribute__((target("avx2,fma"))) inline float hsum_avx2(__m256 v) {
  return hsum_sse(_mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1)));
}

// exp_poly (vec_math.hpp) on eight lanes: the same clamps, range reduction and polynomial, 0 below -87;
// a NaN stays NaN.
__attribute__((target("avx2,fma"))) inline __m256 exp_avx2(__m256 x) {
  const __m256 lowest = _mm256_set1_ps(-87.0f), magic = _mm256_set1_ps(12582912.0f);
  // max/min return their second operand when either is NaN.
  const __m256 v = _mm256_min_ps(_mm256_set1_ps(88.0f), _mm256_max_ps(lowest, x));
  const __m256 fn = _mm256_sub_ps(_mm256_fmadd_ps(v, _mm256_set1_ps(1.44269504088896341f), magic), magic);
  __m256 r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(0.693359375f), v);
  r = _mm256_fnmadd_ps(fn, _mm256_set1_ps(-2.12194440e-4f), r);
  __m256 p = _mm256_set1_ps(1.9875691500e-4f);
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.3981999507e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(8.3334519073e-3f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(4.1665795894e-2f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(1.6666665459e-1f));
  p = _mm256_fmadd_ps(p, r, _mm256_set1_ps(5.0000001201e-1f));
  p = _mm256_add_ps(_mm256_fmadd_ps(_mm256_mul_ps(p, r), r, r), _mm256_set1_ps(1.0f));
  const __m256i e = _mm256_slli_epi32(_mm256_add_epi32(_mm256_cvtps_epi32(fn), _mm256_set1_epi32(127)), 23);
  const __m256 below = _mm256_cmp_ps(x, lowest, _CMP_LT_OQ);
  return _mm256_andnot_ps(below, _mm256_mul_ps(p, _mm256_castsi256_ps(e)));
}

}  // namespace kvb
