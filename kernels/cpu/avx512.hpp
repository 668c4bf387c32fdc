#pragma once
// Pieces shared by the AVX-512 kernels, which are compiled for AVX-512 by target attribute and called
// only where kv_rows.hpp's cpu_has_avx512() holds (the binary's baseline has no AVX).
#include <immintrin.h>

#include <cstddef>
#include <cstdint>

namespace kvb {

// The fp16 numbers h[t * groups + gi] of n <= 16 consecutive tokens as floats (lanes n-15 zero): one
// load and a permutation for one or two groups a token, one by one otherwise.
__attribute__((target("avx512f,avx2,fma,f16c"))) inline __m512 group_halves16(const uint16_t* h, int groups, int gi,
                                                                              int n) {
  if (n == 16 && groups == 1) return _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(h)));
  if (n == 16 && groups == 2) {
    const __m512i both = _mm512_loadu_si512(h);  // tokens t0..t0+15, two groups each
    const __m512 lo = _mm512_cvtph_ps(_mm512_castsi512_si256(both));
    const __m512 hi = _mm512_cvtph_ps(_mm512_extracti64x4_epi64(both, 1));
    const __m512i pick = _mm512_add_epi32(_mm512_setr_epi32(0, 2, 4, 6, 8, 10, 12, 14, 16, 18, 20, 22, 24, 26, 28, 30),
                                          _mm512_set1_epi32(gi));
    return _mm512_permutex2var_ps(lo, pick, hi);
  }
  alignas(32) uint16_t x[16] = {};
  for (int t = 0; t < n; ++t) x[t] = h[size_t(t) * groups + gi];
  return _mm512_cvtph_ps(_mm256_load_si256(reinterpret_cast<const __m256i*>(x)));
}

}  // namespace kvb
