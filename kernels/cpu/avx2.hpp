#pragma once
// Pieces shared by the AVX2 kernels, which are compiled for AVX2 by target attribute and called only
// where kv_rows.hpp's cpu_has_avx2() holds (the binary's baseline has no AVX).
#include <immintrin.h>

namespace kvb {

__attribute__((target("avx2,fma"))) inline float hsum_avx2(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

}  // namespace kvb
