#include "kernels/cpu/kv_quant.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "harness/util/error.hpp"
#include "kernels/cpu/avx512.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/query_runs.hpp"

namespace kvb {

int codes_per_word(int bits) {
  switch (bits) {
    case 1:
      return 32;
    case 2:
      return 16;
    case 3:
      return 11;
    case 4:
      return 8;
    default:
      fail("KV quantization supports 1, 2, 3 or 4 bits, not {}", bits);
  }
}

uint32_t max_code(int bits, int slot) {
  if (bits == 3 && slot % 11 == 10) return 3;
  return (1u << bits) - 1;
}

namespace {
inline int bit_offset(int bits, int slot) { return slot * bits; }  // 3-bit slot 10 starts at bit 30
}  // namespace

void quantize_group(const float* x, int n, int stride, int bits, uint32_t* codes, uint16_t& scale, uint16_t& minimum) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[size_t(i) * stride]);
    mx = std::max(mx, x[size_t(i) * stride]);
  }
  const float qmax = static_cast<float>((1u << bits) - 1);
  const float s = (mx - mn) / qmax;
  scale = float_to_half(s);
  minimum = float_to_half(mn);
  for (int i = 0; i < n; ++i) {
    if (s == 0.0f) {
      codes[i] = 0;
      continue;
    }
    const float q = std::nearbyint((x[size_t(i) * stride] - mn) / s);
    codes[i] = static_cast<uint32_t>(std::clamp(q, 0.0f, static_cast<float>(max_code(bits, i))));
  }
}

void pack_codes(const uint32_t* codes, int n, int bits, uint32_t* words) {
  const int per = codes_per_word(bits);
  for (int w = 0; w < (n + per - 1) / per; ++w) words[w] = 0;
  for (int i = 0; i < n; ++i) words[i / per] |= codes[i] << bit_offset(bits, i % per);
}

void unpack_codes(const uint32_t* words, int n, int bits, uint32_t* codes) {
  const int per = codes_per_word(bits);
  for (int i = 0; i < n; ++i) {
    const int slot = i % per;
    codes[i] = (words[i / per] >> bit_offset(bits, slot)) & max_code(bits, slot);
  }
}

}  // namespace kvb

// ---------------------------------------------------------------------------------------------------
// Fused products over quantized keys and values

namespace kvb {

void quant_keys_dot_ref(const QuantKeysView& k, const float* q, float* scores) {
  const int wpg = k.bits == 3 ? k.group / 11 : k.group / codes_per_word(k.bits);
  std::vector<uint32_t> codes(size_t(k.group));
  std::vector<double> s(size_t(k.group));
  for (size_t g = 0; g < k.tokens / size_t(k.group); ++g) {
    std::fill(s.begin(), s.end(), 0.0);
    for (int c = 0; c < k.d; ++c) {
      const size_t i = g * k.d + c;
      unpack_codes(k.words + i * wpg, k.group, k.bits, codes.data());
      const float sc = half_to_float(k.scale[i]), mn = half_to_float(k.min[i]);
      for (int t = 0; t < k.group; ++t) s[size_t(t)] += double(q[c]) * (static_cast<float>(codes[size_t(t)]) * sc + mn);
    }
    for (int t = 0; t < k.group; ++t) scores[g * k.group + t] = static_cast<float>(s[size_t(t)]);
  }
}

void quant_values_axpy_ref(const QuantValuesView& v, const float* p, float* acc) {
  const int groups = v.d / v.group, per = codes_per_word(v.bits);
  std::vector<uint32_t> codes(size_t(v.d));
  std::vector<double> sum(acc, acc + v.d);
  for (size_t t = 0; t < v.tokens; ++t) {
    unpack_codes(v.words + t * size_t(v.d / per), v.d, v.bits, codes.data());
    for (int c = 0; c < v.d; ++c) {
      const size_t gi = t * groups + size_t(c / v.group);
      sum[size_t(c)] +=
          double(p[t]) * (static_cast<float>(codes[size_t(c)]) * half_to_float(v.scale[gi]) + half_to_float(v.min[gi]));
    }
  }
  for (int c = 0; c < v.d; ++c) acc[c] = static_cast<float>(sum[size_t(c)]);
}

namespace {

void keys_dot_portable(const QuantKeysView& k, const float* q, float* scores) {
  const int wpg = k.bits == 3 ? k.group / 11 : k.group / codes_per_word(k.bits);
  std::vector<uint32_t> codes(size_t(k.group));
  for (size_t g = 0; g < k.tokens / size_t(k.group); ++g) {
    float* sg = scores + g * k.group;
    float bias = 0;
    std::fill(sg, sg + k.group, 0.0f);
    for (int c = 0; c < k.d; ++c) {
      const size_t i = g * k.d + c;
      unpack_codes(k.words + i * wpg, k.group, k.bits, codes.data());
      const float qs = q[c] * half_to_float(k.scale[i]);
      bias += q[c] * half_to_float(k.min[i]);
      for (int t = 0; t < k.group; ++t) sg[t] += qs * static_cast<float>(codes[size_t(t)]);
    }
    for (int t = 0; t < k.group; ++t) sg[t] += bias;
  }
}

void values_axpy_portable(const QuantValuesView& v, const float* p, float* acc, int c0, int c1) {
  const int groups = v.d / v.group, per = codes_per_word(v.bits);
  std::vector<uint32_t> codes(size_t(v.group));
  for (size_t t = 0; t < v.tokens; ++t) {
    if (p[t] == 0.0f) continue;
    for (int gi = c0 / v.group; gi < c1 / v.group; ++gi) {
      unpack_codes(v.words + t * size_t(v.d / per) + size_t(gi) * v.group / per, v.group, v.bits, codes.data());
      const float ps = p[t] * half_to_float(v.scale[t * groups + gi]);
      const float pm = p[t] * half_to_float(v.min[t * groups + gi]);
      float* a = acc + size_t(gi) * v.group;
      for (int c = 0; c < v.group; ++c) a[c] += ps * static_cast<float>(codes[size_t(c)]) + pm;
    }
  }
}

// Eight codes of one word, starting at slot `first`, as floats (lane j holds slot first + j).
__attribute__((target("avx2,fma,f16c"))) inline __m256 codes8(uint32_t word, __m256i shifts, __m256i mask) {
  return _mm256_cvtepi32_ps(
      _mm256_and_si256(_mm256_srlv_epi32(_mm256_set1_epi32(static_cast<int>(word)), shifts), mask));
}

// The G queries folded into one token group's channel scales, qs [query][channel], and the minimums'
// share of each query's scores, bias[j] = q_j . min. Channels outer, so that each block of scales and
// minimums is widened once for all the queries; each query's sums are the same chains as alone.
template <int G>
__attribute__((target("avx2,fma,f16c"))) void fold_queries_avx2(const float* q, const uint16_t* sc, const uint16_t* mn,
                                                                int d, float* qs, float* bias) {
  __m256 vb[G];
  for (auto& x : vb) x = _mm256_setzero_ps();
  int c = 0;
  for (; c + 8 <= d; c += 8) {
    const __m256 s = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + c)));
    const __m256 m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + c)));
    for (int j = 0; j < G; ++j) {
      const __m256 qv = _mm256_loadu_ps(q + size_t(j) * d + c);
      _mm256_storeu_ps(qs + size_t(j) * d + c, _mm256_mul_ps(qv, s));
      vb[j] = _mm256_fmadd_ps(qv, m, vb[j]);
    }
  }
  alignas(32) float lanes[8];
  for (int j = 0; j < G; ++j) {
    const float* qj = q + size_t(j) * d;
    float* qsj = qs + size_t(j) * d;
    _mm256_store_ps(lanes, vb[j]);
    float b = 0;
    for (float x : lanes) b += x;
    for (int ch = c; ch < d; ++ch) {
      qsj[ch] = qj[ch] * half_to_float(sc[ch]);
      b += qj[ch] * half_to_float(mn[ch]);
    }
    bias[j] = b;
  }
}

// G queries (q [G, d], scores [G, tokens]); the codes of each word are extracted once for all of them.
template <int G>
__attribute__((target("avx2,fma,f16c"))) void keys_dot_avx2(const QuantKeysView& k, const float* q, float* scores,
                                                            size_t ldo) {
  const int b = k.bits, d = k.d;
  const __m256i mask = _mm256_set1_epi32(b == 3 ? 7 : (1 << b) - 1);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  std::vector<float> qs(static_cast<size_t>(G * d));  // [query][channel]
  alignas(32) float lanes[8];
  for (size_t g = 0; g < k.tokens / size_t(k.group); ++g) {
    float bias[G];
    fold_queries_avx2<G>(q, k.scale + g * d, k.min + g * d, d, qs.data(), bias);
    __m256 vbias[G];
    for (int j = 0; j < G; ++j) vbias[j] = _mm256_set1_ps(bias[j]);
    const size_t s0 = g * k.group;
    const uint32_t* wg = k.words + g * size_t(d) * (b == 3 ? size_t(k.group / 11) : size_t(k.group * b / 32));
    if (b == 3) {
      // 11 tokens per word: lanes 0-7 from slots 0-7, lanes 8-10 from slots 8-10 (slot 10: bits 30-31).
      const int wpg = k.group / 11;
      const __m256i sh0 = _mm256_mullo_epi32(lane, _mm256_set1_epi32(3));
      const __m256i sh1 = _mm256_add_epi32(sh0, _mm256_set1_epi32(24));
      for (int w = 0; w < wpg; ++w) {
        __m256 a0[G], a1[G];
        for (int j = 0; j < G; ++j) a0[j] = a1[j] = _mm256_setzero_ps();
        for (int ch = 0; ch < d; ++ch) {
          const uint32_t word = wg[size_t(ch) * wpg + w];
          const __m256 c0 = codes8(word, sh0, mask), c1 = codes8(word, sh1, mask);
          for (int j = 0; j < G; ++j) {
            const __m256 qc = _mm256_set1_ps(qs[size_t(j) * d + ch]);
            a0[j] = _mm256_fmadd_ps(qc, c0, a0[j]);
            a1[j] = _mm256_fmadd_ps(qc, c1, a1[j]);
          }
        }
        for (int j = 0; j < G; ++j) {
          float* sg = scores + size_t(j) * ldo + s0 + w * 11;
          _mm256_storeu_ps(sg, _mm256_add_ps(a0[j], vbias[j]));
          _mm256_store_ps(lanes, _mm256_add_ps(a1[j], vbias[j]));
          std::copy(lanes, lanes + 3, sg + 8);
        }
      }
      continue;
    }
    // 32 / b codes per word; blocks of 8 tokens share a word and a shift base.
    const int per = 32 / b, wpg = k.group / per;
    for (int t0 = 0; t0 < k.group; t0 += 8) {
      const int wi = t0 / per;
      const __m256i sh = _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(t0 % per)), _mm256_set1_epi32(b));
      // Even channels in one sum and odd ones in the other, as a single query's kernel always summed them
      // (two loop steps a pass, so that no accumulator is indexed at run time and all stay in registers).
      __m256 e[G], o[G];
      for (int j = 0; j < G; ++j) e[j] = o[j] = _mm256_setzero_ps();
      int ch = 0;
      for (; ch + 2 <= d; ch += 2) {
        const __m256 ce = codes8(wg[size_t(ch) * wpg + wi], sh, mask);
        const __m256 co = codes8(wg[size_t(ch + 1) * wpg + wi], sh, mask);
        for (int j = 0; j < G; ++j) {
          e[j] = _mm256_fmadd_ps(_mm256_set1_ps(qs[size_t(j) * d + ch]), ce, e[j]);
          o[j] = _mm256_fmadd_ps(_mm256_set1_ps(qs[size_t(j) * d + ch + 1]), co, o[j]);
        }
      }
      if (ch < d) {
        const __m256 ce = codes8(wg[size_t(ch) * wpg + wi], sh, mask);
        for (int j = 0; j < G; ++j) e[j] = _mm256_fmadd_ps(_mm256_set1_ps(qs[size_t(j) * d + ch]), ce, e[j]);
      }
      for (int j = 0; j < G; ++j)
        _mm256_storeu_ps(scores + size_t(j) * ldo + s0 + t0, _mm256_add_ps(_mm256_add_ps(e[j], o[j]), vbias[j]));
    }
  }
}

// n <= 8 fp16 numbers widened, lanes n-7 zero.
__attribute__((target("avx2,fma,f16c"))) inline __m256 load_halves(const uint16_t* h, int n) {
  switch (n) {
    case 8:
      return _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(h)));
    case 4:
      return _mm256_cvtph_ps(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(h)));
    case 2: {
      int32_t two;
      std::memcpy(&two, h, sizeof two);
      return _mm256_cvtph_ps(_mm_cvtsi32_si128(two));
    }
    case 1:  // a run of a head's channels within one group (attention spread over threads)
      return _mm256_cvtph_ps(_mm_cvtsi32_si128(h[0]));
    default: {
      alignas(16) uint16_t part[8] = {};
      std::copy_n(h, n, part);
      return _mm256_cvtph_ps(_mm_load_si128(reinterpret_cast<const __m128i*>(part)));
    }
  }
}

// The minimums' share of G weight vectors, sum_t p_t m_tg: one number per vector and channel group, the
// groups side by side in the lanes of a register per vector, each summed over the tokens in order
// (products rounded, then added, as a scalar loop would; a token of weight 0 adds a zero).
template <int G>
__attribute__((target("avx2,fma,f16c"))) void add_minimums_avx2(const QuantValuesView& v, const float* p, size_t ldp,
                                                                float* acc, int c0, int c1) {
  const int groups = v.d / v.group, g1 = c1 / v.group;
  alignas(32) float lanes[G][8];
  for (int c = c0 / v.group; c < g1; c += 8) {
    const int n = std::min(8, g1 - c);
    __m256 pm[G];
    for (auto& x : pm) x = _mm256_setzero_ps();
    for (size_t t = 0; t < v.tokens; ++t) {
      const __m256 m = load_halves(v.min + t * size_t(groups) + c, n);
      for (int j = 0; j < G; ++j)
        pm[j] = _mm256_add_ps(pm[j], _mm256_mul_ps(_mm256_set1_ps(p[size_t(j) * ldp + t]), m));
    }
    for (int j = 0; j < G; ++j) _mm256_store_ps(lanes[j], pm[j]);
    for (int j = 0; j < G; ++j)
      for (int ch = c * v.group; ch < std::min(c1, (c + 8) * v.group); ++ch)
        acc[size_t(j) * v.d + ch] += lanes[j][ch / v.group - c];
  }
}

// Token t's weights in the G vectors (p [G, ldp]); false when all are 0 (the token adds nothing).
template <int G>
inline bool token_weights(const float* p, size_t ldp, size_t t, float* pt) {
  bool any = false;
  for (int j = 0; j < G; ++j) {
    pt[j] = p[size_t(j) * ldp + t];
    any = any || pt[j] != 0.0f;
  }
  return any;
}

// NB blocks of 8 channels from channel c0 held in registers across all tokens for G weight vectors
// (p [G, tokens], acc [G, d]); each word's codes are extracted once for all of them. With OneGroup (the
// blocks within one channel group) a token's scaled weights are formed once for all blocks.
template <int G, int NB, bool OneGroup>
__attribute__((target("avx2,fma,f16c"))) void value_blocks_avx2(const QuantValuesView& v, const float* p, size_t ldp,
                                                                float* acc, int c0) {
  const int b = v.bits, d = v.d, per = 32 / b, groups = d / v.group, wpt = d / per;
  const __m256i mask = _mm256_set1_epi32((1 << b) - 1);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  __m256 a[G][NB];
  __m256i sh[NB];
  int wi[NB], gi[NB];
  for (int u = 0; u < NB; ++u) {
    const int c = c0 + 8 * u;
    for (int j = 0; j < G; ++j) a[j][u] = _mm256_loadu_ps(acc + size_t(j) * d + c);
    sh[u] = _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(c % per)), _mm256_set1_epi32(b));
    wi[u] = c / per;
    gi[u] = c / v.group;
  }
  for (size_t t = 0; t < v.tokens; ++t) {
    float pt[G];
    if (!token_weights<G>(p, ldp, t, pt)) continue;
    const uint32_t* wt = v.words + t * size_t(wpt);
    const uint16_t* st = v.scale + t * size_t(groups);
    if constexpr (OneGroup) {
      const float s = _cvtsh_ss(st[gi[0]]);
      __m256 ws[G];
      for (int j = 0; j < G; ++j) ws[j] = _mm256_set1_ps(pt[j] * s);
      for (int u = 0; u < NB; ++u) {
        const __m256 codes = codes8(wt[wi[u]], sh[u], mask);
        for (int j = 0; j < G; ++j) a[j][u] = _mm256_fmadd_ps(ws[j], codes, a[j][u]);
      }
    } else {
      for (int u = 0; u < NB; ++u) {
        const __m256 codes = codes8(wt[wi[u]], sh[u], mask);
        const float s = _cvtsh_ss(st[gi[u]]);
        for (int j = 0; j < G; ++j) a[j][u] = _mm256_fmadd_ps(_mm256_set1_ps(pt[j] * s), codes, a[j][u]);
      }
    }
  }
  for (int j = 0; j < G; ++j)
    for (int u = 0; u < NB; ++u) _mm256_storeu_ps(acc + size_t(j) * d + c0 + 8 * u, a[j][u]);
}

// Channels [c0, c1) in blocks of 8 CB (G CB accumulators in the 16 registers), the rest one block at a time.
template <int G>
__attribute__((target("avx2,fma,f16c"))) void values_axpy_avx2(const QuantValuesView& v, const float* p, size_t ldp,
                                                               float* acc, int c0, int c1) {
  constexpr int CB = G <= 2 ? 4 : 2;
  int c = c0;
  for (; c + 8 * CB <= c1; c += 8 * CB)
    if (c / v.group == (c + 8 * CB - 1) / v.group)
      value_blocks_avx2<G, CB, true>(v, p, ldp, acc, c);
    else
      value_blocks_avx2<G, CB, false>(v, p, ldp, acc, c);
  for (; c < c1; c += 8) value_blocks_avx2<G, 1, true>(v, p, ldp, acc, c);
  add_minimums_avx2<G>(v, p, ldp, acc, c0, c1);
}

// GCC 12's AVX-512 intrinsics pass an undefined vector as the unused merge source, which its
// -Wmaybe-uninitialized (or, as inlining goes, -Wuninitialized) reports inside every caller (GCC PR105593,
// fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// 16 codes as floats: lane l holds the code at bit offset shifts[l] of words[l]. The shifted word's low 4
// bits index `values` (code_values: each index's low `bits` bits as a float), which masks and converts
// in one permutation.
__attribute__((target("avx512f"))) inline __m512 codes16(__m512i words, __m512i shifts, __m512 values) {
  return _mm512_permutexvar_ps(_mm512_srlv_epi32(words, shifts), values);
}
__attribute__((target("avx512f"))) inline __m512 code_values(int bits) {
  alignas(64) float v[16];
  for (int i = 0; i < 16; ++i) v[i] = static_cast<float>(i & ((1 << bits) - 1));
  return _mm512_load_ps(v);
}

// The words of 16 consecutive b-bit codes (b = 1, 2, 4) starting at code `first` of a run of packed
// words: one word when it holds 32 / b >= 16 codes, else two, lanes 0-7 from the first.
template <int B>
__attribute__((target("avx512f"))) inline __m512i words16(const uint32_t* w, int first) {
  constexpr int per = 32 / B;
  if constexpr (per >= 16) {
    return _mm512_set1_epi32(static_cast<int>(w[first / per]));
  } else {
    const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
    return _mm512_permutexvar_epi32(
        half, _mm512_zextsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + first / per))));
  }
}

// The bit offsets of those 16 codes (code `first` at its slot first % per in its word).
template <int B>
__attribute__((target("avx512f"))) inline __m512i shifts16(int first) {
  constexpr int per = 32 / B;
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i slot = per >= 16 ? _mm512_add_epi32(lane, _mm512_set1_epi32(first % per))
                                 : _mm512_and_si512(lane, _mm512_set1_epi32(per - 1));
  return _mm512_slli_epi32(slot, B == 4 ? 2 : B - 1);
}

// NB blocks of 16 tokens of one token group side by side, from its token t0: wg the group's words
// [channel][wpg], qs its folded queries [G][d]; writes scores at out[j * tokens + t]. Each token's lane
// does what keys_dot_avx2 does for it, even and odd channels summed apart, so the scores are equal bit
// for bit; the blocks and the two parities give 2 G NB independent chains to hide the FMA latency.
template <int G, int B, int NB>
__attribute__((target("avx512f,avx2,fma,f16c"))) inline void key_blocks_avx512(const uint32_t* wg, int wpg, int d,
                                                                               int t0, const float* qs,
                                                                               const __m512* vbias, float* out,
                                                                               size_t tokens) {
  const __m512 mask = code_values(B);
  __m512i sh[NB];
  for (int i = 0; i < NB; ++i) sh[i] = shifts16<B>(t0 + 16 * i);
  __m512 e[G][NB], o[G][NB];
  for (int j = 0; j < G; ++j)
    for (int i = 0; i < NB; ++i) e[j][i] = o[j][i] = _mm512_setzero_ps();
  int ch = 0;
  for (; ch + 2 <= d; ch += 2) {
    __m512 ce[NB], co[NB];
    for (int i = 0; i < NB; ++i) {
      ce[i] = codes16(words16<B>(wg + size_t(ch) * wpg, t0 + 16 * i), sh[i], mask);
      co[i] = codes16(words16<B>(wg + size_t(ch + 1) * wpg, t0 + 16 * i), sh[i], mask);
    }
    for (int j = 0; j < G; ++j) {
      const __m512 qe = _mm512_set1_ps(qs[size_t(j) * d + ch]), qo = _mm512_set1_ps(qs[size_t(j) * d + ch + 1]);
      for (int i = 0; i < NB; ++i) {
        e[j][i] = _mm512_fmadd_ps(qe, ce[i], e[j][i]);
        o[j][i] = _mm512_fmadd_ps(qo, co[i], o[j][i]);
      }
    }
  }
  if (ch < d) {
    for (int i = 0; i < NB; ++i) {
      const __m512 ce = codes16(words16<B>(wg + size_t(ch) * wpg, t0 + 16 * i), sh[i], mask);
      for (int j = 0; j < G; ++j) e[j][i] = _mm512_fmadd_ps(_mm512_set1_ps(qs[size_t(j) * d + ch]), ce, e[j][i]);
    }
  }
  for (int j = 0; j < G; ++j)
    for (int i = 0; i < NB; ++i)
      _mm512_storeu_ps(out + size_t(j) * tokens + 16 * i, _mm512_add_ps(_mm512_add_ps(e[j][i], o[j][i]), vbias[j]));
}

// keys_dot_avx2 for b = 1, 2, 4 bits, 32 tokens a pass. Token groups a multiple of 16.
template <int G, int B>
__attribute__((target("avx512f,avx2,fma,f16c"))) void keys_dot_avx512(const QuantKeysView& k, const float* q,
                                                                      float* scores, size_t ldo) {
  const int d = k.d, wpg = k.group * B / 32;
  const size_t groups = k.tokens / size_t(k.group);
  // The next group's fold is made before this group's products, which do not wait for it, so that its
  // chains (the loads of its scales, a horizontal sum) run in their shadow; the scales four groups on are
  // fetched ahead. 90 heads of 8K 2-bit keys beyond the caches, one thread: 2.50-2.56 -> 2.35-2.37 ns a
  // token (three alternating runs; 2.42-2.44 with the fold ahead alone).
  std::vector<float> qs(static_cast<size_t>(2 * G * d));
  float bias[2][G];
  if (groups > 0) fold_queries_avx2<G>(q, k.scale, k.min, d, qs.data(), bias[0]);
  for (size_t g = 0; g < groups; ++g) {
    const size_t cur = g % 2;
    if (g + 4 < groups)
      for (int c = 0; c < d; c += 32) {  // 32 fp16 numbers a line
        _mm_prefetch(reinterpret_cast<const char*>(k.scale + (g + 4) * d + c), _MM_HINT_T0);
        _mm_prefetch(reinterpret_cast<const char*>(k.min + (g + 4) * d + c), _MM_HINT_T0);
      }
    if (g + 1 < groups)
      fold_queries_avx2<G>(q, k.scale + (g + 1) * d, k.min + (g + 1) * d, d, qs.data() + (1 - cur) * G * d,
                           bias[1 - cur]);
    const float* qg = qs.data() + cur * G * d;
    __m512 vbias[G];
    for (int j = 0; j < G; ++j) vbias[j] = _mm512_set1_ps(bias[cur][j]);
    const uint32_t* wg = k.words + g * size_t(d) * size_t(wpg);
    float* out = scores + g * k.group;
    int t0 = 0;
    for (; t0 + 32 <= k.group; t0 += 32) key_blocks_avx512<G, B, 2>(wg, wpg, d, t0, qg, vbias, out + t0, ldo);
    if (t0 < k.group) key_blocks_avx512<G, B, 1>(wg, wpg, d, t0, qg, vbias, out + t0, ldo);
  }
}

// The 3-bit words (11 tokens each) of NG consecutive token groups side by side, the same word w of each:
// w0 the first group's word of channel 0, unit_stride the distance to the next group's, qs and bias
// the groups' folded queries [NG][G][d] and [NG][G]. Each token's lane runs one chain over the channels,
// as keys_dot_avx2 does, so the scores are equal bit for bit; the NG groups give it G NG chains.
template <int G, int NG>
__attribute__((target("avx512f,avx2,fma,f16c"))) inline void key_words3_avx512(const uint32_t* w0, size_t unit_stride,
                                                                               int wpg, int d, const float* qs,
                                                                               const float* bias, int group, float* out,
                                                                               size_t tokens) {
  const __m512 mask = code_values(3);
  // Slot 10 at bits 30-31; lanes 11-15 shift out to 0 and are not stored.
  const __m512i sh =
      _mm512_mullo_epi32(_mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15), _mm512_set1_epi32(3));
  __m512 a[NG][G];
  for (int u = 0; u < NG; ++u)
    for (int j = 0; j < G; ++j) a[u][j] = _mm512_setzero_ps();
  for (int ch = 0; ch < d; ++ch) {
    __m512 c[NG];
    for (int u = 0; u < NG; ++u)
      c[u] = codes16(_mm512_set1_epi32(static_cast<int>(w0[u * unit_stride + size_t(ch) * wpg])), sh, mask);
    for (int u = 0; u < NG; ++u)
      for (int j = 0; j < G; ++j)
        a[u][j] = _mm512_fmadd_ps(_mm512_set1_ps(qs[(size_t(u) * G + j) * d + ch]), c[u], a[u][j]);
  }
  for (int u = 0; u < NG; ++u)
    for (int j = 0; j < G; ++j)
      _mm512_mask_storeu_ps(out + size_t(j) * tokens + size_t(u) * group, 0x7FF,
                            _mm512_add_ps(a[u][j], _mm512_set1_ps(bias[u * G + j])));
}

// keys_dot_avx2 for 3 bits, a word of four token groups at a time (the rest one by one).
template <int G>
__attribute__((target("avx512f,avx2,fma,f16c"))) void keys3_dot_avx512(const QuantKeysView& k, const float* q,
                                                                       float* scores, size_t ldo) {
  constexpr int NG = 4;
  const int d = k.d, wpg = k.group / 11;
  const size_t groups = k.tokens / size_t(k.group), unit = size_t(d) * size_t(wpg);
  std::vector<float> qs(static_cast<size_t>(NG * G * d));
  float bias[NG * G];
  for (size_t g = 0; g < groups;) {
    const int ng = groups - g >= NG ? NG : 1;
    for (int u = 0; u < ng; ++u)
      fold_queries_avx2<G>(q, k.scale + (g + u) * d, k.min + (g + u) * d, d, qs.data() + size_t(u) * G * d,
                           bias + u * G);
    for (int w = 0; w < wpg; ++w) {
      const uint32_t* w0 = k.words + g * unit + size_t(w);
      float* out = scores + g * k.group + size_t(w) * 11;
      if (ng == NG)
        key_words3_avx512<G, NG>(w0, unit, wpg, d, qs.data(), bias, k.group, out, ldo);
      else
        key_words3_avx512<G, 1>(w0, unit, wpg, d, qs.data(), bias, k.group, out, ldo);
    }
    g += size_t(ng);
  }
}

// NB blocks of 16 channels from channel c0, in registers across all tokens for G weight vectors, GB
// blocks to a channel group: each channel's lane does what values_axpy_avx2 does for it, so the sums are
// equal bit for bit. Per 16 tokens, their weights times their groups' scales are formed on 16 lanes, and
// the weights are checked for zeros; per token, the FMAs take those scaled weights from memory. With
// Mins, the minimums' share is added as add_minimums_avx2 adds it, each (vector, group)'s sum a scalar
// chain in token order beside the FMAs instead of a pass of its own after them (a token of weight 0 adds
// nothing); its G x NB / GB chains take registers, so only where at most 8.
template <int G, int B, int NB, int GB, bool Mins>
__attribute__((target("avx512f,avx2,fma,f16c"))) void value_blocks_avx512(const QuantValuesView& v, const float* p,
                                                                          size_t ldp, float* acc, int c0) {
  static_assert(NB % GB == 0);
  constexpr int NH = NB / GB;  // runs of GB blocks within one channel group
  static_assert(!Mins || G * NH <= 8);
  const int d = v.d, groups = d / v.group, wpt = d * B / 32;
  const __m512 mask = code_values(B);
  __m512 a[G][NB];
  __m512i sh[NB];
  int gi[NH];  // the channel group of each run
  for (int i = 0; i < NB; ++i) {
    for (int j = 0; j < G; ++j) a[j][i] = _mm512_loadu_ps(acc + size_t(j) * d + c0 + 16 * i);
    sh[i] = shifts16<B>(c0 + 16 * i);
    if (i % GB == 0) gi[i / GB] = (c0 + 16 * i) / v.group;
  }
  alignas(64) float ws[NH][G][16], wm[NH][G][16];  // the 16 tokens' scaled weights and minimums' terms
  // Scalar chains held in the low lanes of vectors: as plain floats GCC packs them into pairs and spills.
  __m128 msum[NH][G];
  for (auto& row : msum)
    for (auto& x : row) x = _mm_setzero_ps();
  for (size_t t0 = 0; t0 < v.tokens; t0 += 16) {
    const int n = static_cast<int>(std::min<size_t>(16, v.tokens - t0));
    const auto valid = static_cast<__mmask16>((1u << n) - 1);
    __m512 pv[G];
    unsigned live = 0;  // tokens with a nonzero weight in some vector
    for (int j = 0; j < G; ++j) {
      pv[j] = _mm512_maskz_loadu_ps(valid, p + size_t(j) * ldp + t0);
      live |= _mm512_mask_cmp_ps_mask(valid, pv[j], _mm512_setzero_ps(), _CMP_NEQ_UQ);
    }
    if (live == 0) continue;
    for (int h = 0; h < NH; ++h) {
      const __m512 s = group_halves16(v.scale + t0 * size_t(groups), groups, gi[h], n);
      for (int j = 0; j < G; ++j) _mm512_store_ps(ws[h][j], _mm512_mul_ps(pv[j], s));
      if constexpr (Mins) {
        const __m512 m = group_halves16(v.min + t0 * size_t(groups), groups, gi[h], n);
        for (int j = 0; j < G; ++j) _mm512_store_ps(wm[h][j], _mm512_mul_ps(pv[j], m));
      }
    }
    for (; live != 0; live &= live - 1) {
      const int l = __builtin_ctz(live);
      const uint32_t* wt = v.words + (t0 + size_t(l)) * size_t(wpt);
      for (int h = 0; h < NH; ++h) {
        if constexpr (Mins)
          for (int j = 0; j < G; ++j) msum[h][j] = _mm_add_ss(msum[h][j], _mm_load_ss(&wm[h][j][l]));
        for (int i = h * GB; i < (h + 1) * GB; ++i) {
          const __m512 codes = codes16(words16<B>(wt, c0 + 16 * i), sh[i], mask);
          for (int j = 0; j < G; ++j) a[j][i] = _mm512_fmadd_ps(_mm512_set1_ps(ws[h][j][l]), codes, a[j][i]);
        }
      }
    }
  }
  for (int j = 0; j < G; ++j)
    for (int i = 0; i < NB; ++i)
      _mm512_storeu_ps(acc + size_t(j) * d + c0 + 16 * i,
                       Mins ? _mm512_add_ps(a[j][i], _mm512_broadcastss_ps(msum[i / GB][j])) : a[j][i]);
}

// Channels [c0, c1) in passes of 64 channels, then 32 (a cache head's half) and 16.
template <int G, int B, bool Mins>
__attribute__((target("avx512f,avx2,fma,f16c"))) void value_passes_avx512(const QuantValuesView& v, const float* p,
                                                                          size_t ldp, float* acc, int c0, int c1) {
  int c = c0;
  for (; c + 64 <= c1; c += 64) {
    if (v.group % 64 == 0)
      value_blocks_avx512<G, B, 4, 4, Mins>(v, p, ldp, acc, c);
    else if (v.group % 32 == 0)
      value_blocks_avx512<G, B, 4, 2, Mins>(v, p, ldp, acc, c);
    else if constexpr (!Mins || G <= 2)
      value_blocks_avx512<G, B, 4, 1, Mins>(v, p, ldp, acc, c);
    else
      break;  // 4 G minimums' chains would not fit: these channels go by 32 (values_axpy_avx512 avoids it)
  }
  for (; c + 32 <= c1; c += 32) {
    if (v.group % 32 == 0)
      value_blocks_avx512<G, B, 2, 2, Mins>(v, p, ldp, acc, c);
    else
      value_blocks_avx512<G, B, 2, 1, Mins>(v, p, ldp, acc, c);
  }
  for (; c < c1; c += 16) value_blocks_avx512<G, B, 1, 1, Mins>(v, p, ldp, acc, c);
}

// values_axpy_avx2 16 channels a vector. Head dims and channel groups a multiple of 16. The minimums'
// chains ride along with the products where they fit in registers (groups of 32 channels or more, or
// up to two vectors), else they are summed after, as the AVX2 kernel sums them.
template <int G, int B>
__attribute__((target("avx512f,avx2,fma,f16c"))) void values_axpy_avx512(const QuantValuesView& v, const float* p,
                                                                         size_t ldp, float* acc, int c0, int c1) {
  if (G <= 2 || v.group % 32 == 0) return value_passes_avx512<G, B, true>(v, p, ldp, acc, c0, c1);
  value_passes_avx512<G, B, false>(v, p, ldp, acc, c0, c1);
  add_minimums_avx2<G>(v, p, ldp, acc, c0, c1);
}

#pragma GCC diagnostic pop

template <int G>
struct KeysDot {
  static void run(const QuantKeysView& k, const float* q, float* s, size_t ldo) { keys_dot_avx2<G>(k, q, s, ldo); }
};
template <int G>
struct KeysDot512 {
  static void run(const QuantKeysView& k, const float* q, float* s, size_t ldo) {
    switch (k.bits) {
      case 1:
        return keys_dot_avx512<G, 1>(k, q, s, ldo);
      case 2:
        return keys_dot_avx512<G, 2>(k, q, s, ldo);
      case 3:
        return keys3_dot_avx512<G>(k, q, s, ldo);
      default:
        return keys_dot_avx512<G, 4>(k, q, s, ldo);
    }
  }
};
template <int G>
struct ValuesAxpy {
  static void run(const QuantValuesView& v, const float* p, float* a, size_t ldp, int c0, int c1) {
    values_axpy_avx2<G>(v, p, ldp, a, c0, c1);
  }
};
template <int G>
struct ValuesAxpy512 {
  static void run(const QuantValuesView& v, const float* p, float* a, size_t ldp, int c0, int c1) {
    switch (v.bits) {
      case 1:
        return values_axpy_avx512<G, 1>(v, p, ldp, a, c0, c1);
      case 2:
        return values_axpy_avx512<G, 2>(v, p, ldp, a, c0, c1);
      default:
        return values_axpy_avx512<G, 4>(v, p, ldp, a, c0, c1);
    }
  }
};

}  // namespace

void quant_keys_dot(const QuantKeysView& k, const float* q, float* scores, int g, size_t ldo) {
  if (k.tokens == 0) return;
  if (ldo == 0) ldo = k.tokens;
  if (cpu_has_avx512() && (k.bits == 3 || k.group % 16 == 0))
    return for_query_runs<4>(
        g, [&](auto G, int j) { KeysDot512<decltype(G)::value>::run(k, q + j * k.d, scores + j * ldo, ldo); });
  if (cpu_has_avx2())
    return for_query_runs<4>(
        g, [&](auto G, int j) { KeysDot<decltype(G)::value>::run(k, q + j * k.d, scores + j * ldo, ldo); });
  for (int j = 0; j < g; ++j) keys_dot_portable(k, q + size_t(j) * k.d, scores + size_t(j) * ldo);
}

void quant_values_axpy(const QuantValuesView& v, const float* p, float* acc, int g, int c0, int c1, size_t ldp) {
  if (v.tokens == 0) return;
  if (c1 == 0) c1 = v.d;
  if (ldp == 0) ldp = v.tokens;
  if (c0 % v.group != 0 || c1 % v.group != 0 || c0 < 0 || c1 > v.d || c0 >= c1)
    fail("quantized values: channels [{}, {}) do not start and end on groups of {} within {}", c0, c1, v.group, v.d);
  if (cpu_has_avx512() && v.bits != 3 && v.d % 16 == 0 && v.group % 16 == 0)
    return for_query_runs<4>(
        g, [&](auto G, int j) { ValuesAxpy512<decltype(G)::value>::run(v, p + j * ldp, acc + j * v.d, ldp, c0, c1); });
  if (cpu_has_avx2() && v.bits != 3)
    return for_query_runs<4>(
        g, [&](auto G, int j) { ValuesAxpy<decltype(G)::value>::run(v, p + j * ldp, acc + j * v.d, ldp, c0, c1); });
  for (int j = 0; j < g; ++j) values_axpy_portable(v, p + size_t(j) * ldp, acc + size_t(j) * v.d, c0, c1);
}

}  // namespace kvb
