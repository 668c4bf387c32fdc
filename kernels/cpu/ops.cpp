#include "kernels/cpu/ops.hpp"

#include <cblas.h>

#include <algorithm>
#include <array>
#include <bit>
#include <cmath>
#include <limits>

#include "harness/util/error.hpp"
#include "kernels/cpu/avx2.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace kvb {

void linear_ref(const float* x, const float* w, const float* bias, int n, int in, int out, float* y) {
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o) {
      double acc = bias ? bias[o] : 0.0;
      for (int k = 0; k < in; ++k) acc += static_cast<double>(x[size_t(i) * in + k]) * w[size_t(o) * in + k];
      y[size_t(i) * out + o] = static_cast<float>(acc);
    }
}

void add_bias(float* y, const float* bias, int n, int out) {
#pragma omp parallel for schedule(static) if (n > 1)
  for (int i = 0; i < n; ++i)
    for (int o = 0; o < out; ++o) y[size_t(i) * out + o] += bias[o];
}

namespace {

// Each token's product with a weight row in one fixed order whatever the batch: four accumulators
// over blocks of 32 inputs, then the tail. T tokens (1 or 2) share each weight vector loaded (eight
// accumulators and four weight registers for a pair); the row stays in L1 for the next pair.
template <int T>
__attribute__((target("avx2,fma"))) inline void gemv_f32_row_avx2(const float* row, const float* x, int in, int out,
                                                                  int o, int b, float* y) {
  const int k32 = in / 32 * 32;
  constexpr int kPrefetch = 512;  // weights ahead
  __m256 a[T][4];
  for (auto& acc : a)
    for (auto& v : acc) v = _mm256_setzero_ps();
  for (int k = 0; k < k32; k += 32) {
    _mm_prefetch(reinterpret_cast<const char*>(row + k + kPrefetch), _MM_HINT_T0);
    __m256 wv[4];
    for (int j = 0; j < 4; ++j) wv[j] = _mm256_loadu_ps(row + k + 8 * j);
    for (int t = 0; t < T; ++t)
      for (int j = 0; j < 4; ++j)
        a[t][j] = _mm256_fmadd_ps(_mm256_loadu_ps(x + size_t(b + t) * in + k + 8 * j), wv[j], a[t][j]);
  }
  for (int t = 0; t < T; ++t) {
    const float* xt = x + size_t(b + t) * in;
    float tail = 0;
    for (int k = k32; k < in; ++k) tail += xt[k] * row[k];
    y[size_t(b + t) * out + o] =
        hsum_avx2(_mm256_add_ps(_mm256_add_ps(a[t][0], a[t][1]), _mm256_add_ps(a[t][2], a[t][3]))) + tail;
  }
}

__attribute__((target("avx2,fma"))) void gemv_f32_avx2(const float* x, const float* w, int n, int in, int out,
                                                       float* y) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < out; ++o) {
    const float* row = w + size_t(o) * in;
    int b = 0;
    for (; b + 2 <= n; b += 2) gemv_f32_row_avx2<2>(row, x, in, out, o, b, y);
    if (b < n) gemv_f32_row_avx2<1>(row, x, in, out, o, b, y);
  }
}

void gemv_f32_portable(const float* x, const float* w, int n, int in, int out, float* y) {
#pragma omp parallel for schedule(static)
  for (int o = 0; o < out; ++o)
    for (int b = 0; b < n; ++b) {
      const float* xb = x + size_t(b) * in;
      const float* row = w + size_t(o) * in;
      float s = 0;
      for (int k = 0; k < in; ++k) s += xb[k] * row[k];
      y[size_t(b) * out + o] = s;
    }
}

}  // namespace

void linear_tokens(const float* x, const float* w, const float* bias, int n, int in, int out, float* y) {
  if (cpu_has_avx2())
    gemv_f32_avx2(x, w, n, in, out, y);
  else
    gemv_f32_portable(x, w, n, in, out, y);
  if (bias) add_bias(y, bias, n, out);
}

void linear(const float* x, const float* w, const float* bias, int n, int in, int out, float* y) {
  if (n == 1) return linear_tokens(x, w, bias, 1, in, out, y);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, out, in, 1.0f, x, in, w, in, 0.0f, y, out);
  if (bias) add_bias(y, bias, n, out);
}

void linear_widened(const float* x, const float* bias, int n, int in, int out, float* y,
                    const std::function<void(int, int, float*)>& widen) {
  // Widening a block costs `in` operations per row against 2 n `in` for its products.
  constexpr int kBlock = 256;
  std::vector<float> wf(size_t(std::min(kBlock, out)) * in);
  for (int o0 = 0; o0 < out; o0 += kBlock) {
    const int rows = std::min(kBlock, out - o0);
    widen(o0, rows, wf.data());
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, rows, in, 1.0f, x, in, wf.data(), in, 0.0f, y + o0, out);
  }
  if (bias) add_bias(y, bias, n, out);
}

void rmsnorm_ref(const float* x, const float* w, int n, int dim, float eps, float* y) {
  for (int i = 0; i < n; ++i) {
    double ss = 0;
    for (int k = 0; k < dim; ++k) ss += static_cast<double>(x[size_t(i) * dim + k]) * x[size_t(i) * dim + k];
    const double r = 1.0 / std::sqrt(ss / dim + eps);
    for (int k = 0; k < dim; ++k) y[size_t(i) * dim + k] = static_cast<float>(x[size_t(i) * dim + k] * r * w[k]);
  }
}

namespace {

constexpr int kNormRows = 8;

// Each row's sum of squares is one float chain in the order of its elements, 3-4 cycles an element: rows
// side by side on the lanes of one vector pay that latency once for eight rows. Eight elements of each of
// eight rows are loaded and transposed, so that the k-th register holds element k of every row; lanes past
// the last row read it again and are not kept; the elements past the last multiple of 8, one by one.
__attribute__((target("avx2,fma"))) void sums_of_squares_avx2(const float* x, int rows, int dim, float* ss) {
  const float* row[kNormRows];
  for (int r = 0; r < kNormRows; ++r) row[r] = x + size_t(std::min(r, rows - 1)) * dim;
  __m256 acc = _mm256_setzero_ps();
  int k = 0;
  for (; k + 8 <= dim; k += 8) {
    __m256 v[8];
    for (int r = 0; r < 8; ++r) v[r] = _mm256_loadu_ps(row[r] + k);
    __m256 col[8];  // element k + j of every row
    transpose8_avx2(v, col);
    for (int j = 0; j < 8; ++j) acc = _mm256_add_ps(acc, _mm256_mul_ps(col[j], col[j]));
  }
  alignas(32) float out[kNormRows];
  _mm256_store_ps(out, acc);
  for (int r = 0; r < rows; ++r) {
    float s = out[r];
    for (int t = k; t < dim; ++t) s += row[r][t] * row[r][t];
    ss[r] = s;
  }
}

void sums_of_squares_portable(const float* x, int rows, int dim, float* ss) {
  for (int r = 0; r < rows; ++r) {
    const float* xr = x + size_t(r) * dim;
    float s = 0;
    for (int k = 0; k < dim; ++k) s += xr[k] * xr[k];
    ss[r] = s;
  }
}

}  // namespace

void rmsnorm(const float* x, const float* w, int n, int dim, float eps, float* y) {
  auto* sums = cpu_has_avx2() && n > 1 ? sums_of_squares_avx2 : sums_of_squares_portable;
  const int groups = (n + kNormRows - 1) / kNormRows;
  // A decode batch's rows take about a microsecond on one thread, less than waking the others.
#pragma omp parallel for schedule(static) if (groups > 2)
  for (int g = 0; g < groups; ++g) {
    const int first = g * kNormRows, rows = std::min(kNormRows, n - first);
    float ss[kNormRows];
    sums(x + size_t(first) * dim, rows, dim, ss);
    for (int i = 0; i < rows; ++i) {
      const float* xi = x + size_t(first + i) * dim;
      float* yi = y + size_t(first + i) * dim;
      const float r = 1.0f / std::sqrt(ss[i] / static_cast<float>(dim) + eps);
      for (int k = 0; k < dim; ++k) yi[k] = xi[k] * r * w[k];
    }
  }
}

void layernorm_ref(const float* x, const float* w, const float* b, int n, int dim, float eps, float* y) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * dim;
    double mean = 0, var = 0;
    for (int k = 0; k < dim; ++k) mean += xi[k];
    mean /= dim;
    for (int k = 0; k < dim; ++k) var += (xi[k] - mean) * (xi[k] - mean);
    const double r = 1.0 / std::sqrt(var / dim + eps);
    for (int k = 0; k < dim; ++k) y[size_t(i) * dim + k] = static_cast<float>((xi[k] - mean) * r * w[k] + b[k]);
  }
}

void layernorm(const float* x, const float* w, const float* b, int n, int dim, float eps, float* y) {
#pragma omp parallel for schedule(static) if (n > 4)
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * dim;
    float* yi = y + size_t(i) * dim;
    // Two passes in double: a residual stream far from zero mean (Falcon's reach hundreds) loses
    // digits in a float sum of thousands of elements, and everything to cancellation as E[x^2]-E[x]^2.
    double sum = 0;
    for (int k = 0; k < dim; ++k) sum += xi[k];
    const double mean = sum / dim;
    double ss = 0;
    for (int k = 0; k < dim; ++k) ss += (xi[k] - mean) * (xi[k] - mean);
    const auto m = static_cast<float>(mean), r = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
    for (int k = 0; k < dim; ++k) yi[k] = (xi[k] - m) * r * w[k] + b[k];
  }
}

void gelu_ref(const float* x, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const double v = x[i];
    out[i] = static_cast<float>(0.5 * v * (1.0 + std::erf(v / std::sqrt(2.0))));
  }
}

// A batch's rows on the threads (8 x 1536 values at the default model, a pass of std::exp each, was 2% of
// a batch-8 decode step on one thread while the other waited); one token's row costs less than waking them.
void gelu(const float* x, size_t n, float* out) {
  constexpr float kInvSqrt2 = 0.70710678118654752f;
#pragma omp parallel for schedule(static) if (n > 4096)
  for (size_t i = 0; i < n; ++i) out[i] = 0.5f * x[i] * (1.0f + std::erf(x[i] * kInvSqrt2));
}

void swiglu_ref(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i];
    out[i] = static_cast<float>(g / (1.0 + std::exp(-g)) * up[i]);
  }
}

namespace {

constexpr double kPow2Fractions[32] = {0x1p+0,
                                       0x1.059b0d3158574p+0,
                                       0x1.0b5586cf9890fp+0,
                                       0x1.11301d0125b51p+0,
                                       0x1.172b83c7d517bp+0,
                                       0x1.1d4873168b9aap+0,
                                       0x1.2387a6e756238p+0,
                                       0x1.29e9df51fdee1p+0,
                                       0x1.306fe0a31b715p+0,
                                       0x1.371a7373aa9cbp+0,
                                       0x1.3dea64c123422p+0,
                                       0x1.44e086061892dp+0,
                                       0x1.4bfdad5362a27p+0,
                                       0x1.5342b569d4f82p+0,
                                       0x1.5ab07dd485429p+0,
                                       0x1.6247eb03a5585p+0,
                                       0x1.6a09e667f3bcdp+0,
                                       0x1.71f75e8ec5f74p+0,
                                       0x1.7a11473eb0187p+0,
                                       0x1.82589994cce13p+0,
                                       0x1.8ace5422aa0dbp+0,
                                       0x1.93737b0cdc5e5p+0,
                                       0x1.9c49182a3f090p+0,
                                       0x1.a5503b23e255dp+0,
                                       0x1.ae89f995ad3adp+0,
                                       0x1.b7f76f2fb5e47p+0,
                                       0x1.c199bdd85529cp+0,
                                       0x1.cb720dcef9069p+0,
                                       0x1.d5818dcfba487p+0,
                                       0x1.dfc97337b9b5fp+0,
                                       0x1.ea4afa2a490dap+0,
                                       0x1.f50765b6e4540p+0};  // 2^(j/32), rounded to double

// 2^(j/32)'s bits less j << 47: adding k << 47 for k = 32 i + j then gives the bits of 2^i 2^(j/32).
constexpr std::array<uint64_t, 32> kExpTable = [] {
  std::array<uint64_t, 32> t{};
  for (size_t j = 0; j < t.size(); ++j) t[j] = std::bit_cast<uint64_t>(kPow2Fractions[j]) - (uint64_t(j) << 47);
  return t;
}();
constexpr double kInvLn2x32 = 0x1.71547652b82fep+5, kShift = 0x1.8p+52;  // the shift leaves k in the low bits
constexpr double kC0 = 0x1.c6af84b912394p-20, kC1 = 0x1.ebfce50fac4f3p-13, kC2 = 0x1.62e42ff0c52d6p-6;
constexpr float kExpTableLimit = 88.0f;

inline float swiglu_one(float g, float up) { return g / (1.0f + std::exp(-g)) * up; }

// The lanes of a vector's e^x at or past the table's limit (or NaN, bits set in `far`) from std::exp,
// which handles overflow, underflow and NaN.
inline void exp_far_lanes(const float* x, float* e, unsigned far, int lanes) {
  for (int l = 0; l < lanes; ++l)
    if (far >> l & 1) e[l] = std::exp(x[l]);
}

// GCC 12's AVX-512 intrinsics pass an undefined vector as the unused merge source, which
// -Wmaybe-uninitialized reports in every caller (GCC PR105593, fixed in 13).
#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// exp_table on eight doubles; the table in four registers, looked up by two-source permutes (which read
// the index's low four bits) and a blend on its fifth.
__attribute__((target("avx512f"))) inline __m512d exp_table_avx512(__m512d x, const __m512i* table) {
  const __m512d shifted = _mm512_fmadd_pd(x, _mm512_set1_pd(kInvLn2x32), _mm512_set1_pd(kShift));
  const __m512i k = _mm512_castpd_si512(shifted);
  const __m512d r = _mm512_fmsub_pd(_mm512_set1_pd(kInvLn2x32), x, _mm512_sub_pd(shifted, _mm512_set1_pd(kShift)));
  const __mmask8 upper = _mm512_test_epi64_mask(k, _mm512_set1_epi64(16));
  const __m512i t = _mm512_mask_blend_epi64(upper, _mm512_permutex2var_epi64(table[0], k, table[1]),
                                            _mm512_permutex2var_epi64(table[2], k, table[3]));
  const __m512d s = _mm512_castsi512_pd(_mm512_add_epi64(t, _mm512_slli_epi64(k, 47)));
  const __m512d z = _mm512_fmadd_pd(_mm512_set1_pd(kC0), r, _mm512_set1_pd(kC1));
  const __m512d y =
      _mm512_fmadd_pd(z, _mm512_mul_pd(r, r), _mm512_fmadd_pd(_mm512_set1_pd(kC2), r, _mm512_set1_pd(1.0)));
  return _mm512_mul_pd(y, s);
}

__attribute__((target("avx512f"))) void swiglu_avx512(const float* gate, const float* up, size_t n, float* out) {
  __m512i table[4];
  for (int i = 0; i < 4; ++i) table[i] = _mm512_loadu_si512(kExpTable.data() + 8 * i);
  const __m512i sign = _mm512_set1_epi32(int(0x80000000u));
  const __m512 one = _mm512_set1_ps(1.0f);
  size_t i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 g = _mm512_loadu_ps(gate + i), x = _mm512_castsi512_ps(_mm512_xor_si512(_mm512_castps_si512(g), sign));
    const __m256 lo = _mm512_cvtpd_ps(exp_table_avx512(_mm512_cvtps_pd(_mm512_castps512_ps256(x)), table));
    const __m256 hi = _mm512_cvtpd_ps(
        exp_table_avx512(_mm512_cvtps_pd(_mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(x), 1))), table));
    __m512 e =
        _mm512_castpd_ps(_mm512_insertf64x4(_mm512_castps_pd(_mm512_castps256_ps512(lo)), _mm256_castps_pd(hi), 1));
    if (const __mmask16 far = _mm512_cmp_ps_mask(_mm512_abs_ps(g), _mm512_set1_ps(kExpTableLimit), _CMP_NLT_UQ)) {
      alignas(64) float xs[16], es[16];
      _mm512_store_ps(xs, x);
      _mm512_store_ps(es, e);
      exp_far_lanes(xs, es, far, 16);
      e = _mm512_load_ps(es);
    }
    _mm512_storeu_ps(out + i, _mm512_mul_ps(_mm512_div_ps(g, _mm512_add_ps(one, e)), _mm512_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = swiglu_one(gate[i], up[i]);
}
#pragma GCC diagnostic pop

// The same on four doubles, the table looked up by a gather.
__attribute__((target("avx2,fma"))) inline __m256d exp_table_avx2(__m256d x) {
  const __m256d shifted = _mm256_fmadd_pd(x, _mm256_set1_pd(kInvLn2x32), _mm256_set1_pd(kShift));
  const __m256i k = _mm256_castpd_si256(shifted);
  const __m256d r = _mm256_fmsub_pd(_mm256_set1_pd(kInvLn2x32), x, _mm256_sub_pd(shifted, _mm256_set1_pd(kShift)));
  const __m256i t = _mm256_i64gather_epi64(reinterpret_cast<const long long*>(kExpTable.data()),
                                           _mm256_and_si256(k, _mm256_set1_epi64x(31)), 8);
  const __m256d s = _mm256_castsi256_pd(_mm256_add_epi64(t, _mm256_slli_epi64(k, 47)));
  const __m256d z = _mm256_fmadd_pd(_mm256_set1_pd(kC0), r, _mm256_set1_pd(kC1));
  const __m256d y =
      _mm256_fmadd_pd(z, _mm256_mul_pd(r, r), _mm256_fmadd_pd(_mm256_set1_pd(kC2), r, _mm256_set1_pd(1.0)));
  return _mm256_mul_pd(y, s);
}

__attribute__((target("avx2,fma"))) void swiglu_avx2(const float* gate, const float* up, size_t n, float* out) {
  const __m256 sign = _mm256_castsi256_ps(_mm256_set1_epi32(int(0x80000000u))), one = _mm256_set1_ps(1.0f);
  size_t i = 0;
  for (; i + 8 <= n; i += 8) {
    const __m256 g = _mm256_loadu_ps(gate + i), x = _mm256_xor_ps(g, sign);
    const __m128 lo = _mm256_cvtpd_ps(exp_table_avx2(_mm256_cvtps_pd(_mm256_castps256_ps128(x))));
    const __m128 hi = _mm256_cvtpd_ps(exp_table_avx2(_mm256_cvtps_pd(_mm256_extractf128_ps(x, 1))));
    __m256 e = _mm256_insertf128_ps(_mm256_castps128_ps256(lo), hi, 1);
    const __m256 far = _mm256_cmp_ps(_mm256_andnot_ps(sign, g), _mm256_set1_ps(kExpTableLimit), _CMP_NLT_UQ);
    if (const int lanes = _mm256_movemask_ps(far)) {
      alignas(32) float xs[8], es[8];
      _mm256_store_ps(xs, x);
      _mm256_store_ps(es, e);
      exp_far_lanes(xs, es, unsigned(lanes), 8);
      e = _mm256_load_ps(es);
    }
    _mm256_storeu_ps(out + i, _mm256_mul_ps(_mm256_div_ps(g, _mm256_add_ps(one, e)), _mm256_loadu_ps(up + i)));
  }
  for (; i < n; ++i) out[i] = swiglu_one(gate[i], up[i]);
}

void swiglu_portable(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = 0; i < n; ++i) out[i] = swiglu_one(gate[i], up[i]);
}

}  // namespace

float exp_table(float x) {
  if (!(std::fabs(x) < kExpTableLimit)) return std::exp(x);
  const double xd = x, shifted = std::fma(xd, kInvLn2x32, kShift);
  const auto k = std::bit_cast<uint64_t>(shifted);
  const double r = std::fma(kInvLn2x32, xd, -(shifted - kShift));
  const double s = std::bit_cast<double>(kExpTable[k % 32] + (k << 47));
  const double y = std::fma(std::fma(kC0, r, kC1), r * r, std::fma(kC2, r, 1.0));
  return static_cast<float>(y * s);
}

void swiglu(const float* gate, const float* up, size_t n, float* out) {
  auto* kernel = cpu_has_avx512() ? swiglu_avx512 : cpu_has_avx2() ? swiglu_avx2 : swiglu_portable;
  // A batch-8 decode step's 8 x 1536 values take under a microsecond on the vector kernels, less than
  // waking the threads; a prefill's are spread over them in chunks of whole vectors.
  constexpr size_t kChunk = 1 << 14;
  const auto chunks = static_cast<std::ptrdiff_t>((n + kChunk - 1) / kChunk);
#pragma omp parallel for schedule(static) if (chunks > 1)
  for (std::ptrdiff_t c = 0; c < chunks; ++c) {
    const size_t at = size_t(c) * kChunk;
    kernel(gate + at, up + at, std::min(kChunk, n - at), out + at);
  }
}

namespace {

// Index pairs rotated together for dimension pair i of a head of size d.
inline std::pair<int, int> rope_pair(int i, int d, RopeStyle s) {
  return s == RopeStyle::Interleaved ? std::pair{2 * i, 2 * i + 1} : std::pair{i, i + d / 2};
}

inline void rotate(float* h, int a, int b, float c, float s) {
  const float x0 = h[a], x1 = h[b];
  h[a] = x0 * c - x1 * s;
  h[b] = x0 * s + x1 * c;
}

}  // namespace

void rope_ref(float* x, int n, int heads, int d, const int32_t* pos, std::span<const float> inv_freq, RopeStyle style) {
  for (int t = 0; t < n; ++t)
    for (int h = 0; h < heads; ++h) {
      float* hv = x + (size_t(t) * heads + h) * d;
      for (int i = 0; i < d / 2; ++i) {
        const double angle = static_cast<float>(pos[t]) * inv_freq[i];
        const auto [a, b] = rope_pair(i, d, style);
        rotate(hv, a, b, static_cast<float>(std::cos(angle)), static_cast<float>(std::sin(angle)));
      }
    }
}

RopeTable::RopeTable(std::vector<float> inv_freq, RopeStyle style) : inv_freq_(std::move(inv_freq)), style_(style) {}

void RopeTable::ensure(int max_pos) {
  if (max_pos < rows_) return;
  const int half = static_cast<int>(inv_freq_.size());
  const int rows = std::max(max_pos + 1, rows_ * 2);
  cos_.resize(size_t(rows) * half);
  sin_.resize(size_t(rows) * half);
  for (int p = rows_; p < rows; ++p)
    for (int i = 0; i < half; ++i) {
      const double angle = static_cast<float>(p) * inv_freq_[i];
      cos_[size_t(p) * half + i] = static_cast<float>(std::cos(angle));
      sin_[size_t(p) * half + i] = static_cast<float>(std::sin(angle));
    }
  rows_ = rows;
}

namespace {

// One token's heads rotated by their angles' cosines c and sines s: rotate() per pair, the pairs of
// each style in their own loop so that the compiler vectorises it (a step of a long DynaKV cache
// rotates every rebuilt key).
KVB_VECTOR_CLONES void rotate_token(float* x, int heads, int d, const float* c, const float* s, float sign,
                                    RopeStyle style) {
  const int half = d / 2;
  for (int h = 0; h < heads; ++h, x += d) {
    if (style == RopeStyle::Interleaved) {
      for (int i = 0; i < half; ++i) rotate(x, 2 * i, 2 * i + 1, c[i], sign * s[i]);
    } else {
      for (int i = 0; i < half; ++i) rotate(x, i, i + half, c[i], sign * s[i]);
    }
  }
}

}  // namespace

void RopeTable::rotate_rows(float* x, int n, int heads, int d, const int32_t* pos, float sign) const {
  const int half = d / 2;
  for (int t = 0; t < n; ++t) {
    if (pos[t] < 0 || pos[t] >= rows_)
      fail("internal: RoPE table of {} positions asked for position {} (ensure() it first)", rows_, pos[t]);
  }
  // A decode batch's rows (8 tokens x 9 heads x 64 at the default model) take under a microsecond on one
  // thread, less than waking the others.
#pragma omp parallel for schedule(static) if (size_t(n) * heads * d > 32768)
  for (int t = 0; t < n; ++t)
    rotate_token(x + size_t(t) * heads * d, heads, d, cos_.data() + size_t(pos[t]) * half,
                 sin_.data() + size_t(pos[t]) * half, sign, style_);
}

void RopeTable::apply(float* x, int n, int heads, int d, const int32_t* pos) const {
  rotate_rows(x, n, heads, d, pos, 1.0f);
}

void RopeTable::apply_inverse(float* x, int n, int heads, int d, const int32_t* pos) const {
  rotate_rows(x, n, heads, d, pos, -1.0f);
}

void exp_shifted_ref(float* x, int n, float shift, float scale) {
  for (int i = 0; i < n; ++i) x[i] = std::exp(x[i] * scale - shift);
}

namespace {

// exp_shifted's elements [i, n) (fewer than 16) eight at a time through a masked load, their sum added to s.
__attribute__((target("avx2,fma"))) inline __m256 exp_tail_avx2(float* x, int i, int n, __m256 sh, __m256 sc,
                                                                __m256 s) {
  for (; i < n; i += 8) {
    const __m256i lanes = _mm256_cmpgt_epi32(_mm256_set1_epi32(n - i), _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7));
    const __m256 a = _mm256_and_ps(_mm256_castsi256_ps(lanes),
                                   exp_avx2(_mm256_sub_ps(_mm256_mul_ps(_mm256_maskload_ps(x + i, lanes), sc), sh)));
    _mm256_maskstore_ps(x + i, lanes, a);
    s = _mm256_add_ps(s, a);
  }
  return s;
}

// Eight lanes at a time through exp_avx2, two chains in flight; the tail through a masked load.
__attribute__((target("avx2,fma"))) float exp_shifted_avx2(float* x, int n, float shift, float scale) {
  const __m256 sh = _mm256_set1_ps(shift), sc = _mm256_set1_ps(scale);
  __m256 s0 = _mm256_setzero_ps(), s1 = _mm256_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m256 a = exp_avx2(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i), sc), sh));
    const __m256 b = exp_avx2(_mm256_sub_ps(_mm256_mul_ps(_mm256_loadu_ps(x + i + 8), sc), sh));
    _mm256_storeu_ps(x + i, a);
    _mm256_storeu_ps(x + i + 8, b);
    s0 = _mm256_add_ps(s0, a);
    s1 = _mm256_add_ps(s1, b);
  }
  return hsum_avx2(_mm256_add_ps(exp_tail_avx2(x, i, n, sh, sc, s0), s1));
}

#pragma GCC diagnostic push
#pragma GCC diagnostic ignored "-Wmaybe-uninitialized"
#pragma GCC diagnostic ignored "-Wuninitialized"

// exp_avx2 on sixteen lanes, the same operations lane by lane.
__attribute__((target("avx512f"))) inline __m512 exp_avx512(__m512 x) {
  const __m512 lowest = _mm512_set1_ps(-87.0f), magic = _mm512_set1_ps(12582912.0f);
  const __m512 v = _mm512_min_ps(_mm512_set1_ps(88.0f), _mm512_max_ps(lowest, x));
  const __m512 fn = _mm512_sub_ps(_mm512_fmadd_ps(v, _mm512_set1_ps(1.44269504088896341f), magic), magic);
  __m512 r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(0.693359375f), v);
  r = _mm512_fnmadd_ps(fn, _mm512_set1_ps(-2.12194440e-4f), r);
  __m512 p = _mm512_set1_ps(1.9875691500e-4f);
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.3981999507e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(8.3334519073e-3f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(4.1665795894e-2f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(1.6666665459e-1f));
  p = _mm512_fmadd_ps(p, r, _mm512_set1_ps(5.0000001201e-1f));
  p = _mm512_add_ps(_mm512_fmadd_ps(_mm512_mul_ps(p, r), r, r), _mm512_set1_ps(1.0f));
  const __m512i e = _mm512_slli_epi32(_mm512_add_epi32(_mm512_cvtps_epi32(fn), _mm512_set1_epi32(127)), 23);
  const __mmask16 kept = _mm512_cmp_ps_mask(x, lowest, _CMP_NLT_UQ);  // not below -87 (a NaN is kept)
  return _mm512_maskz_mul_ps(kept, p, _mm512_castsi512_ps(e));
}

// exp_shifted_avx2 on sixteen lanes: a vector's low half is the AVX2 form's even block of eight, its high
// half the odd one, so the two sums are its two chains; the tail goes through the AVX2 form's steps.
__attribute__((target("avx512f,avx2,fma"))) float exp_shifted_avx512(float* x, int n, float shift, float scale) {
  const __m512 sh = _mm512_set1_ps(shift), sc = _mm512_set1_ps(scale);
  __m512 s = _mm512_setzero_ps();
  int i = 0;
  for (; i + 16 <= n; i += 16) {
    const __m512 a = exp_avx512(_mm512_sub_ps(_mm512_mul_ps(_mm512_loadu_ps(x + i), sc), sh));
    _mm512_storeu_ps(x + i, a);
    s = _mm512_add_ps(s, a);
  }
  const __m256 s0 = exp_tail_avx2(x, i, n, _mm256_set1_ps(shift), _mm256_set1_ps(scale), _mm512_castps512_ps256(s));
  return hsum_avx2(_mm256_add_ps(s0, _mm256_castpd_ps(_mm512_extractf64x4_pd(_mm512_castps_pd(s), 1))));
}

#pragma GCC diagnostic pop

KVB_VECTOR_CLONES float exp_shifted_portable(float* x, int n, float shift, float scale) {
  float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
  for (int i = 0; i < n; ++i) {
    x[i] = exp_poly(x[i] * scale - shift);
    sum += x[i];
  }
  return sum;
}

}  // namespace

float exp_shifted(float* x, int n, float shift, float scale) {
  if (cpu_has_avx512()) return exp_shifted_avx512(x, n, shift, scale);
  return cpu_has_avx2() ? exp_shifted_avx2(x, n, shift, scale) : exp_shifted_portable(x, n, shift, scale);
}

void softmax_inplace(float* x, int n) {
  const float inv = 1.0f / exp_shifted(x, n, max_of(x, n));
  for (int i = 0; i < n; ++i) x[i] *= inv;
}

void attention_ref(const float* q, const float* k, const float* v, int nq, int nk, int hq, int hkv, int d,
                   const int32_t* q_pos, const int32_t* k_pos, float* out) {
  const int group = hq / hkv;
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  std::vector<double> s(nk);
  for (int i = 0; i < nq; ++i)
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      const float* qi = q + (size_t(i) * hq + h) * d;
      double m = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < nk; ++j) {
        if (k_pos[j] > q_pos[i]) {
          s[j] = -std::numeric_limits<double>::infinity();
          continue;
        }
        const float* kj = k + (size_t(j) * hkv + g) * d;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(qi[c]) * kj[c];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (int j = 0; j < nk; ++j) {
        s[j] = std::isinf(s[j]) ? 0.0 : std::exp(s[j] - m);
        sum += s[j];
      }
      float* oi = out + (size_t(i) * hq + h) * d;
      for (int c = 0; c < d; ++c) {
        double acc = 0;
        for (int j = 0; j < nk; ++j)
          if (s[j] != 0.0) acc += s[j] * v[(size_t(j) * hkv + g) * d + c];
        oi[c] = static_cast<float>(acc / sum);
      }
    }
}

}  // namespace kvb
