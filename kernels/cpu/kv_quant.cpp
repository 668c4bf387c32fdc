#include "kernels/cpu/kv_quant.hpp"

#include <immintrin.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_rows.hpp"

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

void values_axpy_portable(const QuantValuesView& v, const float* p, float* acc) {
  const int groups = v.d / v.group, per = codes_per_word(v.bits);
  std::vector<uint32_t> codes(size_t(v.group));
  for (size_t t = 0; t < v.tokens; ++t) {
    if (p[t] == 0.0f) continue;
    for (int gi = 0; gi < groups; ++gi) {
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

// The G queries folded into one token group's channel scales, qs [channel][query] (a channel's G factors
// side by side), and the minimums' share of each query's scores, bias[j] = q_j . min.
template <int G>
__attribute__((target("avx2,fma,f16c"))) void fold_queries_avx2(const float* q, const uint16_t* sc, const uint16_t* mn,
                                                                int d, float* qs, float* bias) {
  alignas(32) float lanes[8];
  for (int j = 0; j < G; ++j) {
    const float* qj = q + size_t(j) * d;
    float b = 0;
    int c = 0;
    __m256 vb = _mm256_setzero_ps();
    for (; c + 8 <= d; c += 8) {
      const __m256 qv = _mm256_loadu_ps(qj + c);
      _mm256_store_ps(lanes,
                      _mm256_mul_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(sc + c)))));
      for (int l = 0; l < 8; ++l) qs[size_t(c + l) * G + j] = lanes[l];
      vb = _mm256_fmadd_ps(qv, _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(mn + c))), vb);
    }
    _mm256_store_ps(lanes, vb);
    for (float x : lanes) b += x;
    for (; c < d; ++c) {
      qs[size_t(c) * G + j] = qj[c] * half_to_float(sc[c]);
      b += qj[c] * half_to_float(mn[c]);
    }
    bias[j] = b;
  }
}

// G queries (q [G, d], scores [G, tokens]); the codes of each word are extracted once for all of them.
template <int G>
__attribute__((target("avx2,fma,f16c"))) void keys_dot_avx2(const QuantKeysView& k, const float* q, float* scores) {
  const int b = k.bits, d = k.d;
  const __m256i mask = _mm256_set1_epi32(b == 3 ? 7 : (1 << b) - 1);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  std::vector<float> qs(static_cast<size_t>(G * d));  // [channel][query]: a channel's G factors side by side
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
            const __m256 qc = _mm256_set1_ps(qs[size_t(ch) * G + j]);
            a0[j] = _mm256_fmadd_ps(qc, c0, a0[j]);
            a1[j] = _mm256_fmadd_ps(qc, c1, a1[j]);
          }
        }
        for (int j = 0; j < G; ++j) {
          float* sg = scores + size_t(j) * k.tokens + s0 + w * 11;
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
      __m256 a[G][2];  // even and odd channels
      for (auto& aj : a) aj[0] = aj[1] = _mm256_setzero_ps();
      for (int ch = 0; ch < d; ++ch) {
        const __m256 codes = codes8(wg[size_t(ch) * wpg + wi], sh, mask);
        // Even channels in one sum and odd ones in the other, as a single query's kernel always summed them.
        const int parity = ch % 2 == 1 ? 1 : 0;
        for (int j = 0; j < G; ++j)
          a[j][parity] = _mm256_fmadd_ps(_mm256_set1_ps(qs[size_t(ch) * G + j]), codes, a[j][parity]);
      }
      for (int j = 0; j < G; ++j)
        _mm256_storeu_ps(scores + size_t(j) * k.tokens + s0 + t0,
                         _mm256_add_ps(_mm256_add_ps(a[j][0], a[j][1]), vbias[j]));
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
__attribute__((target("avx2,fma,f16c"))) void add_minimums_avx2(const QuantValuesView& v, const float* p, float* acc) {
  const int groups = v.d / v.group;
  alignas(32) float lanes[G][8];
  for (int c = 0; c < groups; c += 8) {
    const int n = std::min(8, groups - c);
    __m256 pm[G];
    for (auto& x : pm) x = _mm256_setzero_ps();
    for (size_t t = 0; t < v.tokens; ++t) {
      const __m256 m = load_halves(v.min + t * size_t(groups) + c, n);
      for (int j = 0; j < G; ++j)
        pm[j] = _mm256_add_ps(pm[j], _mm256_mul_ps(_mm256_set1_ps(p[size_t(j) * v.tokens + t]), m));
    }
    for (int j = 0; j < G; ++j) _mm256_store_ps(lanes[j], pm[j]);
    for (int j = 0; j < G; ++j)
      for (int ch = c * v.group; ch < std::min(v.d, (c + 8) * v.group); ++ch)
        acc[size_t(j) * v.d + ch] += lanes[j][ch / v.group - c];
  }
}

// Token t's weights in the G vectors (p [G, tokens]); false when all are 0 (the token adds nothing).
template <int G>
inline bool token_weights(const float* p, size_t tokens, size_t t, float* pt) {
  bool any = false;
  for (int j = 0; j < G; ++j) {
    pt[j] = p[size_t(j) * tokens + t];
    any = any || pt[j] != 0.0f;
  }
  return any;
}

// G weight vectors (p [G, tokens], acc [G, d]); each word's codes are extracted once for all of them.
template <int G>
__attribute__((target("avx2,fma,f16c"))) void values_axpy_avx2(const QuantValuesView& v, const float* p, float* acc) {
  const int b = v.bits, d = v.d, per = 32 / b, groups = d / v.group, wpt = d / per;
  // Blocks of 8 * CB channels held in registers across all tokens (G * CB accumulators).
  constexpr int CB = G <= 2 ? 4 : 2;
  const __m256i mask = _mm256_set1_epi32((1 << b) - 1);
  const __m256i lane = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
  for (int c0 = 0; c0 < d; c0 += 8 * CB) {
    const int nb = std::min(8 * CB, d - c0) / 8;
    __m256 a[G][CB];
    __m256i sh[CB];
    int wi[CB], gi[CB];
    for (int u = 0; u < nb; ++u) {
      const int c = c0 + 8 * u;
      for (int j = 0; j < G; ++j) a[j][u] = _mm256_loadu_ps(acc + size_t(j) * d + c);
      sh[u] = _mm256_mullo_epi32(_mm256_add_epi32(lane, _mm256_set1_epi32(c % per)), _mm256_set1_epi32(b));
      wi[u] = c / per;
      gi[u] = c / v.group;
    }
    for (size_t t = 0; t < v.tokens; ++t) {
      float pt[G];
      if (!token_weights<G>(p, v.tokens, t, pt)) continue;
      const uint32_t* wt = v.words + t * size_t(wpt);
      const uint16_t* st = v.scale + t * size_t(groups);
      for (int u = 0; u < nb; ++u) {
        const __m256 codes = codes8(wt[wi[u]], sh[u], mask);
        const float s = _cvtsh_ss(st[gi[u]]);
        for (int j = 0; j < G; ++j) a[j][u] = _mm256_fmadd_ps(_mm256_set1_ps(pt[j] * s), codes, a[j][u]);
      }
    }
    for (int j = 0; j < G; ++j)
      for (int u = 0; u < nb; ++u) _mm256_storeu_ps(acc + size_t(j) * d + c0 + 8 * u, a[j][u]);
  }
  add_minimums_avx2<G>(v, p, acc);
}

// GCC 12's AVX-512 intrinsics pass an undefined vector as the unused merge source, which its
// -Wmaybe-uninitialized reports inside every caller (GCC PR105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"

// 16 codes as floats: lane l holds the code at bit offset shifts[l] of words[l].
__attribute__((target("avx512f"))) inline __m512 codes16(__m512i words, __m512i shifts, __m512i mask) {
  return _mm512_cvtepi32_ps(_mm512_and_si512(_mm512_srlv_epi32(words, shifts), mask));
}

// The words of 16 consecutive codes starting at code `first` of a run of packed words: one word when it
// holds 32 / b >= 16 codes, else (4 bits) two, lanes 0-7 from the first.
__attribute__((target("avx512f"))) inline __m512i words16(const uint32_t* w, int first, int per) {
  if (per >= 16) return _mm512_set1_epi32(static_cast<int>(w[first / per]));
  const __m512i half = _mm512_setr_epi32(0, 0, 0, 0, 0, 0, 0, 0, 1, 1, 1, 1, 1, 1, 1, 1);
  return _mm512_permutexvar_epi32(
      half, _mm512_zextsi128_si512(_mm_loadl_epi64(reinterpret_cast<const __m128i*>(w + first / per))));
}

// The bit offsets of 16 consecutive codes starting at code `first` (its slot first % per in its word).
__attribute__((target("avx512f"))) inline __m512i shifts16(int first, int per, int b) {
  const __m512i lane = _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15);
  const __m512i slot = per >= 16 ? _mm512_add_epi32(lane, _mm512_set1_epi32(first % per))
                                 : _mm512_and_si512(lane, _mm512_set1_epi32(per - 1));
  return _mm512_mullo_epi32(slot, _mm512_set1_epi32(b));
}

// keys_dot_avx2 16 tokens a vector (3 bits: a word's 11 tokens in one): each token's lane does the same
// operations in the same order, even and odd channels summed apart, so the scores are equal bit for bit.
// Token groups a multiple of 16 (or 3 bits).
template <int G>
__attribute__((target("avx512f,avx2,fma,f16c"))) void keys_dot_avx512(const QuantKeysView& k, const float* q,
                                                                      float* scores) {
  const int b = k.bits, d = k.d, per = b == 3 ? 11 : 32 / b, wpg = k.group / per;
  const __m512i mask = _mm512_set1_epi32(b == 3 ? 7 : (1 << b) - 1);
  std::vector<float> qs(static_cast<size_t>(G * d));
  for (size_t g = 0; g < k.tokens / size_t(k.group); ++g) {
    float bias[G];
    fold_queries_avx2<G>(q, k.scale + g * d, k.min + g * d, d, qs.data(), bias);
    __m512 vbias[G];
    for (int j = 0; j < G; ++j) vbias[j] = _mm512_set1_ps(bias[j]);
    const size_t s0 = g * k.group;
    const uint32_t* wg = k.words + g * size_t(d) * size_t(wpg);
    if (b == 3) {
      const __m512i sh = shifts16(0, 16, 3);  // slot 10 at bits 30-31; lanes 11-15 shift out to 0
      for (int w = 0; w < wpg; ++w) {
        __m512 a[G];
        for (auto& aj : a) aj = _mm512_setzero_ps();
        for (int ch = 0; ch < d; ++ch) {
          const __m512 codes = codes16(_mm512_set1_epi32(static_cast<int>(wg[size_t(ch) * wpg + w])), sh, mask);
          for (int j = 0; j < G; ++j) a[j] = _mm512_fmadd_ps(_mm512_set1_ps(qs[size_t(ch) * G + j]), codes, a[j]);
        }
        for (int j = 0; j < G; ++j)
          _mm512_mask_storeu_ps(scores + size_t(j) * k.tokens + s0 + w * 11, 0x7FF, _mm512_add_ps(a[j], vbias[j]));
      }
      continue;
    }
    for (int t0 = 0; t0 < k.group; t0 += 16) {
      const __m512i sh = shifts16(t0, per, b);
      __m512 a[G][2];  // even and odd channels
      for (auto& aj : a) aj[0] = aj[1] = _mm512_setzero_ps();
      for (int ch = 0; ch < d; ++ch) {
        const __m512 codes = codes16(words16(wg + size_t(ch) * wpg, t0, per), sh, mask);
        const int parity = ch % 2 == 1 ? 1 : 0;
        for (int j = 0; j < G; ++j)
          a[j][parity] = _mm512_fmadd_ps(_mm512_set1_ps(qs[size_t(ch) * G + j]), codes, a[j][parity]);
      }
      for (int j = 0; j < G; ++j)
        _mm512_storeu_ps(scores + size_t(j) * k.tokens + s0 + t0,
                         _mm512_add_ps(_mm512_add_ps(a[j][0], a[j][1]), vbias[j]));
    }
  }
}

// values_axpy_avx2 16 channels a vector, all 64 channels of a head of 64 in registers for up to four
// weight vectors: each channel's lane does the same operations in the same order, so the sums are
// equal bit for bit. Head dims and channel groups a multiple of 16.
template <int G>
__attribute__((target("avx512f,avx2,fma,f16c"))) void values_axpy_avx512(const QuantValuesView& v, const float* p,
                                                                         float* acc) {
  const int b = v.bits, d = v.d, per = 32 / b, groups = d / v.group, wpt = d / per;
  constexpr int CB = 4;
  const __m512i mask = _mm512_set1_epi32((1 << b) - 1);
  for (int c0 = 0; c0 < d; c0 += 16 * CB) {
    const int nb = std::min(16 * CB, d - c0) / 16;
    __m512 a[G][CB];
    __m512i sh[CB];
    int gi[CB];
    for (int u = 0; u < nb; ++u) {
      const int c = c0 + 16 * u;
      for (int j = 0; j < G; ++j) a[j][u] = _mm512_loadu_ps(acc + size_t(j) * d + c);
      sh[u] = shifts16(c, per, b);
      gi[u] = c / v.group;
    }
    for (size_t t = 0; t < v.tokens; ++t) {
      float pt[G];
      if (!token_weights<G>(p, v.tokens, t, pt)) continue;
      const uint32_t* wt = v.words + t * size_t(wpt);
      const uint16_t* st = v.scale + t * size_t(groups);
      for (int u = 0; u < nb; ++u) {
        const __m512 codes = codes16(words16(wt, c0 + 16 * u, per), sh[u], mask);
        const float s = _cvtsh_ss(st[gi[u]]);
        for (int j = 0; j < G; ++j) a[j][u] = _mm512_fmadd_ps(_mm512_set1_ps(pt[j] * s), codes, a[j][u]);
      }
    }
    for (int j = 0; j < G; ++j)
      for (int u = 0; u < nb; ++u) _mm512_storeu_ps(acc + size_t(j) * d + c0 + 16 * u, a[j][u]);
  }
  add_minimums_avx2<G>(v, p, acc);
}

#pragma GCC diagnostic pop

// Runs kernel<G> over the g queries in chunks of at most four, the most whose accumulators stay in registers.
template <template <int> class K, class View>
void in_chunks(const View& x, const float* in, size_t in_row, float* out, size_t out_row, int g) {
  for (int j = 0; j < g; j += 4) {
    const float* i = in + size_t(j) * in_row;
    float* o = out + size_t(j) * out_row;
    switch (std::min(4, g - j)) {
      case 1:
        K<1>::run(x, i, o);
        break;
      case 2:
        K<2>::run(x, i, o);
        break;
      case 3:
        K<3>::run(x, i, o);
        break;
      default:
        K<4>::run(x, i, o);
    }
  }
}
template <int G>
struct KeysDot {
  static void run(const QuantKeysView& k, const float* q, float* s) { keys_dot_avx2<G>(k, q, s); }
};
template <int G>
struct KeysDot512 {
  static void run(const QuantKeysView& k, const float* q, float* s) { keys_dot_avx512<G>(k, q, s); }
};
template <int G>
struct ValuesAxpy {
  static void run(const QuantValuesView& v, const float* p, float* a) { values_axpy_avx2<G>(v, p, a); }
};
template <int G>
struct ValuesAxpy512 {
  static void run(const QuantValuesView& v, const float* p, float* a) { values_axpy_avx512<G>(v, p, a); }
};

}  // namespace

void quant_keys_dot(const QuantKeysView& k, const float* q, float* scores, int g) {
  if (k.tokens == 0) return;
  if (cpu_has_avx512() && (k.bits == 3 || k.group % 16 == 0))
    return in_chunks<KeysDot512>(k, q, size_t(k.d), scores, k.tokens, g);
  if (cpu_has_avx2()) return in_chunks<KeysDot>(k, q, size_t(k.d), scores, k.tokens, g);
  for (int j = 0; j < g; ++j) keys_dot_portable(k, q + size_t(j) * k.d, scores + size_t(j) * k.tokens);
}

void quant_values_axpy(const QuantValuesView& v, const float* p, float* acc, int g) {
  if (v.tokens == 0) return;
  if (cpu_has_avx512() && v.bits != 3 && v.d % 16 == 0 && v.group % 16 == 0)
    return in_chunks<ValuesAxpy512>(v, p, v.tokens, acc, size_t(v.d), g);
  if (cpu_has_avx2() && v.bits != 3) return in_chunks<ValuesAxpy>(v, p, v.tokens, acc, size_t(v.d), g);
  for (int j = 0; j < g; ++j) values_axpy_portable(v, p + size_t(j) * v.tokens, acc + size_t(j) * v.d);
}

}  // namespace kvb
