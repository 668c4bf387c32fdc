#include "kernels/cpu/linear_quant.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <span>

#include "kernels/cpu/avx2.hpp"
#include "kernels/cpu/dequant.hpp"
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
// A row of `cols` values in the file's blocks.
size_t file_row_bytes(DType t, int cols) { return size_t(cols) / dtype_info(t).block_elems * block_bytes(t); }

// Q4_1 and Q5_1 blocks carry a min (value = d q + m), added as m x (d_x sum q_x).
constexpr bool has_min(DType t) { return t == DType::Q4_1 || t == DType::Q5_1; }
constexpr bool has_fifth_bit(DType t) { return t == DType::Q5_0 || t == DType::Q5_1; }
// Block layout of the 32-value types but Q8_0: fp16 d (and m), Q5's 32 fifth bits, 16 bytes of nibbles.
constexpr size_t qh_offset(DType t) { return has_min(t) ? 4 : 2; }
constexpr size_t qs_offset(DType t) { return qh_offset(t) + (has_fifth_bit(t) ? 4 : 0); }

// Integer sum of one weight block against 32 quantized activations: the product is d * isum (+ m * s
// where the block has a min). `qs` holds the block's quants: for Q8_0 32 signed bytes; otherwise 16
// bytes of nibbles, element j < 16 the low nibble of qs[j], j >= 16 the high nibble of qs[j - 16], and
// Q5 blocks put bit j of the 32 bits at `qh` above it.
int block_isum(DType t, const uint8_t* qs, const uint8_t* qh_bits, const int8_t* q) {
  int sum = 0;
  if (t == DType::Q8_0) {
    const auto* w = reinterpret_cast<const int8_t*>(qs);
    for (int j = 0; j < QK; ++j) sum += w[j] * q[j];
    return sum;
  }
  uint32_t qh = 0;
  if (has_fifth_bit(t)) std::memcpy(&qh, qh_bits, 4);
  const int off = t == DType::Q4_0 ? 8 : t == DType::Q5_0 ? 16 : 0;
  for (int j = 0; j < QK / 2; ++j) {
    const int lo = (qs[j] & 0x0F) | int((qh >> j) & 1) << 4, hi = (qs[j] >> 4) | int((qh >> (j + 16)) & 1) << 4;
    sum += (lo - off) * q[j] + (hi - off) * q[j + QK / 2];
  }
  return sum;
}

bool is_kquant(DType t) { return t == DType::Q4_K || t == DType::Q6_K; }

constexpr int QKK = 256;

// Q4_K: value = d sc_j q - dmin m_j for sub-blocks j of 32. Returns sum_j sc_j (q4 . q8) and, in
// `mins`, sum_j m_j (sum of the sub-block's q8), so that the product is d yd isum - dmin yd mins.
int q4k_isum(const uint8_t* b, const int8_t* q, const int16_t* bsums, int& mins) {
  const uint8_t* scales = b + 4;
  const uint8_t* qs = b + 16;
  int isum = 0;
  mins = 0;
  for (int c = 0; c < 4; ++c) {  // 64 values: low nibbles are sub-block 2c, high ones 2c + 1
    uint8_t sc1, m1, sc2, m2;
    scale_min_k4(2 * c, scales, sc1, m1);
    scale_min_k4(2 * c + 1, scales, sc2, m2);
    int s1 = 0, s2 = 0;
    for (int l = 0; l < 32; ++l) {
      s1 += (qs[32 * c + l] & 0xF) * q[64 * c + l];
      s2 += (qs[32 * c + l] >> 4) * q[64 * c + 32 + l];
    }
    isum += sc1 * s1 + sc2 * s2;
    mins += m1 * (bsums[4 * c] + bsums[4 * c + 1]) + m2 * (bsums[4 * c + 2] + bsums[4 * c + 3]);
  }
  return isum;
}

// Q6_K: value = d sc_k (u6 - 32) for sub-blocks k of 16. Returns sum_k sc_k (u6 . q8 - 32 bsum_k).
int q6k_isum(const uint8_t* b, const int8_t* q, const int16_t* bsums) {
  const uint8_t* ql = b;
  const uint8_t* qh = b + 128;
  const auto* sc = reinterpret_cast<const int8_t*>(b + 192);
  int sums[16] = {};
  for (int half = 0; half < 2; ++half, ql += 64, qh += 32, q += 128)
    for (int l = 0; l < 32; ++l) {
      const int k = 8 * half + l / 16;
      sums[k] += ((ql[l] & 0xF) | (qh[l] & 3) << 4) * q[l];
      sums[k + 2] += ((ql[l + 32] & 0xF) | ((qh[l] >> 2) & 3) << 4) * q[l + 32];
      sums[k + 4] += ((ql[l] >> 4) | ((qh[l] >> 4) & 3) << 4) * q[l + 64];
      sums[k + 6] += ((ql[l + 32] >> 4) | ((qh[l] >> 6) & 3) << 4) * q[l + 96];
    }
  int isum = 0;
  for (int k = 0; k < 16; ++k) isum += sc[k] * (sums[k] - 32 * bsums[k]);
  return isum;
}

// How the engine stores a matrix of these types: in tiles of 16 rows, each tile block by block, one
// chunk per block of its 16 rows: their quants as 32-bit words, interleaved (word w of rows 0..15, then
// word w + 1; Q4's and Q5's word w holds values 4w..4w+3 in its low nibbles and 4w+16..4w+19 in its high
// ones, Q8_0's word w values 4w..4w+3 with the sign bit flipped, i.e. value + 128 as unsigned), Q5's
// fifth bits (a word per row, bit k of byte i holding value 4k + i's), the 16 fp16 scales d and, for
// Q4_1 and Q5_1, the 16 fp16 mins m. A 64-byte load is then one word of the tile's 16 rows, a register
// whose lanes are rows: a block's product for a token is eight VNNI instructions against the token's
// activations broadcast four bytes at a time, and a row's sum never needs a horizontal add. (Stored row
// by row, each block cost some five instructions per row and token, and a batch of eight sequences made
// the GEMVs arithmetic-bound.) The K-quants' blocks of 256 are interleaved the same way, every word of
// the block but its fp16 scales: Q4_K's 32 words of nibbles (word w of bytes 32c..32c+31 holds values
// 4w..4w+3 of sub-block 2c in its low nibbles and of 2c + 1 in its high ones), then its 3 words of 6-bit
// scales and mins, then the 16 rows' d and dmin; Q6_K's 32 words of low nibbles, 16 of high bits and 4
// of 8-bit scales in the file's order, then the 16 d. The bytes are the file's, moved; a matrix whose
// rows are not a multiple of 16 has its last tile padded with zero rows.
constexpr int kTileRows = 16;

struct Chunk {
  size_t qh = 0, d = 0, m = 0, bytes = 0;  // offsets in a block's chunk (the quants at 0), its size
};

// The block's words that are interleaved, and where word w lies in the file's block.
constexpr int tile_words(DType t) { return t == DType::Q8_0 ? 8 : t == DType::Q4_K ? 35 : t == DType::Q6_K ? 52 : 4; }
constexpr size_t word_in_block(DType t, int w) {
  if (t == DType::Q4_K) return w < 32 ? 16 + 4 * size_t(w) : 4 + 4 * size_t(w - 32);
  return (t == DType::Q6_K ? 0 : qs_offset(t)) + 4 * size_t(w);
}
// A second fp16 per row (the min of Q4_1 and Q5_1, Q4_K's dmin) at byte 2 of the block, and the d's.
constexpr bool has_second_scale(DType t) { return has_min(t) || t == DType::Q4_K; }
constexpr size_t d_in_block(DType t) { return t == DType::Q6_K ? 208 : 0; }

constexpr Chunk chunk(DType t) {
  Chunk c;
  c.qh = size_t(tile_words(t)) * 4 * kTileRows;
  c.d = c.qh + (has_fifth_bit(t) ? 4 * kTileRows : 0);
  c.m = c.d + 2 * kTileRows;
  c.bytes = c.m + (has_second_scale(t) ? 2 * kTileRows : 0);
  return c;
}

int tile_count(int rows) { return (rows + kTileRows - 1) / kTileRows; }

// What a block's integer sum against unsigned values loses to the type's signed ones: Q4_0's and Q5_0's
// values are u - 8 and u - 16, Q8_0's stored ones w + 128; the products take offset x sum(q) back off.
constexpr int value_offset(DType t) {
  return t == DType::Q4_0 ? 8 : t == DType::Q5_0 ? 16 : t == DType::Q8_0 ? 128 : 0;
}

// Q5's fifth bits from the file's order (bit j for value j) to the tile's (bit 8i + k for value 4k + i), or
// back.
uint32_t reorder_fifth_bits(uint32_t bits, bool to_tile) {
  uint32_t out = 0;
  for (int k = 0; k < 8; ++k)
    for (int i = 0; i < 4; ++i) {
      const int file = 4 * k + i, tile = 8 * i + k;
      out |= (bits >> (to_tile ? file : tile) & 1u) << (to_tile ? tile : file);
    }
  return out;
}

// Row `lane` of a tile's block chunk from the file's block (ToTile: `from` the block, `to` the chunk) or
// back: the same fields, Q8_0's values with the sign bit flipped and Q5's fifth bits reordered on the way.
template <bool ToTile>
void move_block(DType t, const Chunk& ch, int lane, const uint8_t* from, uint8_t* to) {
  auto field = [&](size_t in_chunk, size_t in_block, size_t n) {
    uint8_t* dst = to + (ToTile ? in_chunk : in_block);
    std::memcpy(dst, from + (ToTile ? in_block : in_chunk), n);
    return dst;
  };
  for (int w = 0; w < tile_words(t); ++w) {
    uint8_t* q = field(size_t(64 * w + 4 * lane), word_in_block(t, w), 4);
    if (t == DType::Q8_0)
      for (int i = 0; i < 4; ++i) q[i] ^= 0x80;
  }
  if (has_fifth_bit(t)) {
    uint8_t* qh = field(ch.qh + 4 * size_t(lane), qh_offset(t), 4);
    uint32_t h;
    std::memcpy(&h, qh, 4);
    h = reorder_fifth_bits(h, ToTile);
    std::memcpy(qh, &h, 4);
  }
  field(ch.d + 2 * size_t(lane), d_in_block(t), 2);
  if (has_second_scale(t)) field(ch.m + 2 * size_t(lane), 2, 2);
}

// Asks for the weight bytes 4 KiB past the chunk about to be multiplied (within the matrix). A decode
// step multiplies some 200 matrices of 0.1-0.6 MiB once each, too short for the hardware prefetchers to
// run ahead: on the default model's shapes the GEMVs streamed 10-12 GB/s from memory on two cores of a
// Xeon whose read bandwidth measures 19-22, and 19-20 GB/s with this (1-8 KiB ahead measured alike).
constexpr size_t kPrefetchBytes = 4096;

inline void prefetch_ahead(const uint8_t* at, size_t bytes, const uint8_t* end) {
  for (size_t l = kPrefetchBytes; l < kPrefetchBytes + bytes; l += 64)
    if (at + l < end) _mm_prefetch(reinterpret_cast<const char*>(at + l), _MM_HINT_T0);
}

// A token's quantized activations as the tile kernels read them: reached through each Q8Row's vectors,
// every use in a block was a chain of loads (batch 8: 10% of the kernel's time).
// For the K-quants: q, d and bsums are the token's Q8_K row's; `pairs` holds Q4_K's four words a block of
// sums per 32 in 16-bit pairs (sub-blocks 2i and 2i + 1 in word i), against which its mins are weighted.
struct Q8Ptrs {
  const int8_t* q;
  const float *d, *s;
  const int32_t* qsum;
  const int16_t* bsums;
  const int32_t* pairs;
};

// One tile (`rows` <= 16 real rows) against nt tokens: ys[t][0..rows) = the tile's rows . token t. Every
// path computes each row the same way: per block, the exact integer sum s, then acc = fma(s, d d_x, acc)
// and, with a min, acc = fma(m, s_x, acc) (Q4_K: acc = fma(mins, -(dmin d_x), acc) with mins its exact
// sum_j m_j sum(q of sub-block j)); so all give the same numbers whatever the batch and the processor.
using TileFn = void (*)(DType t, const uint8_t* tile, int blocks, const Q8Ptrs* xs, int nt, float* const* ys, int rows,
                        const uint8_t* end);

void tile_portable(DType t, const uint8_t* tile, int blocks, const Q8Ptrs* xs, int nt, float* const* ys, int rows,
                   const uint8_t*) {
  const Chunk ch = chunk(t);
  uint8_t blk[210];
  for (int r = 0; r < rows; ++r) {
    float acc[8] = {};
    for (int b = 0; b < blocks; ++b) {
      move_block<false>(t, ch, r, tile + size_t(b) * ch.bytes, blk);
      for (int k = 0; k < nt; ++k) {
        const float dx = rdh(blk + d_in_block(t)) * xs[k].d[b];
        if (t == DType::Q6_K) {
          const int s = q6k_isum(blk, xs[k].q + size_t(b) * QKK, xs[k].bsums + size_t(b) * 16);
          acc[k] = std::fma(static_cast<float>(s), dx, acc[k]);
        } else if (t == DType::Q4_K) {
          int mins = 0;
          const int s = q4k_isum(blk, xs[k].q + size_t(b) * QKK, xs[k].bsums + size_t(b) * 16, mins);
          acc[k] = std::fma(static_cast<float>(s), dx, acc[k]);
          acc[k] = std::fma(static_cast<float>(mins), -(rdh(blk + 2) * xs[k].d[b]), acc[k]);
        } else {
          const int s = block_isum(t, blk + qs_offset(t), blk + qh_offset(t), xs[k].q + size_t(b) * QK);
          acc[k] = std::fma(static_cast<float>(s), dx, acc[k]);
          if (has_min(t)) acc[k] = std::fma(rdh(blk + 2), xs[k].s[b], acc[k]);
        }
      }
    }
    for (int k = 0; k < nt; ++k) ys[k][r] = acc[k];
  }
}

// vpshufb controls (the same in every 128-bit lane) that make each 32-bit lane of bytes b0..b3 of that lane
// (-1: a zero byte): the K-quants' 6- and 8-bit scales, packed four to a word per row, spread out per sub-block.
__m128i lane_bytes(int b0, int b1, int b2, int b3) {
  alignas(16) int8_t c[16];
  for (int l = 0; l < 4; ++l) {
    const int b[4] = {b0, b1, b2, b3};
    for (int i = 0; i < 4; ++i) c[4 * l + i] = static_cast<int8_t>(b[i] < 0 ? -128 : 4 * l + b[i]);
  }
  return _mm_load_si128(reinterpret_cast<const __m128i*>(c));
}

inline int32_t word_at(const void* q) {
  int32_t v;
  std::memcpy(&v, q, 4);
  return v;
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace gemv_avx2 {

// AVX2 has no VNNI: a tile is two halves of eight rows, and a word's products go through maddubs (16-bit
// pair sums) and madd. Q4's and Q5's pair sums stay below 2 x 31 x 127; Q8_0's unsigned values would
// saturate them, so its words are taken signed, |w| against q with w's sign (pairs up to 2 x 128 x 127).
constexpr int kMost = 4;

// A half tile's rows (those of the matrix) of each token's outputs.
template <int NT>
void store_half(const __m256 (&acc)[NT], float* const* ys, int half, int rows) {
  const int n = std::min(8, rows - 8 * half);
  const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(n), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
  for (int k = 0; k < NT; ++k) _mm256_maskstore_ps(ys[k] + 8 * half, lanes, acc[k]);
}

template <DType T, int NT>
void half_tile(const uint8_t* tile, int blocks, const Q8Ptrs* xs, float* const* ys, int half, int rows,
               const uint8_t* end) {
  constexpr Chunk ch = chunk(T);
  const __m256i ones16 = _mm256_set1_epi16(1), low4 = _mm256_set1_epi8(0x0F), bit4 = _mm256_set1_epi8(0x10),
                flip = _mm256_set1_epi8(static_cast<char>(0x80));
  __m256 acc[NT];
  for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* c = tile + size_t(b) * ch.bytes;
    if (half == 0) prefetch_ahead(c, ch.bytes, end);
    __m256i sum[NT];
    if constexpr (T == DType::Q8_0) {
      for (int k = 0; k < NT; ++k) sum[k] = _mm256_setzero_si256();
      for (int w = 0; w < tile_words(T); ++w) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * w + 32 * half));
        const __m256i sw = _mm256_xor_si256(raw, flip), aw = _mm256_sign_epi8(sw, sw);
        for (int k = 0; k < NT; ++k) {
          const __m256i q = _mm256_set1_epi32(word_at(xs[k].q + size_t(b) * QK + 4 * w));
          sum[k] =
              _mm256_add_epi32(sum[k], _mm256_madd_epi16(_mm256_maddubs_epi16(aw, _mm256_sign_epi8(q, sw)), ones16));
        }
      }
    } else {
      constexpr int W = tile_words(T);
      __m256i lo[W], hi[W];  // the block's values, unsigned: 4w..4w+3 in lo[w], 4w+16..4w+19 in hi[w]
      __m256i h = _mm256_setzero_si256();
      if constexpr (has_fifth_bit(T)) h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + ch.qh + 32 * half));
      for (int w = 0; w < W; ++w) {
        const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * w + 32 * half));
        lo[w] = _mm256_and_si256(raw, low4);
        hi[w] = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
        if constexpr (has_fifth_bit(T)) {
          // bit w (and w + 4) of each byte to bit 4
          lo[w] = _mm256_or_si256(lo[w], _mm256_and_si256(_mm256_sll_epi32(h, _mm_cvtsi32_si128(4 - w)), bit4));
          hi[w] = _mm256_or_si256(hi[w], w == 0 ? _mm256_and_si256(h, bit4)
                                                : _mm256_and_si256(_mm256_srl_epi32(h, _mm_cvtsi32_si128(w)), bit4));
        }
      }
      // Each token's 16-bit pair sums of `words16` words added before they are widened: a lane of them
      // holds 4 x words16 products of at most 15 x 128 (Q4) or 31 x 128 (Q5), inside 16 bits; the integer
      // sum is the same, with one widening a block (Q4) instead of one a word.
      constexpr int words16 = has_fifth_bit(T) ? 2 : 4;
      static_assert(W % words16 == 0);
      for (int k = 0; k < NT; ++k) {
        const int8_t* q = xs[k].q + size_t(b) * QK;
        for (int w0 = 0; w0 < W; w0 += words16) {
          __m256i pairs = _mm256_setzero_si256();
          for (int w = w0; w < w0 + words16; ++w)
            pairs = _mm256_add_epi16(
                pairs, _mm256_add_epi16(_mm256_maddubs_epi16(lo[w], _mm256_set1_epi32(word_at(q + 4 * w))),
                                        _mm256_maddubs_epi16(hi[w], _mm256_set1_epi32(word_at(q + 4 * w + 16)))));
          const __m256i wide = _mm256_madd_epi16(pairs, ones16);
          sum[k] = w0 == 0 ? wide : _mm256_add_epi32(sum[k], wide);
        }
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + ch.d + 16 * half)));
    __m256 m = _mm256_setzero_ps();
    if constexpr (has_min(T))
      m = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + ch.m + 16 * half)));
    for (int k = 0; k < NT; ++k) {
      __m256i s = sum[k];
      if constexpr (value_offset(T) != 0 && T != DType::Q8_0)
        s = _mm256_sub_epi32(s, _mm256_set1_epi32(value_offset(T) * xs[k].qsum[b]));
      acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(s), _mm256_mul_ps(d, _mm256_set1_ps(xs[k].d[b])), acc[k]);
      if constexpr (has_min(T)) acc[k] = _mm256_fmadd_ps(m, _mm256_set1_ps(xs[k].s[b]), acc[k]);
    }
  }
  store_half(acc, ys, half, rows);
}

// The K-quants on a half tile: vpdpbusd's sum of four byte products per lane, by maddubs and madd (Q6_K's
// pair sums reach 2 x 63 x 127, inside 16 bits).
inline __m256i dot4(__m256i acc, __m256i u, __m256i s) {
  return _mm256_add_epi32(acc, _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), _mm256_set1_epi16(1)));
}
inline __m256i shuffles(int b0, int b1, int b2, int b3) {
  return _mm256_broadcastsi128_si256(lane_bytes(b0, b1, b2, b3));
}
inline __m256i load_half(const uint8_t* c, int word, int half) {
  return _mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + 64 * word + 32 * half));
}

// Q4_K: per sub-block of 32 (its eight words' nibbles), each token's exact sum times the rows' 6-bit scales;
// the mins' share from the rows' mins in 16-bit pairs against the token's sums per 32 in pairs.
template <int NT>
void q4k_half(const uint8_t* tile, int blocks, const Q8Ptrs* xs, float* const* ys, int half, int rows,
              const uint8_t* end) {
  constexpr Chunk ch = chunk(DType::Q4_K);
  const __m256i low4 = _mm256_set1_epi8(0x0F), six = _mm256_set1_epi8(0x3F), top2 = _mm256_set1_epi8(0x30);
  __m256i byte_at[4], pair_at[2];
  for (int i = 0; i < 4; ++i) byte_at[i] = shuffles(i, -1, -1, -1);
  for (int p = 0; p < 2; ++p) pair_at[p] = shuffles(2 * p, -1, 2 * p + 1, -1);
  __m256 acc[NT];
  for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* c = tile + size_t(b) * ch.bytes;
    if (half == 0) prefetch_ahead(c, ch.bytes, end);
    // the 6-bit scales and mins as unpack_scales_mins_k4 takes them apart, a byte a sub-block
    const __m256i w0 = load_half(c, 32, half), w1 = load_half(c, 33, half), w2 = load_half(c, 34, half);
    const __m256i sc[2] = {
        _mm256_and_si256(w0, six),
        _mm256_or_si256(_mm256_and_si256(w2, low4), _mm256_and_si256(_mm256_srli_epi32(w0, 2), top2))};
    const __m256i mn[2] = {_mm256_and_si256(w1, six),
                           _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi32(w2, 4), low4),
                                           _mm256_and_si256(_mm256_srli_epi32(w1, 2), top2))};
    __m256i isum[NT];
    for (int k = 0; k < NT; ++k) isum[k] = _mm256_setzero_si256();
#pragma GCC unroll 8
    for (int j = 0; j < 8; ++j) {  // sub-block j: the low (j even) or high nibbles of words 8 (j / 2) ..
      const __m256i scale = _mm256_shuffle_epi8(sc[j / 4], byte_at[j % 4]);
      __m256i u[8];
      for (int w = 0; w < 8; ++w) {
        const __m256i raw = load_half(c, 8 * (j / 2) + w, half);
        u[w] = _mm256_and_si256(j % 2 ? _mm256_srli_epi16(raw, 4) : raw, low4);
      }
      for (int k = 0; k < NT; ++k) {
        const int8_t* q = xs[k].q + size_t(b) * QKK + 32 * j;
        __m256i s = _mm256_setzero_si256();
        for (int w = 0; w < 8; ++w) s = dot4(s, u[w], _mm256_set1_epi32(word_at(q + 4 * w)));
        isum[k] = _mm256_add_epi32(isum[k], _mm256_mullo_epi32(s, scale));
      }
    }
    __m256i mp[4];
    for (int i = 0; i < 4; ++i) mp[i] = _mm256_shuffle_epi8(mn[i / 2], pair_at[i % 2]);
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + ch.d + 16 * half)));
    const __m256 dm = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + ch.m + 16 * half)));
    for (int k = 0; k < NT; ++k) {
      __m256i mins = _mm256_setzero_si256();
      for (int i = 0; i < 4; ++i)
        mins = _mm256_add_epi32(mins, _mm256_madd_epi16(mp[i], _mm256_set1_epi32(xs[k].pairs[size_t(b) * 4 + i])));
      const __m256 xd = _mm256_set1_ps(xs[k].d[b]);
      acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[k]), _mm256_mul_ps(d, xd), acc[k]);
      acc[k] = _mm256_fnmadd_ps(_mm256_cvtepi32_ps(mins), _mm256_mul_ps(dm, xd), acc[k]);
    }
  }
  store_half(acc, ys, half, rows);
}

// Q6_K's values 4w..4w+3 (+ 32 r) of a half block from its low-nibble word l (word w, or w + 8 for odd r)
// and high-bit word h: the low (r < 2) or high nibbles, with bits 2r, 2r + 1 of h as bits 4-5.
inline __m256i q6k_values(int r, __m256i l, __m256i h) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), top2 = _mm256_set1_epi8(0x30);
  const __m256i lo = _mm256_and_si256(r < 2 ? l : _mm256_srli_epi16(l, 4), low4);
  const __m256i hb = r == 0   ? _mm256_slli_epi16(h, 4)
                     : r == 1 ? _mm256_slli_epi16(h, 2)
                     : r == 2 ? h
                              : _mm256_srli_epi16(h, 2);
  return _mm256_or_si256(lo, _mm256_and_si256(hb, top2));
}

// Q6_K: per sub-block of 16 (four words), each token's exact sum of the unsigned 6-bit values times the
// rows' 8-bit scales; the -32 of every value from the scales in 16-bit pairs against the token's sums per 16.
template <int NT>
void q6k_half(const uint8_t* tile, int blocks, const Q8Ptrs* xs, float* const* ys, int half, int rows,
              const uint8_t* end) {
  constexpr Chunk ch = chunk(DType::Q6_K);
  __m256i top_byte[4], sc_pair[2];
  for (int i = 0; i < 4; ++i) top_byte[i] = shuffles(-1, -1, -1, i);
  for (int p = 0; p < 2; ++p) sc_pair[p] = shuffles(-1, 2 * p, -1, 2 * p + 1);
  __m256 acc[NT];
  for (int k = 0; k < NT; ++k) acc[k] = _mm256_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* c = tile + size_t(b) * ch.bytes;
    if (half == 0) prefetch_ahead(c, ch.bytes, end);
    __m256i scw[4];
    for (int i = 0; i < 4; ++i) scw[i] = load_half(c, 48 + i, half);
    __m256i pairs[8];  // scales 2p and 2p + 1, sign-extended to 16 bits
    for (int p = 0; p < 8; ++p) pairs[p] = _mm256_srai_epi16(_mm256_shuffle_epi8(scw[p / 2], sc_pair[p % 2]), 8);
    __m256i isum[NT];
    for (int k = 0; k < NT; ++k) {
      __m256i off = _mm256_setzero_si256();
      for (int p = 0; p < 8; ++p) {
        off = _mm256_add_epi32(
            off, _mm256_madd_epi16(pairs[p], _mm256_set1_epi32(word_at(xs[k].bsums + size_t(b) * 16 + 2 * p))));
      }
      isum[k] = _mm256_sub_epi32(_mm256_setzero_si256(), _mm256_slli_epi32(off, 5));
    }
#pragma GCC unroll 16
    for (int sb = 0; sb < 16; ++sb) {  // sub-block sb = 8 hb + 2 r + wq: values 128 hb + 32 r + 16 wq ..
      const int hb = sb / 8, r = (sb % 8) / 2, wq = sb % 2;
      const __m256i scale = _mm256_srai_epi32(_mm256_shuffle_epi8(scw[sb / 4], top_byte[sb % 4]), 24);
      __m256i u[4];
      for (int i = 0; i < 4; ++i) {
        const int w = 4 * wq + i;
        u[i] = q6k_values(r, load_half(c, 16 * hb + w + 8 * (r % 2), half), load_half(c, 32 + 8 * hb + w, half));
      }
      for (int k = 0; k < NT; ++k) {
        const int8_t* q = xs[k].q + size_t(b) * QKK + 16 * sb;
        __m256i s = _mm256_setzero_si256();
        for (int i = 0; i < 4; ++i) s = dot4(s, u[i], _mm256_set1_epi32(word_at(q + 4 * i)));
        isum[k] = _mm256_add_epi32(isum[k], _mm256_mullo_epi32(s, scale));
      }
    }
    const __m256 d = _mm256_cvtph_ps(_mm_loadu_si128(reinterpret_cast<const __m128i*>(c + ch.d + 16 * half)));
    for (int k = 0; k < NT; ++k)
      acc[k] = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum[k]), _mm256_mul_ps(d, _mm256_set1_ps(xs[k].d[b])), acc[k]);
  }
  store_half(acc, ys, half, rows);
}

template <DType T, int NT>
void half_of(const uint8_t* tile, int blocks, const Q8Ptrs* xs, float* const* ys, int half, int rows,
             const uint8_t* end) {
  if constexpr (T == DType::Q4_K)
    q4k_half<NT>(tile, blocks, xs, ys, half, rows, end);
  else if constexpr (T == DType::Q6_K)
    q6k_half<NT>(tile, blocks, xs, ys, half, rows, end);
  else
    half_tile<T, NT>(tile, blocks, xs, ys, half, rows, end);
}

template <DType T>
void tile(DType, const uint8_t* tile, int blocks, const Q8Ptrs* xs, int nt, float* const* ys, int rows,
          const uint8_t* end) {
  for (int half = 0; half < (rows > 8 ? 2 : 1); ++half) switch (nt) {
      case 4:
        half_of<T, 4>(tile, blocks, xs, ys, half, rows, end);
        break;
      case 3:
        half_of<T, 3>(tile, blocks, xs, ys, half, rows, end);
        break;
      case 2:
        half_of<T, 2>(tile, blocks, xs, ys, half, rows, end);
        break;
      default:
        half_of<T, 1>(tile, blocks, xs, ys, half, rows, end);
    }
}

}  // namespace gemv_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
// The 512-bit conversions' _mm512_undefined_ps makes GCC 12 report -Wmaybe-uninitialized in every
// caller (GCC PR105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"
namespace gemv_avx512 {

// 32 registers: the block's eight unpacked words and the accumulators of eight tokens.
constexpr int kMost = 8;

template <DType T, int NT>
void tile_tokens(const uint8_t* tile, int blocks, const Q8Ptrs* xs, float* const* ys, int rows, const uint8_t* end) {
  constexpr Chunk ch = chunk(T);
  const __m512i low4 = _mm512_set1_epi8(0x0F), bit4 = _mm512_set1_epi8(0x10);
  __m512 acc[NT];
  for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* c = tile + size_t(b) * ch.bytes;
    prefetch_ahead(c, ch.bytes, end);
    __m512i u[8];  // values 4j..4j+3 of the 16 rows in u[j], unsigned
    if constexpr (T == DType::Q8_0) {
      for (int j = 0; j < 8; ++j) u[j] = _mm512_loadu_si512(c + 64 * j);
    } else {
      for (int w = 0; w < 4; ++w) {
        const __m512i raw = _mm512_loadu_si512(c + 64 * w);
        u[w] = _mm512_and_si512(raw, low4);
        u[w + 4] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      }
      if constexpr (has_fifth_bit(T)) {
        const __m512i h = _mm512_loadu_si512(c + ch.qh);
        for (int j = 0; j < 8; ++j) {
          const __m512i at4 =
              j <= 4 ? _mm512_sll_epi32(h, _mm_cvtsi32_si128(4 - j)) : _mm512_srl_epi32(h, _mm_cvtsi32_si128(j - 4));
          u[j] = _mm512_or_si512(u[j], _mm512_and_si512(at4, bit4));
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + ch.d)));
    __m512 m = _mm512_setzero_ps();
    if constexpr (has_min(T)) m = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + ch.m)));
    for (int k = 0; k < NT; ++k) {
      const int8_t* q = xs[k].q + size_t(b) * QK;
      // two chains: an integer sum is the same in any order
      __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
      for (int j = 0; j < 8; j += 2) {
        s0 = _mm512_dpbusd_epi32(s0, u[j], _mm512_set1_epi32(word_at(q + 4 * j)));
        s1 = _mm512_dpbusd_epi32(s1, u[j + 1], _mm512_set1_epi32(word_at(q + 4 * j + 4)));
      }
      __m512i s = _mm512_add_epi32(s0, s1);
      if constexpr (value_offset(T) != 0) s = _mm512_sub_epi32(s, _mm512_set1_epi32(value_offset(T) * xs[k].qsum[b]));
      acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(s), _mm512_mul_ps(d, _mm512_set1_ps(xs[k].d[b])), acc[k]);
      if constexpr (has_min(T)) acc[k] = _mm512_fmadd_ps(m, _mm512_set1_ps(xs[k].s[b]), acc[k]);
    }
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
  for (int k = 0; k < NT; ++k) _mm512_mask_storeu_ps(ys[k], keep, acc[k]);
}

// The K-quants as gemv_avx2's q4k_half and q6k_half take them, on all 16 rows with VNNI's byte and word products.
inline __m512i shuffles(int b0, int b1, int b2, int b3) { return _mm512_broadcast_i32x4(lane_bytes(b0, b1, b2, b3)); }
inline __m512i load_word(const uint8_t* c, int word) { return _mm512_loadu_si512(c + 64 * word); }

template <int NT>
void q4k_tokens(const uint8_t* tile, int blocks, const Q8Ptrs* xs, float* const* ys, int rows, const uint8_t* end) {
  constexpr Chunk ch = chunk(DType::Q4_K);
  const __m512i low4 = _mm512_set1_epi8(0x0F), six = _mm512_set1_epi8(0x3F), top2 = _mm512_set1_epi8(0x30);
  __m512i byte_at[4], pair_at[2];
  for (int i = 0; i < 4; ++i) byte_at[i] = shuffles(i, -1, -1, -1);
  for (int p = 0; p < 2; ++p) pair_at[p] = shuffles(2 * p, -1, 2 * p + 1, -1);
  __m512 acc[NT];
  for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* c = tile + size_t(b) * ch.bytes;
    prefetch_ahead(c, ch.bytes, end);
    const __m512i w0 = load_word(c, 32), w1 = load_word(c, 33), w2 = load_word(c, 34);
    const __m512i sc[2] = {
        _mm512_and_si512(w0, six),
        _mm512_or_si512(_mm512_and_si512(w2, low4), _mm512_and_si512(_mm512_srli_epi32(w0, 2), top2))};
    const __m512i mn[2] = {_mm512_and_si512(w1, six),
                           _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi32(w2, 4), low4),
                                           _mm512_and_si512(_mm512_srli_epi32(w1, 2), top2))};
    __m512i isum[NT];
    for (int k = 0; k < NT; ++k) isum[k] = _mm512_setzero_si512();
#pragma GCC unroll 4
    for (int cc = 0; cc < 4; ++cc) {  // sub-blocks 2 cc (low nibbles of words 8 cc ..) and 2 cc + 1 (high)
      const __m512i scale_lo = _mm512_shuffle_epi8(sc[cc / 2], byte_at[(2 * cc) % 4]),
                    scale_hi = _mm512_shuffle_epi8(sc[cc / 2], byte_at[(2 * cc + 1) % 4]);
      __m512i lo[8], hi[8];
      for (int w = 0; w < 8; ++w) {
        const __m512i raw = load_word(c, 8 * cc + w);
        lo[w] = _mm512_and_si512(raw, low4);
        hi[w] = _mm512_and_si512(_mm512_srli_epi16(raw, 4), low4);
      }
      for (int k = 0; k < NT; ++k) {
        const int8_t* q = xs[k].q + size_t(b) * QKK + 64 * cc;
        __m512i s0 = _mm512_setzero_si512(), s1 = _mm512_setzero_si512();
        for (int w = 0; w < 8; ++w) {
          s0 = _mm512_dpbusd_epi32(s0, lo[w], _mm512_set1_epi32(word_at(q + 4 * w)));
          s1 = _mm512_dpbusd_epi32(s1, hi[w], _mm512_set1_epi32(word_at(q + 32 + 4 * w)));
        }
        isum[k] = _mm512_add_epi32(
            isum[k], _mm512_add_epi32(_mm512_mullo_epi32(s0, scale_lo), _mm512_mullo_epi32(s1, scale_hi)));
      }
    }
    __m512i mp[4];
    for (int i = 0; i < 4; ++i) mp[i] = _mm512_shuffle_epi8(mn[i / 2], pair_at[i % 2]);
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + ch.d)));
    const __m512 dm = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + ch.m)));
    for (int k = 0; k < NT; ++k) {
      __m512i mins = _mm512_setzero_si512();
      for (int i = 0; i < 4; ++i)
        mins = _mm512_dpwssd_epi32(mins, mp[i], _mm512_set1_epi32(xs[k].pairs[size_t(b) * 4 + i]));
      const __m512 xd = _mm512_set1_ps(xs[k].d[b]);
      acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[k]), _mm512_mul_ps(d, xd), acc[k]);
      acc[k] = _mm512_fnmadd_ps(_mm512_cvtepi32_ps(mins), _mm512_mul_ps(dm, xd), acc[k]);
    }
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
  for (int k = 0; k < NT; ++k) _mm512_mask_storeu_ps(ys[k], keep, acc[k]);
}

template <int NT>
void q6k_tokens(const uint8_t* tile, int blocks, const Q8Ptrs* xs, float* const* ys, int rows, const uint8_t* end) {
  constexpr Chunk ch = chunk(DType::Q6_K);
  const __m512i low4 = _mm512_set1_epi8(0x0F), top2 = _mm512_set1_epi8(0x30);
  __m512i top_byte[4], sc_pair[2];
  for (int i = 0; i < 4; ++i) top_byte[i] = shuffles(-1, -1, -1, i);
  for (int p = 0; p < 2; ++p) sc_pair[p] = shuffles(-1, 2 * p, -1, 2 * p + 1);
  __m512 acc[NT];
  for (int k = 0; k < NT; ++k) acc[k] = _mm512_setzero_ps();
  for (int b = 0; b < blocks; ++b) {
    const uint8_t* c = tile + size_t(b) * ch.bytes;
    prefetch_ahead(c, ch.bytes, end);
    __m512i scw[4];
    for (int i = 0; i < 4; ++i) scw[i] = load_word(c, 48 + i);
    __m512i pairs[8];  // scales 2p and 2p + 1, sign-extended to 16 bits
    for (int p = 0; p < 8; ++p) pairs[p] = _mm512_srai_epi16(_mm512_shuffle_epi8(scw[p / 2], sc_pair[p % 2]), 8);
    __m512i isum[NT];
    for (int k = 0; k < NT; ++k) {
      __m512i off = _mm512_setzero_si512();
      for (int p = 0; p < 8; ++p) {
        off = _mm512_dpwssd_epi32(off, pairs[p], _mm512_set1_epi32(word_at(xs[k].bsums + size_t(b) * 16 + 2 * p)));
      }
      isum[k] = _mm512_sub_epi32(_mm512_setzero_si512(), _mm512_slli_epi32(off, 5));
    }
#pragma GCC unroll 4
    for (int part = 0; part < 4; ++part) {  // half hb of the block, words 4 wq .. 4 wq + 3 of its 8 of each kind
      const int hb = part / 2, wq = part % 2;
      __m512i u[4][4];  // [r][i]: values 128 hb + 32 r + 4 (4 wq + i) .., sub-block 8 hb + 2 r + wq
      for (int i = 0; i < 4; ++i) {
        const int w = 4 * wq + i;
        const __m512i l0 = load_word(c, 16 * hb + w), l1 = load_word(c, 16 * hb + w + 8),
                      h = load_word(c, 32 + 8 * hb + w);
        u[0][i] = _mm512_or_si512(_mm512_and_si512(l0, low4), _mm512_and_si512(_mm512_slli_epi16(h, 4), top2));
        u[1][i] = _mm512_or_si512(_mm512_and_si512(l1, low4), _mm512_and_si512(_mm512_slli_epi16(h, 2), top2));
        u[2][i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l0, 4), low4), _mm512_and_si512(h, top2));
        u[3][i] = _mm512_or_si512(_mm512_and_si512(_mm512_srli_epi16(l1, 4), low4),
                                  _mm512_and_si512(_mm512_srli_epi16(h, 2), top2));
      }
      __m512i scale[4];
      for (int r = 0; r < 4; ++r) {
        const int sb = 8 * hb + 2 * r + wq;
        scale[r] = _mm512_srai_epi32(_mm512_shuffle_epi8(scw[sb / 4], top_byte[sb % 4]), 24);
      }
      for (int k = 0; k < NT; ++k) {
        const int8_t* q = xs[k].q + size_t(b) * QKK + 128 * hb + 16 * wq;
        for (int r = 0; r < 4; ++r) {
          __m512i s = _mm512_setzero_si512();
          for (int i = 0; i < 4; ++i)
            s = _mm512_dpbusd_epi32(s, u[r][i], _mm512_set1_epi32(word_at(q + 32 * r + 4 * i)));
          isum[k] = _mm512_add_epi32(isum[k], _mm512_mullo_epi32(s, scale[r]));
        }
      }
    }
    const __m512 d = _mm512_cvtph_ps(_mm256_loadu_si256(reinterpret_cast<const __m256i*>(c + ch.d)));
    for (int k = 0; k < NT; ++k)
      acc[k] = _mm512_fmadd_ps(_mm512_cvtepi32_ps(isum[k]), _mm512_mul_ps(d, _mm512_set1_ps(xs[k].d[b])), acc[k]);
  }
  const __mmask16 keep = static_cast<__mmask16>((1u << rows) - 1);
  for (int k = 0; k < NT; ++k) _mm512_mask_storeu_ps(ys[k], keep, acc[k]);
}

template <DType T, int NT>
void tokens_of(const uint8_t* tile, int blocks, const Q8Ptrs* xs, float* const* ys, int rows, const uint8_t* end) {
  if constexpr (T == DType::Q4_K)
    q4k_tokens<NT>(tile, blocks, xs, ys, rows, end);
  else if constexpr (T == DType::Q6_K)
    q6k_tokens<NT>(tile, blocks, xs, ys, rows, end);
  else
    tile_tokens<T, NT>(tile, blocks, xs, ys, rows, end);
}

template <DType T>
void tile(DType, const uint8_t* tile, int blocks, const Q8Ptrs* xs, int nt, float* const* ys, int rows,
          const uint8_t* end) {
  switch (nt) {
    case 8:
      return tokens_of<T, 8>(tile, blocks, xs, ys, rows, end);
    case 4:
      return tokens_of<T, 4>(tile, blocks, xs, ys, rows, end);
    case 3:
      return tokens_of<T, 3>(tile, blocks, xs, ys, rows, end);
    case 2:
      return tokens_of<T, 2>(tile, blocks, xs, ys, rows, end);
    default:
      return tokens_of<T, 1>(tile, blocks, xs, ys, rows, end);
  }
}

}  // namespace gemv_avx512
#pragma GCC diagnostic pop
#pragma GCC pop_options

// A tile kernel for a type on this processor, and the most tokens it takes at once.
struct TileKernel {
  TileFn fn;
  int most;
};

// AVX-512 with the byte and word dot products (VNNI), and not held at AVX2.
bool has_vnni512() {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  return vnni && cpu_has_avx512();
}

template <DType T>
TileKernel tile_kernel_of() {
  if (!cpu_has_avx2()) return {tile_portable, 8};
  if (has_vnni512()) return {gemv_avx512::tile<T>, gemv_avx512::kMost};
  return {gemv_avx2::tile<T>, gemv_avx2::kMost};
}

TileKernel tile_kernel(DType t) {
  switch (t) {
    case DType::Q4_1:
      return tile_kernel_of<DType::Q4_1>();
    case DType::Q5_0:
      return tile_kernel_of<DType::Q5_0>();
    case DType::Q5_1:
      return tile_kernel_of<DType::Q5_1>();
    case DType::Q8_0:
      return tile_kernel_of<DType::Q8_0>();
    case DType::Q4_K:
      return tile_kernel_of<DType::Q4_K>();
    case DType::Q6_K:
      return tile_kernel_of<DType::Q6_K>();
    default:
      return tile_kernel_of<DType::Q4_0>();
  }
}

// Products of the same n tokens: the tokens quantized (per 32 for the 32-value types, per 256 for the
// K-quants), then y[b, o] for every product, token b and row o, all the products' tiles over the threads in
// one parallel region, each tile against the tokens in groups of up to its kernel's most while it is in
// cache (a batch's weights read from memory once per step).
void gemv_shared(std::span<const QuantProduct> ps, const float* x, int n, int in) {
  struct Job {
    TileKernel k;
    int blocks;
    size_t tile_bytes;
    const uint8_t* end;  // of the product's tiles (prefetches stop there)
    int first;           // its first tile in the region's numbering
  };
  // Kept from call to call with their buffers: a decode step makes some two hundred of these calls.
  static thread_local std::vector<Job> jobs;
  jobs.clear();
  int total = 0;
  bool blocks32 = false, kquants = false;
  for (const QuantProduct& p : ps) {
    const int tiles = tile_count(p.out), blocks = in / dtype_info(p.t).block_elems;
    const size_t tile_bytes = size_t(blocks) * chunk(p.t).bytes;
    jobs.push_back({tile_kernel(p.t), blocks, tile_bytes, p.w + size_t(tiles) * tile_bytes, total});
    total += tiles;
    (is_kquant(p.t) ? kquants : blocks32) = true;
  }
  const size_t pairs_per_token = size_t(in / QKK) * 4;
  // The tokens quantized into a thread's own rows (thread_local: the pool's threads persist).
  struct Quantized {
    std::vector<Q8Row> xs;
    std::vector<Q8KRow> xk;
    std::vector<int32_t> pairs;
  };
  const auto fit = [&](Quantized& q) {
    if (blocks32 && q.xs.size() < size_t(n)) q.xs.resize(size_t(n));
    if (kquants && q.xk.size() < size_t(n)) q.xk.resize(size_t(n));
    if (kquants && q.pairs.size() < size_t(n) * pairs_per_token) q.pairs.resize(size_t(n) * pairs_per_token);
  };
  const auto quantize = [&](Quantized& q, int b) {
    if (blocks32) quantize_row_q8(x + size_t(b) * in, in, q.xs[size_t(b)]);
    if (!kquants) return;
    quantize_row_q8_k(x + size_t(b) * in, in, q.xk[size_t(b)]);
    const int16_t* bs = q.xk[size_t(b)].bsums.data();
    int32_t* out = q.pairs.data() + size_t(b) * pairs_per_token;
    for (size_t i = 0; i < pairs_per_token; ++i) {
      const auto lo = static_cast<uint16_t>(bs[4 * i] + bs[4 * i + 1]);
      const auto hi = static_cast<uint16_t>(bs[4 * i + 2] + bs[4 * i + 3]);
      out[i] = static_cast<int32_t>(uint32_t(lo) | uint32_t(hi) << 16);
    }
  };
  static thread_local Quantized shared;
  // Fewer tokens than threads (one sequence decoding): every thread quantizes them all into its own
  // rows, the same numbers, and starts on its tiles without waiting for a barrier.
  const bool each_own = n < omp_get_max_threads();
  if (!each_own) fit(shared);
  // The caller's thread_local objects, reached in the region through pointers (a thread_local named
  // there is the executing thread's own).
  Quantized* const common = &shared;
  const Job* const job_list = jobs.data();
  const size_t job_count = jobs.size();
#pragma omp parallel
  {
    Quantized* mine = common;
    if (each_own) {
      static thread_local Quantized own;
      mine = &own;
      fit(own);
      for (int b = 0; b < n; ++b) quantize(own, b);
    } else {
      // A batch's tokens apart on the threads: one thread quantizing all of them left the other waiting.
#pragma omp for schedule(static)
      for (int b = 0; b < n; ++b) quantize(*mine, b);
    }
    const Q8Row* const xs = mine->xs.data();
    const Q8KRow* const xk = mine->xk.data();
    int32_t* const pairs = mine->pairs.data();
    // nowait: the region's end is the barrier.
#pragma omp for schedule(static) nowait
    for (int i = 0; i < total; ++i) {
      size_t j = job_count - 1;
      while (job_list[j].first > i) --j;
      const QuantProduct& p = ps[j];
      const Job& job = job_list[j];
      const bool k_type = is_kquant(p.t);
      const int tile = i - job.first, rows = std::min(kTileRows, p.out - tile * kTileRows);
      for (int b = 0; b < n;) {
        const int nt = n - b >= job.k.most ? job.k.most : std::min(4, n - b);
        // Set up per tile on the thread's own stack: one array of them for the whole call, filled as the
        // tokens were quantized, made batch 8 5-10% slower (three alternating rounds).
        Q8Ptrs group[8];
        float* ys[8];
        for (int k = 0; k < nt; ++k) {
          if (k_type) {
            const Q8KRow& row = xk[b + k];
            group[k] = {row.q.data(), row.d.data(),     nullptr,
                        nullptr,      row.bsums.data(), pairs + size_t(b + k) * pairs_per_token};
          } else {
            const Q8Row& row = xs[b + k];
            group[k] = {row.q.data(), row.d.data(), row.s.data(), row.qsum.data(), nullptr, nullptr};
          }
          ys[k] = p.y + size_t(b + k) * size_t(p.out) + size_t(tile) * kTileRows;
        }
        job.k.fn(p.t, p.w + size_t(tile) * job.tile_bytes, job.blocks, group, nt, ys, rows, job.end);
        b += nt;
      }
    }
  }
}

}  // namespace

bool linear_quant_supports(DType t) {
  return t == DType::Q4_0 || t == DType::Q4_1 || t == DType::Q5_0 || t == DType::Q5_1 || t == DType::Q8_0 ||
         t == DType::Q4_K || t == DType::Q6_K;
}

void quantize_row_q8_k(const float* x, int n, Q8KRow& out) {
  const int blocks = n / QKK;
  out.d.assign(size_t(blocks), 0.0f);
  out.q.assign(size_t(n), 0);
  out.bsums.assign(size_t(blocks) * 16, 0);
  // ggml's nearest_int: round half to even through the float mantissa (|v| < 2^22).
  auto nearest = [](float v) {
    const float f = v + 12582912.0f;
    int32_t i;
    std::memcpy(&i, &f, 4);
    return (i & 0x007fffff) - 0x00400000;
  };
  for (int i = 0; i < blocks; ++i) {
    const float* xb = x + size_t(i) * QKK;
    float amax = 0, max = 0;
    for (int j = 0; j < QKK; ++j)
      if (std::fabs(xb[j]) > amax) {
        amax = std::fabs(xb[j]);
        max = xb[j];
      }
    if (amax == 0.0f) continue;
    const float iscale = -127.0f / max;
    int8_t* q = out.q.data() + size_t(i) * QKK;
    for (int j = 0; j < QKK; ++j) q[j] = static_cast<int8_t>(std::min(127, nearest(iscale * xb[j])));
    for (int j = 0; j < 16; ++j) {
      int sum = 0;
      for (int l = 0; l < 16; ++l) sum += q[16 * j + l];
      out.bsums[size_t(i) * 16 + j] = static_cast<int16_t>(sum);
    }
    out.d[i] = 1.0f / iscale;
  }
}

void gemv_kquant_ref(DType t, const uint8_t* w, const Q8KRow& x, int in, int out, float* y) {
  const int blocks = in / QKK;
  const size_t bb = block_bytes(t);
  for (int o = 0; o < out; ++o) {
    double acc = 0;
    for (int i = 0; i < blocks; ++i) {
      const uint8_t* b = w + (size_t(o) * blocks + i) * bb;
      const int8_t* q = x.q.data() + size_t(i) * QKK;
      const int16_t* bs = x.bsums.data() + size_t(i) * 16;
      if (t == DType::Q6_K) {
        acc += double(rdh(b + 208)) * x.d[i] * q6k_isum(b, q, bs);
      } else {
        int mins = 0;
        const int isum = q4k_isum(b, q, bs, mins);
        acc += double(rdh(b)) * x.d[i] * isum - double(rdh(b + 2)) * x.d[i] * mins;
      }
    }
    y[o] = static_cast<float>(acc);
  }
}

namespace {

// One block's scale from its largest magnitude, and its stored d and s (fp16-rounded, as ggml keeps them).
void finish_block(float d, int sum, Q8Row& out, int i) {
  out.qsum[i] = sum;
  out.d[i] = half_to_float(float_to_half(d));
  out.s[i] = half_to_float(float_to_half(static_cast<float>(sum) * d));
}

void quantize_row_q8_portable(const float* x, int blocks, Q8Row& out) {
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
    finish_block(d, sum, out, i);
  }
}

// The same on eight lanes: the same products x id and std::round's halves away from zero, taken as the
// integer part plus one away from zero where the fraction (exact) is at least a half. std::round is a
// library call per value here, which made quantizing 7% of a batch-8 decode step.
__attribute__((target("avx2,fma,f16c"))) void quantize_row_q8_avx2(const float* x, int blocks, Q8Row& out) {
  const __m256 abs_mask = _mm256_castsi256_ps(_mm256_set1_epi32(0x7fffffff)), half = _mm256_set1_ps(0.5f),
               one = _mm256_set1_ps(1.0f);
  for (int i = 0; i < blocks; ++i) {
    const float* xb = x + size_t(i) * QK;
    __m256 v[4];
    __m256 amax = _mm256_setzero_ps();
    for (int k = 0; k < 4; ++k) {
      v[k] = _mm256_loadu_ps(xb + 8 * k);
      amax = _mm256_max_ps(_mm256_and_ps(v[k], abs_mask), amax);  // a NaN left out, as std::max does
    }
    __m128 m4 = _mm_max_ps(_mm256_castps256_ps128(amax), _mm256_extractf128_ps(amax, 1));
    m4 = _mm_max_ps(m4, _mm_movehl_ps(m4, m4));
    const float d = _mm_cvtss_f32(_mm_max_ss(m4, _mm_movehdup_ps(m4))) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m256i q32[4];
    __m256i sum = _mm256_setzero_si256();
    for (int k = 0; k < 4; ++k) {
      const __m256 y = _mm256_mul_ps(v[k], _mm256_set1_ps(id));
      const __m256 whole = _mm256_round_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __m256 up = _mm256_cmp_ps(_mm256_and_ps(_mm256_sub_ps(y, whole), abs_mask), half, _CMP_GE_OQ);
      const __m256 away = _mm256_or_ps(_mm256_and_ps(one, up), _mm256_andnot_ps(abs_mask, y));  // +-1 or +-0
      q32[k] = _mm256_cvttps_epi32(_mm256_add_ps(whole, away));
      sum = _mm256_add_epi32(sum, q32[k]);
    }
    // int32 -> int8 in order: the packs interleave 128-bit lanes, the permute puts them back
    const __m256i q16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q32[0], q32[1]), 0xD8),
                  r16 = _mm256_permute4x64_epi64(_mm256_packs_epi32(q32[2], q32[3]), 0xD8);
    const __m256i q8 = _mm256_permute4x64_epi64(_mm256_packs_epi16(q16, r16), 0xD8);
    _mm256_storeu_si256(reinterpret_cast<__m256i*>(out.q.data() + size_t(i) * QK), q8);
    __m128i s4 = _mm_add_epi32(_mm256_castsi256_si128(sum), _mm256_extracti128_si256(sum, 1));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0x4E));
    s4 = _mm_add_epi32(s4, _mm_shuffle_epi32(s4, 0xB1));
    finish_block(d, _mm_cvtsi128_si32(s4), out, i);
  }
}

// The same on 16 lanes: a block in two registers, the rounding's +-1 added under a mask, the bytes
// narrowed with signed saturation as the AVX2 packs do (a NaN or infinite input's lanes give -128 there too).
#pragma GCC push_options
#pragma GCC target("avx512f,avx2,fma,f16c")
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
void quantize_row_q8_avx512(const float* x, int blocks, Q8Row& out) {
  const __m512 half = _mm512_set1_ps(0.5f);
  const __m512i one = _mm512_set1_epi32(0x3f800000), sign = _mm512_set1_epi32(static_cast<int>(0x80000000u));
  for (int i = 0; i < blocks; ++i) {
    const float* xb = x + size_t(i) * QK;
    const __m512 v[2] = {_mm512_loadu_ps(xb), _mm512_loadu_ps(xb + 16)};
    __m512 amax = _mm512_setzero_ps();
    for (int k = 0; k < 2; ++k) amax = _mm512_max_ps(_mm512_abs_ps(v[k]), amax);  // NaN left out
    const float d = _mm512_reduce_max_ps(amax) / 127.0f, id = d != 0.0f ? 1.0f / d : 0.0f;
    __m512i sum = _mm512_setzero_si512();
    for (int k = 0; k < 2; ++k) {
      const __m512 y = _mm512_mul_ps(v[k], _mm512_set1_ps(id));
      const __m512 whole = _mm512_roundscale_ps(y, _MM_FROUND_TO_ZERO | _MM_FROUND_NO_EXC);
      const __mmask16 up = _mm512_cmp_ps_mask(_mm512_abs_ps(_mm512_sub_ps(y, whole)), half, _CMP_GE_OQ);
      const __m512 away =
          _mm512_castsi512_ps(_mm512_or_si512(one, _mm512_and_si512(sign, _mm512_castps_si512(y))));  // +-1
      const __m512i q = _mm512_cvttps_epi32(_mm512_mask_add_ps(whole, up, whole, away));
      sum = _mm512_add_epi32(sum, q);
      _mm_storeu_si128(reinterpret_cast<__m128i*>(out.q.data() + size_t(i) * QK + 16 * k), _mm512_cvtsepi32_epi8(q));
    }
    // finish_block's rounding by F16C (nearest even; the only NaN s can be, inf x 0, gives the same half):
    // 227 -> 162 ns for a row of 576 here, where in the AVX2 loop it measured slower than the bit steps
    const int total = _mm512_reduce_add_epi32(sum);
    out.qsum[i] = total;
    out.d[i] = _cvtsh_ss(_cvtss_sh(d, _MM_FROUND_TO_NEAREST_INT));
    out.s[i] = _cvtsh_ss(_cvtss_sh(static_cast<float>(total) * d, _MM_FROUND_TO_NEAREST_INT));
  }
}
#pragma GCC diagnostic pop
#pragma GCC pop_options

}  // namespace

void quantize_row_q8(const float* x, int n, Q8Row& out) {
  const int blocks = n / QK;
  out.d.resize(blocks);
  out.s.resize(blocks);
  out.qsum.resize(blocks);
  out.q.resize(size_t(n));
  if (cpu_has_avx512())
    quantize_row_q8_avx512(x, blocks, out);
  else if (cpu_has_avx2())
    quantize_row_q8_avx2(x, blocks, out);
  else
    quantize_row_q8_portable(x, blocks, out);
}

void gemv_quant_ref(DType t, const uint8_t* w, const Q8Row& x, int in, int out, float* y) {
  const int blocks = in / QK;
  const size_t bb = block_bytes(t);
  for (int o = 0; o < out; ++o) {
    double acc = 0;
    for (int i = 0; i < blocks; ++i) {
      const uint8_t* b = w + (size_t(o) * blocks + i) * bb;
      acc += double(rdh(b)) * x.d[i] * block_isum(t, b + qs_offset(t), b + qh_offset(t), x.q.data() + size_t(i) * QK);
      if (has_min(t)) acc += double(rdh(b + 2)) * x.s[i];
    }
    y[o] = static_cast<float>(acc);
  }
}

size_t stored_bytes(DType t, int rows, int cols) {
  return size_t(tile_count(rows)) * size_t(cols / dtype_info(t).block_elems) * chunk(t).bytes;
}

void store_rows(DType t, const uint8_t* blocks, int rows, int cols, uint8_t* dst) {
  std::memset(dst, 0, stored_bytes(t, rows, cols));  // the last tile's padding rows
  const Chunk ch = chunk(t);
  const int nb = cols / dtype_info(t).block_elems;
  const size_t bb = block_bytes(t);
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int r = 0; r < rows; ++r)
    for (int b = 0; b < nb; ++b)
      move_block<true>(t, ch, r % kTileRows, blocks + (size_t(r) * nb + b) * bb,
                       dst + (size_t(r / kTileRows) * nb + b) * ch.bytes);
}

void load_rows(DType t, const uint8_t* stored, int r0, int rows, int cols, uint8_t* blocks) {
  const Chunk ch = chunk(t);
  const int nb = cols / dtype_info(t).block_elems;
  const size_t bb = block_bytes(t);
#pragma omp parallel for schedule(static) if (rows > 64)
  for (int r = r0; r < r0 + rows; ++r)
    for (int b = 0; b < nb; ++b)
      move_block<false>(t, ch, r % kTileRows, stored + (size_t(r / kTileRows) * nb + b) * ch.bytes,
                        blocks + (size_t(r - r0) * nb + b) * bb);
}

void linear_quant_tokens(DType t, const uint8_t* w, const float* bias, const float* x, int n, int in, int out,
                         float* y) {
  const QuantProduct p{t, w, bias, out, y};
  linear_quant_tokens_shared({&p, 1}, x, n, in);
}

void linear_quant_tokens_shared(std::span<const QuantProduct> ps, const float* x, int n, int in) {
  gemv_shared(ps, x, n, in);
  for (const QuantProduct& p : ps)
    if (p.bias) add_bias(p.y, p.bias, n, p.out);
}

void linear_quant(DType t, const uint8_t* w, const float* bias, const float* x, int n, int in, int out, float* y) {
  if (n == 1) return linear_quant_tokens(t, w, bias, x, 1, in, out, y);
  const size_t row_bytes = file_row_bytes(t, in);
  std::vector<uint8_t> blocks;
  linear_widened(x, bias, n, in, out, y, [&](int o0, int rows, float* dst) {
    blocks.resize(size_t(rows) * row_bytes);
    load_rows(t, w, o0, rows, in, blocks.data());
    dequantize(t, blocks.data(), dst, size_t(rows) * in);
  });
}

}  // namespace kvb
