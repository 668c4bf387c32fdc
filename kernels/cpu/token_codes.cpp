#include "kernels/cpu/token_codes.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cstring>

#include "kernels/cpu/avx512.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/query_runs.hpp"

namespace kvb {

namespace {

int levels_of(int bits) { return (1 << (bits - 1)) - 1; }

#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// The fp16 steps of group gi of the n <= 16 tokens from t, as floats (lanes past n zero).
__m512 steps16_avx512(const TokenCodesView& c, size_t t, int gi, int n) {
  const int groups = c.d / c.group;
  return n == 0 ? _mm512_setzero_ps() : group_halves16(c.steps + t * size_t(groups), groups, gi, n);
}

// The values of the codes (code - levels) by their low four bits (a permutation's index): 2- and 4-bit codes
// shifted into a lane's low bits need no mask.
template <int B>
__m512 code_table_avx512() {
  alignas(64) float v[16];
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>((i & ((1 << B) - 1)) - levels_of(B));
  return _mm512_load_ps(v);
}

// Codes shifted so that each lane's code is in its low bits, as floats.
template <int B>
__m512 code_values_avx512(__m512i shifted, __m512 table) {
  if constexpr (B == 8)
    return _mm512_cvtepi32_ps(
        _mm512_sub_epi32(_mm512_and_si512(shifted, _mm512_set1_epi32(255)), _mm512_set1_epi32(levels_of(B))));
  else
    return _mm512_permutexvar_ps(shifted, table);
}

// NB blocks of 16 tokens in lanes side by side: each lane does the reference's operations for its token
// in its order (a product, then a sum; no FMA). A word of codes is gathered from the 16 rows once for the
// 32 / b channels it holds. Groups a whole number of words.
template <int G, int B, int NB>
void dot_blocks_avx512(const TokenCodesView& c, const float* q, size_t t, size_t t1, float* out, size_t ldo) {
  const size_t rb = c.row_bytes();
  const int groups = c.d / c.group;
  const __m512i rows = _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15),
                                          _mm512_set1_epi32(static_cast<int>(rb)));
  const __m512 table = code_table_avx512<B>();
  __mmask16 live[NB];
  int n[NB];
  for (int u = 0; u < NB; ++u) {
    const size_t from = t + 16 * size_t(u);
    n[u] = from < t1 ? int(std::min<size_t>(16, t1 - from)) : 0;
    live[u] = static_cast<__mmask16>((1u << n[u]) - 1);
  }
  // The next pass's rows (1-4 KiB) are fetched ahead: gathers alone left the rows to the memory's latency.
  const size_t next = std::min(t + 16 * NB, c.tokens) * rb, stop = std::min(t + 32 * NB, c.tokens) * rb;
  for (size_t o = next; o < stop; o += 64) _mm_prefetch(reinterpret_cast<const char*>(c.codes + o), _MM_HINT_T0);
  constexpr int per = 32 / B;  // codes a word
  __m512 sum[G][NB];
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) sum[j][u] = _mm512_setzero_ps();
  for (int gi = 0; gi < groups; ++gi) {
    __m512 dot[G][NB];
    for (int j = 0; j < G; ++j)
      for (int u = 0; u < NB; ++u) dot[j][u] = _mm512_setzero_ps();
    for (int w = gi * c.group / per; w < (gi + 1) * c.group / per; ++w) {
      __m512i word[NB];
      for (int u = 0; u < NB; ++u)
        word[u] = n[u] == 0 ? _mm512_setzero_si512()
                            : _mm512_mask_i32gather_epi32(_mm512_setzero_si512(), live[u], rows,
                                                          c.codes + (t + 16 * size_t(u)) * rb + size_t(w) * 4, 1);
#pragma GCC unroll 1
      for (int m = 0; m < per; ++m) {
        const int i = w * per + m;
        __m512 code[NB];
        for (int u = 0; u < NB; ++u)
          code[u] = code_values_avx512<B>(_mm512_srli_epi32(word[u], unsigned(m * B)), table);
        for (int j = 0; j < G; ++j) {
          const __m512 qi = _mm512_set1_ps(q[size_t(j) * c.d + size_t(i)]);
          for (int u = 0; u < NB; ++u) dot[j][u] = _mm512_add_ps(dot[j][u], _mm512_mul_ps(qi, code[u]));
        }
      }
    }
    for (int u = 0; u < NB; ++u) {
      const __m512 step = steps16_avx512(c, t + 16 * size_t(u), gi, n[u]);
      for (int j = 0; j < G; ++j) sum[j][u] = _mm512_add_ps(sum[j][u], _mm512_mul_ps(step, dot[j][u]));
    }
  }
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) _mm512_mask_storeu_ps(out + size_t(j) * ldo + 16 * size_t(u), live[u], sum[j][u]);
}

template <int G, int B>
void dot_avx512(const TokenCodesView& c, const float* q, size_t t0, size_t t1, float* scores, size_t ldo) {
  // 2 G NB accumulators (dots and sums) and 2 NB words and codes within the 32 registers
  constexpr int NB = G <= 2 ? 4 : G == 3 ? 3 : 2;
  for (size_t t = t0; t < t1; t += 16 * NB) dot_blocks_avx512<G, B, NB>(c, q, t, t1, scores + (t - t0), ldo);
}

// 16 codes of one row from channel i (a multiple of 16) as floats.
template <int B>
__m512 codes16_avx512(const uint8_t* row, int i, __m512 table) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  if constexpr (B == 8) {
    return code_values_avx512<B>(_mm512_cvtepu8_epi32(_mm_loadu_si128(reinterpret_cast<const __m128i*>(row + i))),
                                 table);
  } else if constexpr (B == 4) {  // lanes 0-7 from the first word, 8-15 from the second
    const __m512i words = _mm512_permutexvar_epi32(
        _mm512_srli_epi32(lane, 3),
        _mm512_zextsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i / 2))));
    return code_values_avx512<B>(
        _mm512_srlv_epi32(words, _mm512_slli_epi32(_mm512_and_si512(lane, _mm512_set1_epi32(7)), 2)), table);
  } else {
    int32_t w;
    std::memcpy(&w, row + i / 4, 4);
    return code_values_avx512<B>(_mm512_srlv_epi32(_mm512_set1_epi32(w), _mm512_slli_epi32(lane, 1)), table);
  }
}

// NB blocks of 16 channels from c in registers across all tokens for G weight vectors; each channel's lane
// does the reference's operations in its order. Per 16 tokens, the weights times their steps are formed
// on 16 lanes (the reference's products), then read back one by one.
template <int G, int B, int NB>
void axpy_blocks_avx512(const TokenCodesView& v, const float* p, size_t ldp, int c, float* acc) {
  const size_t rb = v.row_bytes();
  const __m512 table = code_table_avx512<B>();
  __m512 a[G][NB];
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) a[j][u] = _mm512_loadu_ps(acc + size_t(j) * v.d + size_t(c + 16 * u));
  alignas(64) float w[G][NB][16];
  for (size_t t = 0; t < v.tokens; t += 16) {
    const int n = int(std::min<size_t>(16, v.tokens - t));
    const __mmask16 live = static_cast<__mmask16>((1u << n) - 1);
    for (int u = 0; u < NB; ++u) {
      // A run of 16 channels lies in one group; runs in the same group share its weights.
      const int gi = (c + 16 * u) / v.group;
      if (u > 0 && gi == (c + 16 * (u - 1)) / v.group) {
        for (int j = 0; j < G; ++j) std::memcpy(w[j][u], w[j][u - 1], sizeof(w[j][u]));
        continue;
      }
      const __m512 step = steps16_avx512(v, t, gi, n);
      for (int j = 0; j < G; ++j)
        _mm512_store_ps(w[j][u], _mm512_mul_ps(_mm512_maskz_loadu_ps(live, p + size_t(j) * ldp + t), step));
    }
    for (int l = 0; l < n; ++l) {
      const uint8_t* row = v.codes + (t + size_t(l)) * rb;
      for (int u = 0; u < NB; ++u) {
        const __m512 code = codes16_avx512<B>(row, c + 16 * u, table);
        for (int j = 0; j < G; ++j) a[j][u] = _mm512_add_ps(a[j][u], _mm512_mul_ps(_mm512_set1_ps(w[j][u][l]), code));
      }
    }
  }
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) _mm512_storeu_ps(acc + size_t(j) * v.d + size_t(c + 16 * u), a[j][u]);
}

template <int G, int B>
void axpy_avx512(const TokenCodesView& v, const float* p, size_t ldp, int c0, int c1, float* acc) {
  int c = c0;
  for (; c + 64 <= c1; c += 64) axpy_blocks_avx512<G, B, 4>(v, p, ldp, c, acc);
  for (; c + 32 <= c1; c += 32) axpy_blocks_avx512<G, B, 2>(v, p, ldp, c, acc);
  for (; c < c1; c += 16) axpy_blocks_avx512<G, B, 1>(v, p, ldp, c, acc);
}

#pragma GCC diagnostic pop
#pragma GCC pop_options

// The AVX2 forms: the same lane by lane on 8 lanes, codes converted as (code & mask) - levels.
#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")

__m256 steps8_avx2(const TokenCodesView& c, size_t t, int gi, int n) {
  const int groups = c.d / c.group;
  if (groups == 1 && n == 8) return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c.steps + t)));
  alignas(16) uint16_t h[8] = {};
  for (int l = 0; l < n; ++l) h[l] = c.steps[(t + size_t(l)) * size_t(groups) + size_t(gi)];
  return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(h)));
}

template <int B>
__m256 code_values_avx2(__m256i shifted) {
  return _mm256_cvtepi32_ps(
      _mm256_sub_epi32(_mm256_and_si256(shifted, _mm256_set1_epi32((1 << B) - 1)), _mm256_set1_epi32(levels_of(B))));
}

__m256i live_lanes8_avx2(int n) {
  return _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
}

template <int G, int B, int NB>
void dot_blocks_avx2(const TokenCodesView& c, const float* q, size_t t, size_t t1, float* out, size_t ldo) {
  constexpr int per = 32 / B;
  const size_t rb = c.row_bytes();
  const int groups = c.d / c.group;
  const __m256i rows =
      _mm256_mullo_epi32(_mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7), _mm256_set1_epi32(static_cast<int>(rb)));
  __m256i live[NB];
  int n[NB];
  for (int u = 0; u < NB; ++u) {
    const size_t from = t + 8 * size_t(u);
    n[u] = from < t1 ? int(std::min<size_t>(8, t1 - from)) : 0;
    live[u] = live_lanes8_avx2(n[u]);
  }
  __m256 sum[G][NB];
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) sum[j][u] = _mm256_setzero_ps();
  for (int gi = 0; gi < groups; ++gi) {
    __m256 dot[G][NB];
    for (int j = 0; j < G; ++j)
      for (int u = 0; u < NB; ++u) dot[j][u] = _mm256_setzero_ps();
    for (int w = gi * c.group / per; w < (gi + 1) * c.group / per; ++w) {
      __m256i word[NB];
      for (int u = 0; u < NB; ++u)
        word[u] = n[u] == 0 ? _mm256_setzero_si256()
                            : _mm256_mask_i32gather_epi32(
                                  _mm256_setzero_si256(),
                                  reinterpret_cast<const int*>(c.codes + (t + 8 * size_t(u)) * rb + size_t(w) * 4),
                                  rows, live[u], 1);
#pragma GCC unroll 1
      for (int m = 0; m < per; ++m) {
        const int i = w * per + m;
        __m256 code[NB];
        for (int u = 0; u < NB; ++u) code[u] = code_values_avx2<B>(_mm256_srli_epi32(word[u], m * B));
        for (int j = 0; j < G; ++j) {
          const __m256 qi = _mm256_set1_ps(q[size_t(j) * c.d + size_t(i)]);
          for (int u = 0; u < NB; ++u) dot[j][u] = _mm256_add_ps(dot[j][u], _mm256_mul_ps(qi, code[u]));
        }
      }
    }
    for (int u = 0; u < NB; ++u) {
      const __m256 step = steps8_avx2(c, t + 8 * size_t(u), gi, n[u]);
      for (int j = 0; j < G; ++j) sum[j][u] = _mm256_add_ps(sum[j][u], _mm256_mul_ps(step, dot[j][u]));
    }
  }
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) _mm256_maskstore_ps(out + size_t(j) * ldo + 8 * size_t(u), live[u], sum[j][u]);
}

template <int G, int B>
void dot_avx2(const TokenCodesView& c, const float* q, size_t t0, size_t t1, float* scores, size_t ldo) {
  for (size_t t = t0; t < t1; t += 16) dot_blocks_avx2<G, B, 2>(c, q, t, t1, scores + (t - t0), ldo);
}

// 8 codes of one row from channel i (a multiple of 8) as floats.
template <int B>
__m256 codes8_avx2(const uint8_t* row, int i) {
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  if constexpr (B == 8)
    return code_values_avx2<B>(_mm256_cvtepu8_epi32(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(row + i))));
  int32_t w = 0;
  std::memcpy(&w, row + i * B / 8, B);  // 8 codes: B bytes
  return code_values_avx2<B>(_mm256_srlv_epi32(_mm256_set1_epi32(w), _mm256_mullo_epi32(lane, _mm256_set1_epi32(B))));
}

template <int G, int B, int NB>
void axpy_blocks_avx2(const TokenCodesView& v, const float* p, size_t ldp, int c, float* acc) {
  const size_t rb = v.row_bytes();
  __m256 a[G][NB];
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) a[j][u] = _mm256_loadu_ps(acc + size_t(j) * v.d + size_t(c + 8 * u));
  alignas(32) float w[G][NB][8];
  for (size_t t = 0; t < v.tokens; t += 8) {
    const int n = int(std::min<size_t>(8, v.tokens - t));
    const __m256i live = live_lanes8_avx2(n);
    for (int u = 0; u < NB; ++u) {
      const __m256 step = steps8_avx2(v, t, (c + 8 * u) / v.group, n);
      for (int j = 0; j < G; ++j)
        _mm256_store_ps(w[j][u], _mm256_mul_ps(_mm256_maskload_ps(p + size_t(j) * ldp + t, live), step));
    }
    for (int l = 0; l < n; ++l) {
      const uint8_t* row = v.codes + (t + size_t(l)) * rb;
      for (int u = 0; u < NB; ++u) {
        const __m256 code = codes8_avx2<B>(row, c + 8 * u);
        for (int j = 0; j < G; ++j) a[j][u] = _mm256_add_ps(a[j][u], _mm256_mul_ps(_mm256_set1_ps(w[j][u][l]), code));
      }
    }
  }
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) _mm256_storeu_ps(acc + size_t(j) * v.d + size_t(c + 8 * u), a[j][u]);
}

template <int G, int B>
void axpy_avx2(const TokenCodesView& v, const float* p, size_t ldp, int c0, int c1, float* acc) {
  int c = c0;
  for (; c + 24 <= c1; c += 24) axpy_blocks_avx2<G, B, 3>(v, p, ldp, c, acc);
  for (; c < c1; c += 8) axpy_blocks_avx2<G, B, 1>(v, p, ldp, c, acc);
}

#pragma GCC pop_options

// The kernel for G queries at the view's bit width, on this processor's widest vectors.
template <int G>
void dot_kernel(const TokenCodesView& k, const float* q, size_t t0, size_t t1, float* s, size_t ldo) {
  const bool wide = cpu_has_avx512();
  switch (k.bits) {
    case 2:
      return (wide ? dot_avx512<G, 2> : dot_avx2<G, 2>)(k, q, t0, t1, s, ldo);
    case 4:
      return (wide ? dot_avx512<G, 4> : dot_avx2<G, 4>)(k, q, t0, t1, s, ldo);
    default:
      return (wide ? dot_avx512<G, 8> : dot_avx2<G, 8>)(k, q, t0, t1, s, ldo);
  }
}

template <int G>
void axpy_kernel(const TokenCodesView& v, const float* p, size_t ldp, int c0, int c1, float* acc) {
  const bool wide = cpu_has_avx512();
  switch (v.bits) {
    case 2:
      return (wide ? axpy_avx512<G, 2> : axpy_avx2<G, 2>)(v, p, ldp, c0, c1, acc);
    case 4:
      return (wide ? axpy_avx512<G, 4> : axpy_avx2<G, 4>)(v, p, ldp, c0, c1, acc);
    default:
      return (wide ? axpy_avx512<G, 8> : axpy_avx2<G, 8>)(v, p, ldp, c0, c1, acc);
  }
}

}  // namespace

int token_code(const TokenCodesView& c, size_t t, int i) {
  const int per_byte = 8 / c.bits;
  const int raw = c.codes[t * c.row_bytes() + size_t(i / per_byte)] >> (c.bits * (i % per_byte));
  return (raw & ((1 << c.bits) - 1)) - levels_of(c.bits);
}

void token_codes_dot_ref(const TokenCodesView& k, const float* q, int g, size_t t0, size_t t1, float* scores,
                         size_t ldo) {
  const int groups = k.d / k.group;
  for (int j = 0; j < g; ++j) {
    const float* qj = q + size_t(j) * k.d;
    for (size_t t = t0; t < t1; ++t) {
      float sum = 0;
      for (int gi = 0; gi < groups; ++gi) {
        float dot = 0;
        for (int i = gi * k.group; i < (gi + 1) * k.group; ++i) dot += qj[i] * float(token_code(k, t, i));
        sum += half_to_float(k.steps[t * size_t(groups) + size_t(gi)]) * dot;
      }
      scores[size_t(j) * ldo + (t - t0)] = sum;
    }
  }
}

void token_codes_axpy_ref(const TokenCodesView& v, const float* p, int g, size_t ldp, int c0, int c1, float* acc) {
  const int groups = v.d / v.group;
  for (int j = 0; j < g; ++j) {
    float* aj = acc + size_t(j) * v.d;
    for (size_t t = 0; t < v.tokens; ++t)
      for (int gi = 0; gi < groups; ++gi) {
        const float w = p[size_t(j) * ldp + t] * half_to_float(v.steps[t * size_t(groups) + size_t(gi)]);
        for (int i = std::max(gi * v.group, c0); i < std::min((gi + 1) * v.group, c1); ++i)
          aj[i] += w * float(token_code(v, t, i));
      }
  }
}

// The vector forms need channel groups of whole 32-bit words (keys, gathered a word at a time) and channel
// groups and runs of whole vectors (values: 16 channels under AVX-512, 8 under AVX2); other shapes and
// processors without AVX2 take the reference.
void token_codes_dot(const TokenCodesView& k, const float* q, int g, size_t t0, size_t t1, float* scores, size_t ldo) {
  if (cpu_has_avx2() && k.group * k.bits % 32 == 0)
    return for_query_runs<4>(g, [&](auto G, int j) {
      dot_kernel<decltype(G)::value>(k, q + size_t(j) * k.d, t0, t1, scores + size_t(j) * ldo, ldo);
    });
  token_codes_dot_ref(k, q, g, t0, t1, scores, ldo);
}

void token_codes_axpy(const TokenCodesView& v, const float* p, int g, size_t ldp, int c0, int c1, float* acc) {
  const int lanes = cpu_has_avx512() ? 16 : 8;
  if (cpu_has_avx2() && v.group % lanes == 0 && c0 % lanes == 0 && c1 % lanes == 0)
    return for_query_runs<4>(g, [&](auto G, int j) {
      axpy_kernel<decltype(G)::value>(v, p + size_t(j) * ldp, ldp, c0, c1, acc + size_t(j) * v.d);
    });
  token_codes_axpy_ref(v, p, g, ldp, c0, c1, acc);
}

}  // namespace kvb
