#include "kernels/cpu/linear_quant.hpp"

#include <immintrin.h>

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

// How the engine stores a row of B blocks of a 32-value type: as planes, the quants (16 bytes of
// nibbles per block, or Q8_0's 32 signed bytes) first, then Q5's fifth bits (4 bytes per block), the
// fp16 scales d and, for Q4_1 and Q5_1, the fp16 mins m; each row 16-byte aligned. The GEMV then reads
// aligned quants and eight blocks' scales with one load (the file's 18- to 34-byte blocks put both at
// odd offsets: the one-token GEMV ran 1.3-1.6x slower on them). The bytes are the file's, moved, and
// at most 15 more per row.
struct Planes {
  size_t qs = 0, qh = 0, d = 0, m = 0, end = 0;  // byte offsets in a row; end: where its planes end
  size_t stride = 0;                             // the row's size
};

constexpr size_t quant_bytes(DType t) { return t == DType::Q8_0 ? 32 : 16; }

Planes planes(DType t, int cols) {
  const size_t blocks = size_t(cols) / QK;
  Planes p;
  p.qh = blocks * quant_bytes(t);
  p.d = p.qh + (has_fifth_bit(t) ? 4 * blocks : 0);
  p.m = p.d + 2 * blocks;
  // An odd block count never gives a multiple of 16 here, so a row whose last plane ends in half a
  // 32-bit word has the word's other half inside it (the GEMV reads scales in whole words).
  p.end = p.m + (has_min(t) ? 2 * blocks : 0);
  p.stride = (p.end + 15) / 16 * 16;
  return p;
}

bool is_kquant(DType t) { return t == DType::Q4_K || t == DType::Q6_K; }

// Asks for the weight bytes 4 KiB past the row about to be multiplied (one row's worth, within the
// matrix). A decode step multiplies some 200 matrices of 0.1-0.6 MiB once each, too short for the
// hardware prefetchers to run ahead: on the default model's shapes the GEMVs streamed 10-12 GB/s from
// memory on two cores of a Xeon whose read bandwidth measures 19-22, and 19-20 GB/s with this (1-8 KiB
// ahead measured alike, 16-32 rows ahead worse).
constexpr size_t kPrefetchBytes = 4096;

inline void prefetch_ahead(const uint8_t* row, size_t row_bytes, const uint8_t* end) {
  for (size_t l = kPrefetchBytes; l < kPrefetchBytes + row_bytes; l += 64)
    if (row + l < end) _mm_prefetch(reinterpret_cast<const char*>(row + l), _MM_HINT_T0);
}

float dot_row_portable(DType t, const uint8_t* row, const Planes& pl, const Q8Row& x, int blocks) {
  float acc = 0;
  for (int i = 0; i < blocks; ++i) {
    const int isum = block_isum(t, row + pl.qs + size_t(i) * quant_bytes(t), row + pl.qh + size_t(i) * 4,
                                x.q.data() + size_t(i) * QK);
    acc += rdh(row + pl.d + 2 * size_t(i)) * x.d[i] * static_cast<float>(isum);
    if (has_min(t)) acc += rdh(row + pl.m + 2 * size_t(i)) * x.s[i];
  }
  return acc;
}

__attribute__((target("avx2,fma,f16c"))) inline float rdh_f16c(const uint8_t* p) {
  uint16_t h;
  std::memcpy(&h, p, 2);
  return _cvtsh_ss(h);
}

// Eight int32 partial sums of 32 byte products; u unsigned (0..255), s signed.
__attribute__((target("avx2,fma"))) inline __m256i dot_us8(__m256i u, __m256i s, __m256i ones16) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), ones16);
}

// The 32 nibbles of a Q4 block as bytes, low nibbles (elements 0..15) then high (16..31).
__attribute__((target("avx2,fma"))) inline __m256i nibbles(const uint8_t* qs, __m256i low4) {
  const __m128i p = _mm_loadu_si128(reinterpret_cast<const __m128i*>(qs));
  return _mm256_and_si256(_mm256_set_m128i(_mm_srli_epi16(p, 4), p), low4);
}

// The 32 fifth bits of a Q5 block (bit j of qh for element j) as bytes 0x10 or 0.
__attribute__((target("avx2,fma"))) inline __m256i fifth_bits(const uint8_t* qh) {
  uint32_t h;
  std::memcpy(&h, qh, 4);
  // Byte j takes byte j / 8 of qh, then keeps bit j % 8 of it.
  const __m256i spread =
      _mm256_shuffle_epi8(_mm256_set1_epi32(static_cast<int>(h)),
                          _mm256_setr_epi64x(0, 0x0101010101010101, 0x0202020202020202, 0x0303030303030303));
  const __m256i bit = _mm256_set1_epi64x(static_cast<long long>(0x8040201008040201ULL));
  return _mm256_and_si256(_mm256_cmpeq_epi8(_mm256_and_si256(spread, bit), bit), _mm256_set1_epi8(0x10));
}

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c")
namespace gemv_avx2 {
#include "kernels/cpu/gemv_blocks.inc"
}  // namespace gemv_avx2
#pragma GCC pop_options

#pragma GCC push_options
#pragma GCC target("avx2,fma,f16c,avx512f,avx512vl,avx512bw,avx512vnni")
#define KVB_GEMV_VNNI
namespace gemv_avx512 {
#include "kernels/cpu/gemv_blocks.inc"
}  // namespace gemv_avx512
#undef KVB_GEMV_VNNI
#pragma GCC pop_options

// The AVX-512 form where the processor has VNNI (and the AVX-512 kernels are not held back): the same
// numbers, one instruction fewer per block and token.
template <DType T>
void gemv_rows_vector(const uint8_t* w, std::span<const Q8Row> xs, int blocks, int out, float* y) {
  static const bool vnni = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512vnni") && __builtin_cpu_supports("avx512bw") &&
           __builtin_cpu_supports("avx512vl");
  }();
  if (vnni && cpu_has_avx512())
    gemv_avx512::gemv_rows<T>(w, xs, blocks, out, y);
  else
    gemv_avx2::gemv_rows<T>(w, xs, blocks, out, y);
}

// ---- K-quants: blocks of 256 against Q8_K activations ----

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

float kquant_block(DType t, const uint8_t* b, const Q8KRow& x, int i) {
  const int8_t* q = x.q.data() + size_t(i) * QKK;
  const int16_t* bs = x.bsums.data() + size_t(i) * 16;
  if (t == DType::Q6_K) return rdh(b + 208) * x.d[i] * static_cast<float>(q6k_isum(b, q, bs));
  int mins = 0;
  const int isum = q4k_isum(b, q, bs, mins);
  return rdh(b) * x.d[i] * static_cast<float>(isum) - rdh(b + 2) * x.d[i] * static_cast<float>(mins);
}

float kquant_dot_portable(DType t, const uint8_t* row, const Q8KRow& x, int blocks) {
  const size_t bb = block_bytes(t);
  float acc = 0;
  for (int i = 0; i < blocks; ++i) acc += kquant_block(t, row + i * bb, x, i);
  return acc;
}

// Eight int32 partial sums of 32 u x s byte products, each 16-bit pair sum weighted by `scales`.
__attribute__((target("avx2,fma"))) inline __m256i dot_scaled(__m256i u, __m256i s, __m256i scales) {
  return _mm256_madd_epi16(_mm256_maddubs_epi16(u, s), scales);
}

// A 16-bit lane broadcast of word `lo` of each 128-bit lane's source in the low lane and of word `hi`
// in the high one (a vpshufb mask): hands every sub-block its scale without leaving the registers.
__attribute__((target("avx2,fma"))) inline __m256i word_mask(int lo, int hi) {
  return _mm256_set_m128i(_mm_set1_epi16(static_cast<int16_t>((2 * hi + 1) << 8 | 2 * hi)),
                          _mm_set1_epi16(static_cast<int16_t>((2 * lo + 1) << 8 | 2 * lo)));
}

__attribute__((target("avx2,fma,f16c"))) float q4k_dot_avx2(const uint8_t* row, const Q8KRow& x, int blocks) {
  const __m256i low4 = _mm256_set1_epi8(0x0F);
  __m256 acc = _mm256_setzero_ps();
  __m128 acc_mins = _mm_setzero_ps();
  for (int i = 0; i < blocks; ++i) {
    const uint8_t* b = row + size_t(i) * 144;
    const int8_t* q = x.q.data() + size_t(i) * QKK;
    uint8_t packed[16];
    unpack_scales_mins_k4(b + 4, packed);
    const __m256i scales_mins = _mm256_cvtepu8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(packed)));
    // The mins against the activations' sums per sub-block of 32 (pairs of the sums per 16).
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums.data() + size_t(i) * 16));
    const __m128i sums32 = _mm_hadd_epi16(_mm256_castsi256_si128(bsums), _mm256_extracti128_si256(bsums, 1));
    const __m128i mins = _mm_madd_epi16(_mm256_extracti128_si256(scales_mins, 1), sums32);
    acc_mins = _mm_fmadd_ps(_mm_set1_ps(rdh_f16c(b + 2) * x.d[i]), _mm_cvtepi32_ps(mins), acc_mins);
    const __m256i scales = _mm256_broadcastsi128_si256(_mm256_castsi256_si128(scales_mins));
    __m256i isum = _mm256_setzero_si256();
    for (int c = 0; c < 4; ++c) {  // 64 values: low nibbles are sub-block 2c, high ones 2c + 1
      const __m256i raw = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 16 + 32 * c));
      const __m256i lo = _mm256_and_si256(raw, low4), hi = _mm256_and_si256(_mm256_srli_epi16(raw, 4), low4);
      const __m256i qlo = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c));
      const __m256i qhi = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 64 * c + 32));
      isum = _mm256_add_epi32(
          isum, _mm256_add_epi32(dot_scaled(lo, qlo, _mm256_shuffle_epi8(scales, word_mask(2 * c, 2 * c))),
                                 dot_scaled(hi, qhi, _mm256_shuffle_epi8(scales, word_mask(2 * c + 1, 2 * c + 1)))));
    }
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), _mm256_set1_ps(rdh_f16c(b) * x.d[i]), acc);
  }
  return hsum_avx2(acc) - hsum_sse(acc_mins);
}

__attribute__((target("avx2,fma,f16c"))) float q6k_dot_avx2(const uint8_t* row, const Q8KRow& x, int blocks) {
  const __m256i low4 = _mm256_set1_epi8(0x0F), three = _mm256_set1_epi8(3);
  __m256 acc = _mm256_setzero_ps();
  __m256 offset = _mm256_setzero_ps();  // the -32 of every value, against the activations' sums
  for (int i = 0; i < blocks; ++i) {
    const uint8_t* b = row + size_t(i) * 210;
    const int8_t* q = x.q.data() + size_t(i) * QKK;
    const __m256i sc = _mm256_cvtepi8_epi16(_mm_loadu_si128(reinterpret_cast<const __m128i*>(b + 192)));
    const __m256i bsums = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(x.bsums.data() + size_t(i) * 16));
    // Each half's eight scales (sub-blocks 8 half .. 8 half + 7) in both lanes.
    const __m256i half_sc[2] = {_mm256_permute2x128_si256(sc, sc, 0x00), _mm256_permute2x128_si256(sc, sc, 0x11)};
    __m256i isum = _mm256_setzero_si256();
    for (int half = 0; half < 2; ++half) {
      const uint8_t* ql = b + 64 * half;
      const __m256i l0 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql));
      const __m256i l1 = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(ql + 32));
      const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(b + 128 + 32 * half));
      // The four 32-value groups of the half: low or high nibbles of ql, two bits of qh each on top.
      const __m256i u[4] = {
          _mm256_or_si256(_mm256_and_si256(l0, low4), _mm256_slli_epi16(_mm256_and_si256(h, three), 4)),
          _mm256_or_si256(_mm256_and_si256(l1, low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 2), three), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l0, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 4), three), 4)),
          _mm256_or_si256(_mm256_and_si256(_mm256_srli_epi16(l1, 4), low4),
                          _mm256_slli_epi16(_mm256_and_si256(_mm256_srli_epi16(h, 6), three), 4))};
      for (int g = 0; g < 4; ++g) {  // the group's two sub-blocks of 16: 2g and 2g + 1 of the half
        const __m256i scales = _mm256_shuffle_epi8(half_sc[half], word_mask(2 * g, 2 * g + 1));
        const __m256i qv = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(q + 128 * half + 32 * g));
        isum = _mm256_add_epi32(isum, dot_scaled(u[g], qv, scales));
      }
    }
    const __m256 dd = _mm256_set1_ps(rdh_f16c(b + 208) * x.d[i]);
    acc = _mm256_fmadd_ps(_mm256_cvtepi32_ps(isum), dd, acc);
    offset = _mm256_fmadd_ps(_mm256_cvtepi32_ps(_mm256_madd_epi16(sc, bsums)), dd, offset);
  }
  return hsum_avx2(acc) - 32.0f * hsum_avx2(offset);
}

void kquant_gemv(DType t, const uint8_t* w, size_t row_bytes, std::span<const Q8KRow> xs, int blocks, int out,
                 float* y) {
  const bool avx2 = cpu_has_avx2();
  const uint8_t* end = w + size_t(out) * row_bytes;
#pragma omp parallel for schedule(static)
  for (int o = 0; o < out; ++o) {
    const uint8_t* row = w + size_t(o) * row_bytes;
    prefetch_ahead(row, row_bytes, end);
    for (size_t b = 0; b < xs.size(); ++b)
      y[b * size_t(out) + o] = !avx2              ? kquant_dot_portable(t, row, xs[b], blocks)
                               : t == DType::Q4_K ? q4k_dot_avx2(row, xs[b], blocks)
                                                  : q6k_dot_avx2(row, xs[b], blocks);
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

void quantize_row_q8(const float* x, int n, Q8Row& out) {
  const int blocks = n / QK;
  out.d.resize(blocks);
  out.s.resize(blocks);
  out.q.resize(size_t(n));
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
    out.d[i] = half_to_float(float_to_half(d));
    out.s[i] = half_to_float(float_to_half(static_cast<float>(sum) * d));
  }
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

size_t stored_row_bytes(DType t, int cols) {
  if (is_kquant(t)) return file_row_bytes(t, cols);
  return planes(t, cols).stride;
}

namespace {

// Rows r0..r0+rows-1 of a matrix moved between the file's blocks and the stored layout, field by field:
// into the planes (src the blocks, dst the stored rows) or back out of them.
template <bool ToPlanes>
void move_rows(DType t, const uint8_t* src, uint8_t* dst, int r0, int rows, int cols) {
  const size_t row_bytes = file_row_bytes(t, cols);
  if (is_kquant(t)) {
    const size_t at = size_t(r0) * row_bytes;
    std::memcpy(ToPlanes ? dst + at : dst, ToPlanes ? src : src + at, size_t(rows) * row_bytes);
    return;
  }
  const Planes pl = planes(t, cols);
  const size_t bb = block_bytes(t);
#pragma omp parallel for schedule(static) if (rows > 16)
  for (int r = 0; r < rows; ++r) {
    const size_t stored = size_t(r0 + r) * pl.stride, file = size_t(r) * row_bytes;
    auto field = [&](size_t in_row, size_t in_block, size_t n) {
      if constexpr (ToPlanes)
        std::memcpy(dst + stored + in_row, src + file + in_block, n);
      else
        std::memcpy(dst + file + in_block, src + stored + in_row, n);
    };
    if constexpr (ToPlanes) std::memset(dst + stored + pl.end, 0, pl.stride - pl.end);
    for (size_t i = 0; i < size_t(cols) / QK; ++i) {
      // constant sizes, so that the copies inline
      if (t == DType::Q8_0)
        field(pl.qs + i * 32, i * bb + qs_offset(t), 32);
      else
        field(pl.qs + i * 16, i * bb + qs_offset(t), 16);
      if (has_fifth_bit(t)) field(pl.qh + i * 4, i * bb + qh_offset(t), 4);
      field(pl.d + i * 2, i * bb, 2);
      if (has_min(t)) field(pl.m + i * 2, i * bb + 2, 2);
    }
  }
}

}  // namespace

void store_rows(DType t, const uint8_t* blocks, int rows, int cols, uint8_t* dst) {
  move_rows<true>(t, blocks, dst, 0, rows, cols);
}

void load_rows(DType t, const uint8_t* stored, int r0, int rows, int cols, uint8_t* blocks) {
  move_rows<false>(t, stored, blocks, r0, rows, cols);
}

void linear_quant_tokens(DType t, const uint8_t* w, const float* bias, const float* x, int n, int in, int out,
                         float* y) {
  if (is_kquant(t)) {
    std::vector<Q8KRow> xs(static_cast<size_t>(n));
#pragma omp parallel for schedule(static) if (n > 1)
    for (int b = 0; b < n; ++b) quantize_row_q8_k(x + size_t(b) * in, in, xs[size_t(b)]);
    kquant_gemv(t, w, stored_row_bytes(t, in), xs, in / QKK, out, y);
  } else {
    std::vector<Q8Row> xs(static_cast<size_t>(n));
    // A batch's tokens apart on the threads: one thread quantizing all of them left the other waiting
    // for 4% of a batch-8 step.
#pragma omp parallel for schedule(static) if (n > 1)
    for (int b = 0; b < n; ++b) quantize_row_q8(x + size_t(b) * in, in, xs[size_t(b)]);
    const int blocks = in / QK;
    if (!cpu_has_avx2()) {
      const Planes pl = planes(t, in);
#pragma omp parallel for schedule(static)
      for (int o = 0; o < out; ++o)
        for (int b = 0; b < n; ++b)
          y[size_t(b) * out + o] = dot_row_portable(t, w + size_t(o) * pl.stride, pl, xs[size_t(b)], blocks);
    } else {
      switch (t) {
        case DType::Q4_1:
          gemv_rows_vector<DType::Q4_1>(w, xs, blocks, out, y);
          break;
        case DType::Q5_0:
          gemv_rows_vector<DType::Q5_0>(w, xs, blocks, out, y);
          break;
        case DType::Q5_1:
          gemv_rows_vector<DType::Q5_1>(w, xs, blocks, out, y);
          break;
        case DType::Q8_0:
          gemv_rows_vector<DType::Q8_0>(w, xs, blocks, out, y);
          break;
        default:
          gemv_rows_vector<DType::Q4_0>(w, xs, blocks, out, y);
      }
    }
  }
  if (bias) add_bias(y, bias, n, out);
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
