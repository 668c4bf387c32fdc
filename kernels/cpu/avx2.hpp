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

// The 8 x 8 transpose of v: col[j] holds lane j of v[0..7] (a sum over each vector's lanes in order
// becomes eight sums side by side in the lanes).
__attribute__((target("avx2,fma"))) inline void transpose8_avx2(const __m256* v, __m256* col) {
  const __m256 a0 = _mm256_unpacklo_ps(v[0], v[1]), a1 = _mm256_unpackhi_ps(v[0], v[1]),
               a2 = _mm256_unpacklo_ps(v[2], v[3]), a3 = _mm256_unpackhi_ps(v[2], v[3]),
               a4 = _mm256_unpacklo_ps(v[4], v[5]), a5 = _mm256_unpackhi_ps(v[4], v[5]),
               a6 = _mm256_unpacklo_ps(v[6], v[7]), a7 = _mm256_unpackhi_ps(v[6], v[7]);
  const __m256 b0 = _mm256_shuffle_ps(a0, a2, 0x44), b1 = _mm256_shuffle_ps(a0, a2, 0xEE),
               b2 = _mm256_shuffle_ps(a1, a3, 0x44), b3 = _mm256_shuffle_ps(a1, a3, 0xEE),
               b4 = _mm256_shuffle_ps(a4, a6, 0x44), b5 = _mm256_shuffle_ps(a4, a6, 0xEE),
               b6 = _mm256_shuffle_ps(a5, a7, 0x44), b7 = _mm256_shuffle_ps(a5, a7, 0xEE);
  // the low halves give lanes 0..3, the high halves lanes 4..7
  col[0] = _mm256_permute2f128_ps(b0, b4, 0x20);
  col[1] = _mm256_permute2f128_ps(b1, b5, 0x20);
  col[2] = _mm256_permute2f128_ps(b2, b6, 0x20);
  col[3] = _mm256_permute2f128_ps(b3, b7, 0x20);
  col[4] = _mm256_permute2f128_ps(b0, b4, 0x31);
  col[5] = _mm256_permute2f128_ps(b1, b5, 0x31);
  col[6] = _mm256_permute2f128_ps(b2, b6, 0x31);
  col[7] = _mm256_permute2f128_ps(b3, b7, 0x31);
}

}  // namespace kvb
