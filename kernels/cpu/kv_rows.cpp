#include "kernels/cpu/kv_rows.hpp"

#include <cblas.h>
#include <cpuid.h>
#include <immintrin.h>

#include <algorithm>
#include <atomic>
#include <cmath>
#include <cstdlib>
#include <numeric>
#include <string_view>
#include <vector>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/query_runs.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace kvb {

size_t kv_dtype_bytes(KvDtype t) { return t == KvDtype::F32 ? 4 : 2; }

const char* kv_dtype_name(KvDtype t) {
  switch (t) {
    case KvDtype::F32:
      return "fp32";
    case KvDtype::BF16:
      return "bf16";
    case KvDtype::F16:
      return "fp16";
  }
  return "?";
}

KvDtype parse_kv_dtype(const std::string& name, const std::string& where) {
  for (KvDtype t : {KvDtype::F32, KvDtype::BF16, KvDtype::F16})
    if (name == kv_dtype_name(t)) return t;
  fail("{}: KV dtype '{}' is not one of fp32, bf16, fp16", where, name);
}

namespace {
// The highest hand-written kernel level allowed: 2 AVX-512, 1 AVX2, 0 the portable loops.
// Read at the first kernel call rather than at load, so that a bad value is an error main reports.
int level_from_env() {
  static const int level = [] {
    const char* k = std::getenv("KVBENCH_KERNELS");
    const std::string_view v(k == nullptr ? "" : k);
    if (v == "portable") return 0;
    if (v == "avx2") return 1;
    if (v == "avx512" || v.empty()) return 2;
    fail("KVBENCH_KERNELS is '{}'; expected portable, avx2 or avx512 (the highest kernel level to use)", v);
  }();
  return level;
}
std::atomic<int> level_forced{-1};  // -1: the environment's level
int level_cap() {
  const int f = level_forced.load(std::memory_order_relaxed);
  return f >= 0 ? f : level_from_env();
}
}  // namespace

bool cpu_has_avx2() {
  static const bool yes = [] {
    __builtin_cpu_init();
    // F16C from CPUID leaf 1 (ECX bit 29): not every compiler's __builtin_cpu_supports knows the name.
    unsigned eax = 0, ebx = 0, ecx = 0, edx = 0;
    const bool f16c = __get_cpuid(1, &eax, &ebx, &ecx, &edx) && (ecx & bit_F16C);
    return __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma") && f16c;
  }();
  return yes && level_cap() >= 1;
}

bool cpu_has_avx512() {
  static const bool yes = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512f") != 0;
  }();
  return yes && cpu_has_avx2() && level_cap() >= 2;
}

void force_portable_kernels(bool on) { level_forced.store(on ? 0 : -1); }
void cap_kernels_at_avx2(bool on) { level_forced.store(on ? std::min(1, level_from_env()) : -1); }

std::string cpu_kernel_path() {
  __builtin_cpu_init();
  // The order target_clones("avx512f", "avx2", "default") resolves in (kernels/cpu/vec_math.hpp).
  const char* clones = __builtin_cpu_supports("avx512f") ? "avx512f"
                       : __builtin_cpu_supports("avx2")  ? "avx2"
                                                         : "default";
  const char* hand = cpu_has_avx512() ? "avx512" : cpu_has_avx2() ? "avx2" : "portable";
  // and the kernels OpenBLAS chose, which sum in their own order
  return std::string(hand) + ", clones " + clones + ", OpenBLAS " + openblas_get_corename();
}

namespace {

float widen(KvDtype t, uint16_t x) { return t == KvDtype::F16 ? half_to_float(x) : bf16_to_float(x); }
uint16_t narrow(KvDtype t, float x) { return t == KvDtype::F16 ? float_to_half(x) : float_to_bf16(x); }

// Eight 16-bit elements widened to fp32.
__attribute__((target("avx2,fma,f16c"))) inline __m256 load8(KvDtype t, const uint16_t* p) {
  const __m128i h = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
  if (t == KvDtype::F16) return _mm256_cvtph_ps(h);
  return _mm256_castsi256_ps(_mm256_slli_epi32(_mm256_cvtepu16_epi32(h), 16));
}

__attribute__((target("avx2,fma,f16c"))) inline float hsum(__m256 v) {
  __m128 s = _mm_add_ps(_mm256_castps256_ps128(v), _mm256_extractf128_ps(v, 1));
  s = _mm_add_ps(s, _mm_movehl_ps(s, s));
  s = _mm_add_ss(s, _mm_movehdup_ps(s));
  return _mm_cvtss_f32(s);
}

// The lines of [p, p + bytes) fetched ahead of use, those before `end` only: a head's rows at 512 tokens are
// 64 KiB, a stream too short for the hardware prefetchers to reach full speed.
constexpr size_t kRowsAhead = 8192;  // bytes
inline void prefetch_ahead(const uint16_t* p, size_t bytes, const uint16_t* end) {
  const uintptr_t a = reinterpret_cast<uintptr_t>(p) + kRowsAhead;
  const uintptr_t e = std::min(a + bytes, reinterpret_cast<uintptr_t>(end));
  for (uintptr_t l = a; l < e; l += 64) _mm_prefetch(reinterpret_cast<const char*>(l), _MM_HINT_T0);
}

// Four horizontal sums at once: lane i of the result is the sum of v[i].
__attribute__((target("avx2,fma,f16c"))) inline __m128 hsum4(__m256 v0, __m256 v1, __m256 v2, __m256 v3) {
  const __m256 a = _mm256_hadd_ps(v0, v1), b = _mm256_hadd_ps(v2, v3);
  const __m256 c = _mm256_hadd_ps(a, b);  // per 128-bit half: (v0, v1, v2, v3) partial sums
  return _mm_add_ps(_mm256_castps256_ps128(c), _mm256_extractf128_ps(c, 1));
}

// G queries (q [G, d]) against each row: out[j * n + i] = q_j . row_i, each row widened once for them.
// Inlined into an AVX2 caller (16 vector registers: G <= 2) and an AVX-512VL one, whose 32 registers hold
// the sums of a whole GQA group of up to four, so that its rows are read once; each sum is the same
// chain of operations in both. (Two rows' lanes to a 512-bit register, to halve the multiply-adds,
// streamed 13% slower in L2 on Zen 5: the rows' conversions and inserts bound it, not the multiply-adds.)
template <int G>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void dot16_rows(KvDtype t, const uint16_t* rows,
                                                                               size_t n, int d, const float* q,
                                                                               float* out, size_t ldo) {
  const int d8 = d / 8 * 8;
  size_t i = 0;
  if (d8 == d) {
    // Four rows per pass: each query column is loaded once for them, and their sums are reduced together.
    for (; i + 4 <= n; i += 4) {
      const uint16_t* r = rows + i * size_t(d);
      prefetch_ahead(r, 4 * size_t(d) * 2, rows + n * size_t(d));
      __m256 a[G][4];
      for (auto& aj : a)
        for (auto& x : aj) x = _mm256_setzero_ps();
      for (int c = 0; c < d; c += 8) {
        const __m256 r0 = load8(t, r + c), r1 = load8(t, r + size_t(d) + c), r2 = load8(t, r + 2 * size_t(d) + c),
                     r3 = load8(t, r + 3 * size_t(d) + c);
        for (int j = 0; j < G; ++j) {
          const __m256 qc = _mm256_loadu_ps(q + size_t(j) * d + c);
          a[j][0] = _mm256_fmadd_ps(r0, qc, a[j][0]);
          a[j][1] = _mm256_fmadd_ps(r1, qc, a[j][1]);
          a[j][2] = _mm256_fmadd_ps(r2, qc, a[j][2]);
          a[j][3] = _mm256_fmadd_ps(r3, qc, a[j][3]);
        }
      }
      for (int j = 0; j < G; ++j) _mm_storeu_ps(out + size_t(j) * ldo + i, hsum4(a[j][0], a[j][1], a[j][2], a[j][3]));
    }
  }
  for (; i < n; ++i) {
    const uint16_t* r = rows + i * size_t(d);
    __m256 a[G][2];  // even and odd blocks of 8 channels
    for (auto& aj : a) aj[0] = aj[1] = _mm256_setzero_ps();
    for (int c = 0; c < d8; c += 8) {
      const __m256 rc = load8(t, r + c);
      for (int j = 0; j < G; ++j)
        a[j][c / 8 % 2] = _mm256_fmadd_ps(rc, _mm256_loadu_ps(q + size_t(j) * d + c), a[j][c / 8 % 2]);
    }
    for (int j = 0; j < G; ++j) {
      float s = hsum(_mm256_add_ps(a[j][0], a[j][1]));
      for (int c = d8; c < d; ++c) s += widen(t, r[c]) * q[size_t(j) * d + c];
      out[size_t(j) * ldo + i] = s;
    }
  }
}

// acc_j[c0, c0 + 8 W) += sum_i p_j[i] row_i[c0, c0 + 8 W): in registers, rows inner, so acc is read and
// written once. W is a template argument so that the accumulators are registers (indexed by a run-time
// count they lived on the stack, a load and a store around every FMA).
template <int G, int W>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void axpy16_block_avx2(KvDtype t, const uint16_t* rows,
                                                                                      size_t n, size_t ld, int c0,
                                                                                      const float* p, size_t ldp,
                                                                                      float* acc) {
  __m256 a[G][W];
  for (int j = 0; j < G; ++j)
    for (int v = 0; v < W; ++v) a[j][v] = _mm256_loadu_ps(acc + j * ld + c0 + 8 * v);
  for (size_t i = 0; i < n; ++i) {
    __m256 pi[G];
    bool any = false;
    for (int j = 0; j < G; ++j) {
      any = any || p[j * ldp + i] != 0.0f;
      pi[j] = _mm256_set1_ps(p[j * ldp + i]);
    }
    const uint16_t* r = rows + i * ld + c0;
    prefetch_ahead(r, 16 * W, rows + n * ld);
    if (!any) continue;
    for (int v = 0; v < W; ++v) {
      const __m256 rv = load8(t, r + 8 * v);
      for (int j = 0; j < G; ++j) a[j][v] = _mm256_fmadd_ps(pi[j], rv, a[j][v]);
    }
  }
  for (int j = 0; j < G; ++j)
    for (int v = 0; v < W; ++v) _mm256_storeu_ps(acc + j * ld + c0 + 8 * v, a[j][v]);
}

// acc_j[0..d) += sum_i p_j[i] row_i for G queries (p [G, n], acc [G, d]), each row widened once for them,
// over blocks of 32 channels (16 registers). Each channel's sum is the same chain of operations whatever
// the blocks (the AVX-512 kernel takes them 64 at a time).
template <int G>
__attribute__((target("avx2,fma,f16c"), always_inline)) inline void axpy16_rows(KvDtype t, const uint16_t* rows,
                                                                                size_t n, int d, size_t ld,
                                                                                const float* p, size_t ldp,
                                                                                float* acc) {
  const int d8 = d / 8 * 8;
  for (int c0 = 0; c0 < d8; c0 += 32) switch (std::min(32, d8 - c0) / 8) {
      case 4:
        axpy16_block_avx2<G, 4>(t, rows, n, ld, c0, p, ldp, acc);
        break;
      case 3:
        axpy16_block_avx2<G, 3>(t, rows, n, ld, c0, p, ldp, acc);
        break;
      case 2:
        axpy16_block_avx2<G, 2>(t, rows, n, ld, c0, p, ldp, acc);
        break;
      default:
        axpy16_block_avx2<G, 1>(t, rows, n, ld, c0, p, ldp, acc);
    }
  for (int j = 0; j < G; ++j)
    for (int c = d8; c < d; ++c)
      for (size_t i = 0; i < n; ++i) acc[j * ld + c] += p[j * ldp + i] * widen(t, rows[i * ld + c]);
}

template <int G>
__attribute__((target("avx2,fma,f16c"))) void dot16_avx2(KvDtype t, const uint16_t* rows, size_t n, int d,
                                                         const float* q, float* out, size_t ldo) {
  dot16_rows<G>(t, rows, n, d, q, out, ldo);
}
template <int G>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl"))) void dot16_avx512(KvDtype t, const uint16_t* rows, size_t n,
                                                                            int d, const float* q, float* out,
                                                                            size_t ldo) {
  dot16_rows<G>(t, rows, n, d, q, out, ldo);
}
template <int G>
__attribute__((target("avx2,fma,f16c"))) void axpy16_avx2(KvDtype t, const uint16_t* rows, size_t n, int d, size_t ld,
                                                          const float* p, size_t ldp, float* acc) {
  axpy16_rows<G>(t, rows, n, d, ld, p, ldp, acc);
}

// The 512-bit conversions' _mm512_undefined_ps makes GCC 12 report -Wmaybe-uninitialized in every
// caller (GCC PR105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
// Sixteen consecutive 16-bit elements widened to fp32.
__attribute__((target("avx2,fma,f16c,avx512f"))) inline __m512 load16(KvDtype t, const uint16_t* p) {
  const __m256i h = _mm256_loadu_si256(reinterpret_cast<const __m256i*>(p));
  if (t == KvDtype::F16) return _mm512_cvtph_ps(h);
  return _mm512_castsi512_ps(_mm512_slli_epi32(_mm512_cvtepu16_epi32(h), 16));
}

// axpy16_block_avx2 on sixteen channels a register: each channel's chain is unchanged, at half the
// multiply-adds.
template <int G, int W>
__attribute__((target("avx2,fma,f16c,avx512f"))) void axpy16_block_avx512(KvDtype t, const uint16_t* rows, size_t n,
                                                                          size_t ld, int c0, const float* p, size_t ldp,
                                                                          float* acc) {
  __m512 a[G][W];
  for (int j = 0; j < G; ++j)
    for (int v = 0; v < W; ++v) a[j][v] = _mm512_loadu_ps(acc + j * ld + c0 + 16 * v);
  for (size_t i = 0; i < n; ++i) {
    __m512 pi[G];
    bool any = false;
    for (int j = 0; j < G; ++j) {
      any = any || p[j * ldp + i] != 0.0f;
      pi[j] = _mm512_set1_ps(p[j * ldp + i]);
    }
    const uint16_t* r = rows + i * ld + c0;
    prefetch_ahead(r, 32 * W, rows + n * ld);
    if (!any) continue;
    for (int v = 0; v < W; ++v) {
      const __m512 rv = load16(t, r + 16 * v);
      for (int j = 0; j < G; ++j) a[j][v] = _mm512_fmadd_ps(pi[j], rv, a[j][v]);
    }
  }
  for (int j = 0; j < G; ++j)
    for (int v = 0; v < W; ++v) _mm512_storeu_ps(acc + j * ld + c0 + 16 * v, a[j][v]);
}

// Blocks of 64 channels (a 64-wide head's whole row, two cache lines, per pass), then of 16; the
// channels left (fewer than 16) as the AVX2 kernel takes them.
template <int G>
__attribute__((target("avx2,fma,f16c,avx512f,avx512vl"))) void axpy16_avx512(KvDtype t, const uint16_t* rows, size_t n,
                                                                             int d, size_t ld, const float* p,
                                                                             size_t ldp, float* acc) {
  int c0 = 0;
  for (; c0 + 64 <= d; c0 += 64) axpy16_block_avx512<G, 4>(t, rows, n, ld, c0, p, ldp, acc);
  switch ((d - c0) / 16) {
    case 3:
      axpy16_block_avx512<G, 3>(t, rows, n, ld, c0, p, ldp, acc);
      break;
    case 2:
      axpy16_block_avx512<G, 2>(t, rows, n, ld, c0, p, ldp, acc);
      break;
    case 1:
      axpy16_block_avx512<G, 1>(t, rows, n, ld, c0, p, ldp, acc);
      break;
    default:
      break;
  }
  c0 += (d - c0) / 16 * 16;
  if (c0 < d) axpy16_rows<G>(t, rows + c0, n, d - c0, ld, p, ldp, acc + c0);
}
#pragma GCC diagnostic pop

// Columns [c0, c0 + 16 W) of the ragged axpy for G weight vectors over n >= 1 rows (p_j at p + j ps):
// the accumulators stay in registers over all rows, each row read under a mask (zeros past its width). No branch on the
// width: widths vary from token to token, and skipping the rows that end before c0 measured slower (mispredictions).
// Columns past ld are neither read nor written.
template <int G, int W>
__attribute__((target("avx512f"))) void ragged_block_avx512(const float* rows, const uint16_t* widths, size_t n,
                                                            const float* p, size_t ps, int c0, float* acc, int ld) {
  __m512i col[W];  // the block's column indices, against which a width gives the lanes to read
  __m512 a[G][W];
  for (int v = 0; v < W; ++v) {
    col[v] = _mm512_add_epi32(_mm512_set1_epi32(c0 + 16 * v),
                              _mm512_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7, 8, 9, 10, 11, 12, 13, 14, 15));
    const __mmask16 inside = _mm512_cmplt_epi32_mask(col[v], _mm512_set1_epi32(ld));
    for (int j = 0; j < G; ++j) a[j][v] = _mm512_maskz_loadu_ps(inside, acc + size_t(j) * ld + c0 + 16 * v);
  }
  size_t i = 0;
  do {  // n >= 1; as a for loop (n = 0 possible), GCC stored every accumulator to the stack at each row
    const int wi = widths[i];
    const __m512i w = _mm512_set1_epi32(wi);
    __m512 pi[G];
    for (int j = 0; j < G; ++j) pi[j] = _mm512_set1_ps(p[size_t(j) * ps + i]);
    for (int v = 0; v < W; ++v) {
      const __m512 x = _mm512_maskz_loadu_ps(_mm512_cmplt_epi32_mask(col[v], w), rows + c0 + 16 * v);
      for (int j = 0; j < G; ++j) a[j][v] = _mm512_fmadd_ps(pi[j], x, a[j][v]);
    }
    rows += wi;
  } while (++i < n);
  for (int v = 0; v < W; ++v) {
    const __mmask16 inside = _mm512_cmplt_epi32_mask(col[v], _mm512_set1_epi32(ld));
    for (int j = 0; j < G; ++j) _mm512_mask_storeu_ps(acc + size_t(j) * ld + c0 + 16 * v, inside, a[j][v]);
  }
}

// The AVX2 twin: eight columns per register, the same fused operations in the same order.
template <int G, int W>
__attribute__((target("avx2,fma"))) void ragged_block_avx2(const float* rows, const uint16_t* widths, size_t n,
                                                           const float* p, size_t ps, int c0, float* acc, int ld) {
  __m256i col[W];
  __m256 a[G][W];
  for (int v = 0; v < W; ++v) {
    col[v] = _mm256_add_epi32(_mm256_set1_epi32(c0 + 8 * v), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256i inside = _mm256_cmpgt_epi32(_mm256_set1_epi32(ld), col[v]);
    for (int j = 0; j < G; ++j) a[j][v] = _mm256_maskload_ps(acc + size_t(j) * ld + c0 + 8 * v, inside);
  }
  size_t i = 0;
  do {  // n >= 1, as above
    const int wi = widths[i];
    const __m256i w = _mm256_set1_epi32(wi);
    __m256 pi[G];
    for (int j = 0; j < G; ++j) pi[j] = _mm256_set1_ps(p[size_t(j) * ps + i]);
    for (int v = 0; v < W; ++v) {
      const __m256 x = _mm256_maskload_ps(rows + c0 + 8 * v, _mm256_cmpgt_epi32(w, col[v]));
      for (int j = 0; j < G; ++j) a[j][v] = _mm256_fmadd_ps(pi[j], x, a[j][v]);
    }
    rows += wi;
  } while (++i < n);
  for (int v = 0; v < W; ++v) {
    const __m256i inside = _mm256_cmpgt_epi32(_mm256_set1_epi32(ld), col[v]);
    for (int j = 0; j < G; ++j) _mm256_maskstore_ps(acc + size_t(j) * ld + c0 + 8 * v, inside, a[j][v]);
  }
}

// G (at most 3) weight vectors: 32 rows at a time (a few KiB, kept in L1), each over all column blocks,
// 64 columns per block with AVX-512 (G x 4 accumulators of 32 registers) and 16 with AVX2 (G x 2 of 16), so that the
// rows come from memory once and not once per block.
template <int G>
void ragged_rows_axpy_group(const float* rows, const uint16_t* widths, size_t n, const float* p, float* acc, int ld) {
  constexpr size_t kRows = 32;
  const bool avx512 = cpu_has_avx512(), avx2 = cpu_has_avx2();
  for (size_t i0 = 0; i0 < n; i0 += kRows) {
    const size_t m = std::min(kRows, n - i0);
    if (avx512) {
      for (int c0 = 0; c0 < ld; c0 += 64) ragged_block_avx512<G, 4>(rows, widths + i0, m, p + i0, n, c0, acc, ld);
    } else if (avx2) {
      for (int c0 = 0; c0 < ld; c0 += 16) ragged_block_avx2<G, 2>(rows, widths + i0, m, p + i0, n, c0, acc, ld);
    } else {
      const float* r = rows;
      for (size_t i = i0; i < i0 + m; r += widths[i], ++i)
        for (int j = 0; j < G; ++j)
          for (int c = 0; c < widths[i]; ++c)
            acc[size_t(j) * ld + c] = std::fma(p[size_t(j) * n + i], r[c], acc[size_t(j) * ld + c]);
    }
    for (size_t i = i0; i < i0 + m; ++i) rows += widths[i];
  }
}

__attribute__((target("avx2,fma,f16c"))) void encode_f16_avx2(const float* src, size_t n, uint16_t* dst) {
  size_t i = 0;
  for (; i + 8 <= n; i += 8)
    _mm_storeu_si128(reinterpret_cast<__m128i*>(dst + i),
                     _mm256_cvtps_ph(_mm256_loadu_ps(src + i), _MM_FROUND_TO_NEAREST_INT | _MM_FROUND_NO_EXC));
  for (; i < n; ++i) dst[i] = float_to_half(src[i]);
}

}  // namespace

void kv_encode(KvDtype t, const float* src, size_t n, void* dst) {
  if (t == KvDtype::F32) {
    std::copy(src, src + n, static_cast<float*>(dst));
    return;
  }
  auto* out = static_cast<uint16_t*>(dst);
  if (t == KvDtype::F16 && cpu_has_avx2())
    encode_f16_avx2(src, n, out);
  else
    for (size_t i = 0; i < n; ++i) out[i] = narrow(t, src[i]);
  if (t != KvDtype::F16) return;
  // A finite value past fp16's range is stored as infinity, which turns attention into NaN: refused,
  // rather than read back as a number that was never computed.
  for (size_t i = 0; i < n; ++i)
    if ((out[i] & 0x7FFFu) == 0x7C00u && std::isfinite(src[i]))
      fail(
          "a key or value of {} is past the range of an fp16 KV cache (65504); store the cache as bf16 or fp32 "
          "(--kv-dtype)",
          src[i]);
}

void kv_decode(KvDtype t, const void* src, size_t n, float* dst) {
  if (t == KvDtype::F32) {
    std::copy(static_cast<const float*>(src), static_cast<const float*>(src) + n, dst);
    return;
  }
  const auto* in = static_cast<const uint16_t*>(src);
  for (size_t i = 0; i < n; ++i) dst[i] = widen(t, in[i]);
}

float kv_round(KvDtype t, float x) { return t == KvDtype::F32 ? x : widen(t, narrow(t, x)); }

void kv_rows_dot_ref(KvDtype t, const void* rows, size_t n, int d, const float* q, float* out) {
  std::vector<float> row(static_cast<size_t>(d));
  for (size_t i = 0; i < n; ++i) {
    kv_decode(t, static_cast<const char*>(rows) + i * size_t(d) * kv_dtype_bytes(t), size_t(d), row.data());
    double s = 0;
    for (int c = 0; c < d; ++c) s += double(row[size_t(c)]) * q[c];
    out[i] = static_cast<float>(s);
  }
}

void kv_rows_axpy_ref(KvDtype t, const void* rows, size_t n, int d, const float* p, float* acc) {
  std::vector<float> row(static_cast<size_t>(d));
  std::vector<double> sum(acc, acc + d);
  for (size_t i = 0; i < n; ++i) {
    kv_decode(t, static_cast<const char*>(rows) + i * size_t(d) * kv_dtype_bytes(t), size_t(d), row.data());
    for (int c = 0; c < d; ++c) sum[size_t(c)] += double(p[i]) * row[size_t(c)];
  }
  for (int c = 0; c < d; ++c) acc[c] = static_cast<float>(sum[size_t(c)]);
}

void kv_rows_dot(KvDtype t, const void* rows, size_t n, int d, const float* q, float* out, int g, size_t ldo) {
  if (n == 0) return;
  if (ldo == 0) ldo = n;
  // fp32 rows need no widening: one BLAS product per query, whose sums are those of a single query.
  if (t == KvDtype::F32) {
    for (int j = 0; j < g; ++j)
      cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), d, 1.0f, static_cast<const float*>(rows), d,
                  q + size_t(j) * d, 1, 0.0f, out + size_t(j) * ldo, 1);
    return;
  }
  const auto* r = static_cast<const uint16_t*>(rows);
  if (!cpu_has_avx2()) {
    for (int j = 0; j < g; ++j)
      for (size_t i = 0; i < n; ++i) {
        float s = 0;
        for (int c = 0; c < d; ++c) s += widen(t, r[i * size_t(d) + c]) * q[size_t(j) * d + c];
        out[size_t(j) * ldo + i] = s;
      }
    return;
  }
  if (cpu_has_avx512()) {
    for_query_runs<4>(g, [&](auto G, int j) {
      dot16_avx512<decltype(G)::value>(t, r, n, d, q + size_t(j) * d, out + size_t(j) * ldo, ldo);
    });
    return;
  }
  // Pairs of queries: four rows, two queries and their eight sums fill the sixteen vector registers.
  for (int j = 0; j < g; j += 2, q += 2 * size_t(d), out += 2 * ldo) {
    if (j + 2 <= g)
      dot16_avx2<2>(t, r, n, d, q, out, ldo);
    else
      dot16_avx2<1>(t, r, n, d, q, out, ldo);
  }
}

void kv_rows_axpy(KvDtype t, const void* rows, size_t n, int d, const float* p, float* acc, int g, size_t ld,
                  size_t ldp) {
  if (n == 0) return;
  if (ld == 0) ld = size_t(d);
  if (ldp == 0) ldp = n;
  if (t == KvDtype::F32) {
    for (int j = 0; j < g; ++j)
      cblas_sgemv(CblasRowMajor, CblasTrans, static_cast<int>(n), d, 1.0f, static_cast<const float*>(rows),
                  static_cast<int>(ld), p + j * ldp, 1, 1.0f, acc + j * ld, 1);
    return;
  }
  const auto* r = static_cast<const uint16_t*>(rows);
  if (!cpu_has_avx2()) {
    for (int j = 0; j < g; ++j)
      for (size_t i = 0; i < n; ++i)
        for (int c = 0; c < d; ++c) acc[j * ld + c] += p[j * ldp + i] * widen(t, r[i * ld + c]);
    return;
  }
  if (cpu_has_avx512()) {
    for_query_runs<4>(
        g, [&](auto G, int j) { axpy16_avx512<decltype(G)::value>(t, r, n, d, ld, p + j * ldp, ldp, acc + j * ld); });
    return;
  }
  for (int j = 0; j < g; j += 2, p += 2 * ldp, acc += 2 * ld) {
    if (j + 2 <= g)
      axpy16_avx2<2>(t, r, n, d, ld, p, ldp, acc);
    else
      axpy16_avx2<1>(t, r, n, d, ld, p, ldp, acc);
  }
}

void append_block_row(std::vector<float>& blocks, size_t n, int d, const float* x) {
  if (n % kOrderBlock == 0) blocks.resize((n / kOrderBlock + 1) * size_t(d) * kOrderBlock, 0.0f);
  float* b = blocks.data() + n / kOrderBlock * size_t(d) * kOrderBlock + n % kOrderBlock;
  for (int c = 0; c < d; ++c) b[size_t(c) * kOrderBlock] = x[c];
}

void row_of_blocks(const float* blocks, size_t i, int d, float* x) {
  const float* b = blocks + i / kOrderBlock * size_t(d) * kOrderBlock + i % kOrderBlock;
  for (int c = 0; c < d; ++c) x[c] = b[size_t(c) * kOrderBlock];
}

void blocks_dot_in_order_ref(const float* blocks, size_t t0, size_t t1, int d, const float* q, int g, float* out,
                             size_t ldo) {
  std::vector<float> row(static_cast<size_t>(d));
  for (size_t i = t0; i < t1; ++i) {
    row_of_blocks(blocks, i, d, row.data());
    for (int j = 0; j < g; ++j)
      out[size_t(j) * ldo + i] = std::inner_product(q + size_t(j) * d, q + size_t(j + 1) * d, row.data(), 0.0f);
  }
}

namespace {

// The lanes of block b that rows [t0, t1) cover.
uint32_t block_lanes(size_t b, size_t t0, size_t t1) {
  const size_t lo = std::max(t0, b * kOrderBlock), hi = std::min(t1, (b + 1) * kOrderBlock);
  return ((1u << (hi - b * kOrderBlock)) - 1) & ~((1u << (lo - b * kOrderBlock)) - 1);
}

// G queries against NB blocks from block b0: G * NB sums in flight, each a chain of d adds.
template <int G, int NB>
__attribute__((target("avx512f"))) void blocks_dot_avx512(const float* blocks, size_t b0, size_t t0, size_t t1, int d,
                                                          const float* q, float* out, size_t ldo) {
  const float* base = blocks + b0 * size_t(d) * kOrderBlock;
  __m512 s[G][NB];
  for (auto& row : s)
    for (auto& x : row) x = _mm512_setzero_ps();
  for (int c = 0; c < d; ++c) {
    __m512 col[NB];
    for (int b = 0; b < NB; ++b) col[b] = _mm512_loadu_ps(base + (size_t(b) * d + c) * kOrderBlock);
    for (int j = 0; j < G; ++j) {
      const __m512 qj = _mm512_set1_ps(q[size_t(j) * d + c]);
      for (int b = 0; b < NB; ++b) s[j][b] = _mm512_add_ps(s[j][b], _mm512_mul_ps(qj, col[b]));
    }
  }
  for (int b = 0; b < NB; ++b) {
    const auto live = static_cast<__mmask16>(block_lanes(b0 + b, t0, t1));
    for (int j = 0; j < G; ++j) _mm512_mask_storeu_ps(out + size_t(j) * ldo + (b0 + b) * kOrderBlock, live, s[j][b]);
  }
}

// The same on eight lanes: a block's two halves.
template <int G>
__attribute__((target("avx2"))) void blocks_dot_avx2(const float* blocks, size_t b0, size_t t0, size_t t1, int d,
                                                     const float* q, float* out, size_t ldo) {
  const float* base = blocks + b0 * size_t(d) * kOrderBlock;
  __m256 s[G][2];
  for (auto& row : s)
    for (auto& x : row) x = _mm256_setzero_ps();
  for (int c = 0; c < d; ++c) {
    const __m256 lo = _mm256_loadu_ps(base + size_t(c) * kOrderBlock),
                 hi = _mm256_loadu_ps(base + size_t(c) * kOrderBlock + 8);
    for (int j = 0; j < G; ++j) {
      const __m256 qj = _mm256_set1_ps(q[size_t(j) * d + c]);
      s[j][0] = _mm256_add_ps(s[j][0], _mm256_mul_ps(qj, lo));
      s[j][1] = _mm256_add_ps(s[j][1], _mm256_mul_ps(qj, hi));
    }
  }
  const uint32_t lanes = block_lanes(b0, t0, t1);
  const __m256i bit = _mm256_setr_epi32(1, 2, 4, 8, 16, 32, 64, 128);
  for (int h = 0; h < 2; ++h) {
    const __m256i live = _mm256_cmpeq_epi32(_mm256_and_si256(_mm256_set1_epi32(int(lanes >> (8 * h))), bit), bit);
    for (int j = 0; j < G; ++j) _mm256_maskstore_ps(out + size_t(j) * ldo + b0 * kOrderBlock + 8 * h, live, s[j][h]);
  }
}

template <int G>
void blocks_dot_group(const float* blocks, size_t t0, size_t t1, int d, const float* q, float* out, size_t ldo) {
  size_t b = t0 / kOrderBlock;
  const size_t end = (t1 + kOrderBlock - 1) / kOrderBlock;
  if (cpu_has_avx512()) {
    for (; b + 4 <= end; b += 4) blocks_dot_avx512<G, 4>(blocks, b, t0, t1, d, q, out, ldo);
    for (; b < end; ++b) blocks_dot_avx512<G, 1>(blocks, b, t0, t1, d, q, out, ldo);
    return;
  }
  for (; b < end; ++b) blocks_dot_avx2<G>(blocks, b, t0, t1, d, q, out, ldo);
}

}  // namespace

void blocks_dot_in_order(const float* blocks, size_t t0, size_t t1, int d, const float* q, int g, float* out,
                         size_t ldo) {
  if (t0 >= t1) return;
  if (!cpu_has_avx2()) return blocks_dot_in_order_ref(blocks, t0, t1, d, q, g, out, ldo);
  for_query_runs<4>(g, [&](auto G, int j) {
    blocks_dot_group<decltype(G)::value>(blocks, t0, t1, d, q + size_t(j) * d, out + size_t(j) * ldo, ldo);
  });
}

void rows_weighted_in_order_ref(const float* rows, size_t n, int d, const float* w, size_t ldw, int g, bool skip_zeros,
                                float* out, size_t ldo) {
  for (int j = 0; j < g; ++j)
    for (int c = 0; c < d; ++c) {
      float s = 0.0f;
      for (size_t t = 0; t < n; ++t) {
        const float x = w[size_t(j) * ldw + t];
        if (!skip_zeros || x != 0.0f) s += x * rows[t * d + size_t(c)];
      }
      out[size_t(j) * ldo + size_t(c)] = s;
    }
}

namespace {

// One weight vector at a time, the channels in the lanes of whatever vector unit the loader picked.
KVB_VECTOR_CLONES void rows_weighted_lanes(const float* rows, size_t n, int d, const float* w, bool skip_zeros,
                                           float* out) {
  std::fill(out, out + d, 0.0f);
  for (size_t t = 0; t < n; ++t) {
    const float x = w[t];
    if (skip_zeros && x == 0.0f) continue;
    const float* r = rows + t * d;
    for (int c = 0; c < d; ++c) out[c] += x * r[c];
  }
}

// G weight vectors over rows of 16 * NV channels, the G * NV sums in registers; a zero weight's sums
// masked off.
template <int G, int NV>
__attribute__((target("avx512f"))) void rows_weighted_avx512(const float* rows, size_t n, const float* w, size_t ldw,
                                                             bool skip_zeros, float* out, size_t ldo) {
  __m512 s[G][NV];
  for (auto& row : s)
    for (auto& x : row) x = _mm512_setzero_ps();
  for (size_t t = 0; t < n; ++t, rows += 16 * NV) {
    __m512 x[G];
    __mmask16 live[G];
    for (int j = 0; j < G; ++j) {
      const float wj = w[size_t(j) * ldw + t];
      x[j] = _mm512_set1_ps(wj);
      live[j] = !skip_zeros || wj != 0.0f ? __mmask16(0xffff) : __mmask16(0);
    }
    for (int v = 0; v < NV; ++v) {
      const __m512 r = _mm512_loadu_ps(rows + 16 * v);
      for (int j = 0; j < G; ++j) s[j][v] = _mm512_mask_add_ps(s[j][v], live[j], s[j][v], _mm512_mul_ps(x[j], r));
    }
  }
  for (int j = 0; j < G; ++j)
    for (int v = 0; v < NV; ++v) _mm512_storeu_ps(out + size_t(j) * ldo + 16 * v, s[j][v]);
}

}  // namespace

void rows_weighted_in_order(const float* rows, size_t n, int d, const float* w, size_t ldw, int g, bool skip_zeros,
                            float* out, size_t ldo) {
  // As many vectors at a time as their sums fit in the registers beside a row's loads.
  if (cpu_has_avx512() && d == 64)
    return for_query_runs<4>(g, [&](auto G, int j) {
      rows_weighted_avx512<decltype(G)::value, 4>(rows, n, w + j * ldw, ldw, skip_zeros, out + j * ldo, ldo);
    });
  if (cpu_has_avx512() && d == 128)
    return for_query_runs<3>(g, [&](auto G, int j) {
      rows_weighted_avx512<decltype(G)::value, 8>(rows, n, w + j * ldw, ldw, skip_zeros, out + j * ldo, ldo);
    });
  for (int j = 0; j < g; ++j) rows_weighted_lanes(rows, n, d, w + size_t(j) * ldw, skip_zeros, out + size_t(j) * ldo);
}

void ragged_rows_axpy(const float* rows, const uint16_t* widths, size_t n, const float* p, int g, float* acc, int ld) {
  for_query_runs<3>(g, [&](auto G, int j) {
    ragged_rows_axpy_group<decltype(G)::value>(rows, widths, n, p + size_t(j) * n, acc + size_t(j) * ld, ld);
  });
}

void ragged_rows_axpy_ref(const float* rows, const uint16_t* widths, size_t n, const float* p, int g, float* acc,
                          int ld) {
  for (int j = 0; j < g; ++j) {
    std::vector<double> sum(acc + size_t(j) * ld, acc + size_t(j + 1) * ld);
    const float* r = rows;
    for (size_t i = 0; i < n; r += widths[i], ++i)
      for (int c = 0; c < widths[i]; ++c) sum[size_t(c)] += double(p[size_t(j) * n + i]) * r[c];
    for (int c = 0; c < ld; ++c) acc[size_t(j) * ld + c] = static_cast<float>(sum[size_t(c)]);
  }
}

}  // namespace kvb
