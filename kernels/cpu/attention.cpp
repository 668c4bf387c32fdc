#include "kernels/cpu/attention.hpp"

#include <cblas.h>
#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace kvb {

void attention_prefill_blockwise(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d,
                                 float* out, float* colsum, int past) {
  constexpr int kBlock = 256;  // queries per block: the score block is kBlock x keys floats
  const int group = hq / hkv, nk = past + n;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int ldq = hq * d, ldk = hkv * d;
  const int blocks = (n + kBlock - 1) / kBlock;
  if (colsum) std::fill(colsum, colsum + size_t(hq) * nk, 0.0f);
    // One task per (head, block of queries), the largest blocks (last queries, most keys) first.
    // BLAS calls inside the parallel region run on the calling thread (OpenMP OpenBLAS), which
    // beats splitting these small products across threads.
#pragma omp parallel
  {
    std::vector<float> s(size_t(std::min(n, kBlock)) * nk);
    std::vector<float> cs(colsum ? size_t(hq) * nk : 0);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < hq * blocks; ++task) {
      const int h = task % hq, c0 = (blocks - 1 - task / hq) * kBlock;
      const int rows = std::min(kBlock, n - c0);
      const int keys = past + c0 + rows;  // causal: the block sees keys [0, past + c0 + rows)
      const float* kh = k + size_t(h / group) * d;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, scale, q + size_t(c0) * ldq + size_t(h) * d,
                  ldq, kh, ldk, 0.0f, s.data(), keys);
      for (int r = 0; r < rows; ++r) {
        float* row = s.data() + size_t(r) * keys;
        const int visible = past + c0 + r + 1;
        softmax_inplace(row, visible);
        std::fill(row + visible, row + keys, 0.0f);
        if (!cs.empty())
          for (int j = 0; j < visible; ++j) cs[size_t(h) * nk + j] += row[j];
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, keys, 1.0f, s.data(), keys,
                  v + size_t(h / group) * d, ldk, 0.0f, out + size_t(c0) * ldq + size_t(h) * d, ldq);
    }
    if (colsum) {
#pragma omp critical
      for (size_t i = 0; i < cs.size(); ++i) colsum[i] += cs[i];
    }
  }
}

namespace {

// n rounded up to a multiple of m.
constexpr int round_up(int n, int m) { return (n + m - 1) / m * m; }

// One key tile of the online softmax. Row r is position `first + r / group` (first: the query tile's
// first position less the key tile's) and sees the tile's scores up to it, at most `cols`
// (none: the row is zeroed and its state kept). The row's running max m and sum l are updated, its
// accumulator rescaled to the new max, and the scores replaced by their exponentials (0 where masked)
// for the product with V that follows.
KVB_VECTOR_CLONES void online_softmax_tile(float* s, int lds, int rows, int cols, int first, int group, float* m,
                                           float* l, float* acc, int d) {
  for (int r = 0; r < rows; ++r) {
    float* row = s + size_t(r) * lds;
    const int vis = std::clamp(first + r / group + 1, 0, cols);
    const float m_new = std::max(m[r], max_of(row, vis));
    const float sum = exp_shifted(row, vis, m_new);
    std::fill(row + vis, row + cols, 0.0f);
    if (vis == 0) continue;
    // The first visible tile has m = -inf and nothing accumulated yet.
    const float alpha = m[r] == -std::numeric_limits<float>::infinity() ? 0.0f : exp_poly(m[r] - m_new);
    float* a = acc + size_t(r) * d;
#pragma omp simd
    for (int c = 0; c < d; ++c) a[c] *= alpha;
    l[r] = l[r] * alpha + sum;
    m[r] = m_new;
  }
}

// Column sums from the kept exponentials of one key tile: tile entries are exp(s - m_t) with m_t the
// row's running max after that tile; the probability is that times exp(m_t - m) / l with the row's
// final max m and sum l. Row r belongs to head r % group.
KVB_VECTOR_CLONES void tile_column_sums(const float* p, int lds, int rows, int cols, int first, const float* m_tile,
                                        const float* m, const float* l, int group, float* const* cs) {
  for (int r = 0; r < rows; ++r) {
    const int vis = std::clamp(first + r / group + 1, 0, cols);
    if (vis == 0) continue;
    const float coef = exp_poly(m_tile[r] - m[r]) / l[r];
    const float* row = p + size_t(r) * lds;
    float* c = cs[r % group];
#pragma omp simd
    for (int j = 0; j < vis; ++j) c[j] += row[j] * coef;
  }
}

// Query rows are the positions of a tile times the group's heads: row p * group + j is position p0 + p
// of head g * group + j. Each product policy below supplies the tile sizes it runs best at, the
// multiple its row count is padded to (padding rows are zero queries whose output is dropped), and the
// two products of a key tile: s = q k^T for the tile's keys and acc += p v.

// Through BLAS: any CPU, any head size. Measured on a 2-core Zen 3 at 8K (SmolLM2 shapes): 96 x 128
// reached 97 GFLOP/s, 192 x 256 101, 384 x 512 109, larger no better; BLAS runs its products faster the
// larger they are, while a tile's scores (768 KiB) still stay in cache.
class BlasProducts {
 public:
  static constexpr int kRows = 384, kKeys = 512, kRowMultiple = 1;
  BlasProducts(const float* k, const float* v, int /*n*/, int hkv, int d) : k_(k), v_(v), ld_(hkv * d), d_(d) {}
  void scores(const float* qt, int rows, int g, int k0, int cols, float* s) const {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, d_, 1.0f, qt, d_,
                k_ + size_t(k0) * ld_ + size_t(g) * d_, ld_, 0.0f, s, kKeys);
  }
  void accumulate(const float* p, int rows, int g, int k0, int cols, float* acc) const {
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d_, cols, 1.0f, p, kKeys,
                v_ + size_t(k0) * ld_ + size_t(g) * d_, ld_, 1.0f, acc, d_);
  }

 private:
  const float *k_, *v_;
  int ld_, d_;
};

// Register tiles of 6 rows x 16 columns with AVX2 (12 accumulators, two loaded operands, one
// broadcast), 6 x 32 with AVX-512 (12 accumulators of 16 lanes), over keys and values packed once per
// attention call in panels as wide as the tile. BLAS packs its operands again on every call and runs
// these thin products (depth 64) at 55-60% of its peak on one core; the register tiles reach its peak
// (measured at 8K, SmolLM2 shapes). Each output lane is a chain of FMAs over the depth in order, in
// either width, so the AVX-512 tiles give the AVX2 tiles' numbers bit for bit. The two forms are
// spelled out twice because a target-specific intrinsic only inlines into a function of that target.
constexpr int kMicroRows = 6;

// c[i] += sum_e a[i * lda + e] * b[16 e .. 16 e + 16) for the 6 rows i: both products of a tile are this,
// the scores with a = queries and b = k^T panels, the output with a = exponentials and b = v panels.
__attribute__((target("avx2,fma"))) inline void tile_6x16_avx2(const float* a, size_t lda, const float* b, int depth,
                                                               __m256 (&c)[kMicroRows][2]) {
  for (int e = 0; e < depth; ++e) {
    const __m256 b0 = _mm256_loadu_ps(b + size_t(e) * 16), b1 = _mm256_loadu_ps(b + size_t(e) * 16 + 8);
#pragma GCC unroll 6
    for (int i = 0; i < kMicroRows; ++i) {
      const __m256 x = _mm256_broadcast_ss(a + size_t(i) * lda + e);
      c[i][0] = _mm256_fmadd_ps(x, b0, c[i][0]);
      c[i][1] = _mm256_fmadd_ps(x, b1, c[i][1]);
    }
  }
}

// s[rows x 16 panels] = q[rows x d] k^T, k^T packed as panels of 16 keys: key panel p, dimension e at
// (p * d + e) * 16. A panel (4 KiB at d = 64) stays in L1 across the row blocks.
__attribute__((target("avx2,fma"))) void scores_avx2(const float* q, int rows, int d, const float* kt, int panels,
                                                     float* s, int lds) {
  for (int p = 0; p < panels; ++p)
    for (int r0 = 0; r0 < rows; r0 += kMicroRows) {
      __m256 c[kMicroRows][2];
#pragma GCC unroll 6
      for (int i = 0; i < kMicroRows; ++i) c[i][0] = c[i][1] = _mm256_setzero_ps();
      tile_6x16_avx2(q + size_t(r0) * d, d, kt + size_t(p) * d * 16, d, c);
#pragma GCC unroll 6
      for (int i = 0; i < kMicroRows; ++i) {
        float* dst = s + size_t(r0 + i) * lds + size_t(p) * 16;
        _mm256_storeu_ps(dst, c[i][0]);
        _mm256_storeu_ps(dst + 8, c[i][1]);
      }
    }
}

// acc[rows x d] += p[rows x cols] v, v packed as panels of 16 columns: column panel c, key j at
// panel_stride * c + 16 j. The slice the inner loop streams (16 KiB for 256 keys) stays in L1 across
// the row blocks.
__attribute__((target("avx2,fma"))) void accumulate_avx2(const float* p, int lds, int rows, int cols, const float* vt,
                                                         size_t panel_stride, int d, float* acc) {
  for (int c0 = 0; c0 < d; c0 += 16)
    for (int r0 = 0; r0 < rows; r0 += kMicroRows) {
      __m256 c[kMicroRows][2];
      float* out = acc + size_t(r0) * d + c0;
#pragma GCC unroll 6
      for (int i = 0; i < kMicroRows; ++i) {
        c[i][0] = _mm256_loadu_ps(out + size_t(i) * d);
        c[i][1] = _mm256_loadu_ps(out + size_t(i) * d + 8);
      }
      tile_6x16_avx2(p + size_t(r0) * lds, lds, vt + size_t(c0 / 16) * panel_stride, cols, c);
#pragma GCC unroll 6
      for (int i = 0; i < kMicroRows; ++i) {
        _mm256_storeu_ps(out + size_t(i) * d, c[i][0]);
        _mm256_storeu_ps(out + size_t(i) * d + 8, c[i][1]);
      }
    }
}

// The same three with panels of 32.
__attribute__((target("avx512f"))) inline void tile_6x32_avx512(const float* a, size_t lda, const float* b, int depth,
                                                                __m512 (&c)[kMicroRows][2]) {
  for (int e = 0; e < depth; ++e) {
    const __m512 b0 = _mm512_loadu_ps(b + size_t(e) * 32), b1 = _mm512_loadu_ps(b + size_t(e) * 32 + 16);
#pragma GCC unroll 6
    for (int i = 0; i < kMicroRows; ++i) {
      const __m512 x = _mm512_set1_ps(a[size_t(i) * lda + e]);
      c[i][0] = _mm512_fmadd_ps(x, b0, c[i][0]);
      c[i][1] = _mm512_fmadd_ps(x, b1, c[i][1]);
    }
  }
}

__attribute__((target("avx512f"))) void scores_avx512(const float* q, int rows, int d, const float* kt, int panels,
                                                      float* s, int lds) {
  for (int p = 0; p < panels; ++p)
    for (int r0 = 0; r0 < rows; r0 += kMicroRows) {
      __m512 c[kMicroRows][2];
#pragma GCC unroll 6
      for (int i = 0; i < kMicroRows; ++i) c[i][0] = c[i][1] = _mm512_setzero_ps();
      tile_6x32_avx512(q + size_t(r0) * d, d, kt + size_t(p) * d * 32, d, c);
#pragma GCC unroll 6
      for (int i = 0; i < kMicroRows; ++i) {
        float* dst = s + size_t(r0 + i) * lds + size_t(p) * 32;
        _mm512_storeu_ps(dst, c[i][0]);
        _mm512_storeu_ps(dst + 16, c[i][1]);
      }
    }
}

__attribute__((target("avx512f"))) void accumulate_avx512(const float* p, int lds, int rows, int cols, const float* vt,
                                                          size_t panel_stride, int d, float* acc) {
  for (int c0 = 0; c0 < d; c0 += 32)
    for (int r0 = 0; r0 < rows; r0 += kMicroRows) {
      __m512 c[kMicroRows][2];
      float* out = acc + size_t(r0) * d + c0;
#pragma GCC unroll 6
      for (int i = 0; i < kMicroRows; ++i) {
        c[i][0] = _mm512_loadu_ps(out + size_t(i) * d);
        c[i][1] = _mm512_loadu_ps(out + size_t(i) * d + 16);
      }
      tile_6x32_avx512(p + size_t(r0) * lds, lds, vt + size_t(c0 / 32) * panel_stride, cols, c);
#pragma GCC unroll 6
      for (int i = 0; i < kMicroRows; ++i) {
        _mm512_storeu_ps(out + size_t(i) * d, c[i][0]);
        _mm512_storeu_ps(out + size_t(i) * d + 16, c[i][1]);
      }
    }
}

// Keys and values packed in panels of Panel (16: AVX2 tiles, 32: AVX-512 tiles); head sizes that are
// multiples of the panel.
template <int Panel>
class PackedProducts {
 public:
  // 96 rows x 256 keys: the tile's scores (96 KiB) stay in L2, a V panel's slice in L1.
  static constexpr int kRows = 96, kKeys = 256, kRowMultiple = kMicroRows;
  static bool usable(int d) { return d % Panel == 0 && (Panel == 32 ? cpu_has_avx512() : cpu_has_avx2()); }
  // Both packed once per call (each as large as k or v), in panels padded with zero keys:
  // kt_[g][key panel][e][Panel keys] and vt_[g][column panel][key][Panel columns].
  PackedProducts(const float* k, const float* v, int n, int hkv, int d)
      : d_(d), keys_(round_up(n, Panel)), kt_(size_t(hkv) * keys_ * d), vt_(kt_.size()) {
    const int ld = hkv * d, panels = keys_ / Panel;
#pragma omp parallel for schedule(static)
    for (int task = 0; task < hkv * panels; ++task) {
      const int g = task / panels, p = task % panels;
      float* kdst = kt_.data() + size_t(task) * d * Panel;
      for (int jj = 0; jj < Panel; ++jj) {
        const int key = p * Panel + jj;
        const float* ks = k + size_t(key) * ld + size_t(g) * d;
        const float* vs = v + size_t(key) * ld + size_t(g) * d;
        float* vdst = vt_.data() + size_t(g) * keys_ * d + size_t(key) * Panel;
        for (int e = 0; e < d; ++e) {
          kdst[size_t(e) * Panel + jj] = key < n ? ks[e] : 0.0f;
          vdst[size_t(e / Panel) * keys_ * Panel + e % Panel] = key < n ? vs[e] : 0.0f;
        }
      }
    }
  }
  void scores(const float* qt, int rows, int g, int k0, int cols, float* s) const {
    const float* kt = kt_.data() + (size_t(g) * keys_ + k0) * d_;
    const int panels = (cols + Panel - 1) / Panel;
    if constexpr (Panel == 32)
      scores_avx512(qt, rows, d_, kt, panels, s, kKeys);
    else
      scores_avx2(qt, rows, d_, kt, panels, s, kKeys);
  }
  void accumulate(const float* p, int rows, int g, int k0, int cols, float* acc) const {
    const float* vt = vt_.data() + size_t(g) * keys_ * d_ + size_t(k0) * Panel;
    if constexpr (Panel == 32)
      accumulate_avx512(p, kKeys, rows, cols, vt, size_t(keys_) * Panel, d_, acc);
    else
      accumulate_avx2(p, kKeys, rows, cols, vt, size_t(keys_) * Panel, d_, acc);
  }

 private:
  int d_, keys_;
  std::vector<float> kt_, vt_;
};

template <class Products>
void attention_fused(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d, float* out,
                     float* colsum, int past) {
  constexpr int kKeys = Products::kKeys;
  const int nk = past + n;
  const Products products(k, v, nk, hkv, d);
  const int group = hq / hkv;
  const int positions = std::max(1, Products::kRows / group);  // positions per task
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int ldq = hq * d;
  const int tiles = (n + positions - 1) / positions;
  if (colsum) std::fill(colsum, colsum + size_t(hq) * nk, 0.0f);
  std::vector<std::vector<float>> shares(colsum ? size_t(omp_get_max_threads()) : 0);
#pragma omp parallel
  {
    const int max_rows = round_up(positions * group, Products::kRowMultiple);
    // With column sums every key tile's exponentials and row maxima stay until the row's final max and
    // sum are known: rows x keys floats, like the blockwise kernel's score block; otherwise one tile.
    const int kept_tiles = colsum ? (nk + kKeys - 1) / kKeys : 1;
    std::vector<float> qt(size_t(max_rows) * d), s(size_t(max_rows) * kKeys * kept_tiles), acc(size_t(max_rows) * d),
        m(max_rows), l(max_rows), m_tiles(colsum ? size_t(max_rows) * kept_tiles : 0), cs(colsum ? size_t(hq) * nk : 0);
    std::vector<float*> cs_heads(group);
    // The last tiles (most keys) first, so the threads finish together.
    const auto run = [&](int task) {
      const int g = task % hkv, p0 = (tiles - 1 - task / hkv) * positions;
      const int np = std::min(positions, n - p0), rows = np * group;
      const int padded = round_up(rows, Products::kRowMultiple);
      // Queries scaled so the scores need no scaling; padding rows are zero and stay so.
      for (int p = 0; p < np; ++p)
        for (int j = 0; j < group; ++j) {
          const float* src = q + size_t(p0 + p) * ldq + size_t(g * group + j) * d;
          float* dst = qt.data() + (size_t(p) * group + j) * d;
          for (int c = 0; c < d; ++c) dst[c] = src[c] * scale;
        }
      std::fill(qt.begin() + size_t(rows) * d, qt.begin() + size_t(padded) * d, 0.0f);
      // Causal: the tile's last query, at position past + p0 + np - 1, sees keys [0, past + p0 + np).
      const int keys = past + p0 + np;
      std::fill(m.begin(), m.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.begin() + rows, 0.0f);
      std::fill(acc.begin(), acc.begin() + size_t(padded) * d, 0.0f);
      for (int k0 = 0, t = 0; k0 < keys; k0 += kKeys, ++t) {
        const int cols = std::min(kKeys, keys - k0);
        float* st = s.data() + size_t(colsum ? t : 0) * max_rows * kKeys;
        products.scores(qt.data(), padded, g, k0, cols, st);
        online_softmax_tile(st, kKeys, rows, cols, past + p0 - k0, group, m.data(), l.data(), acc.data(), d);
        if (colsum) std::copy(m.begin(), m.begin() + rows, m_tiles.begin() + size_t(t) * max_rows);
        products.accumulate(st, padded, g, k0, cols, acc.data());
      }
      for (int p = 0; p < np; ++p)
        for (int j = 0; j < group; ++j) {
          const size_t r = size_t(p) * group + j;
          const float inv = 1.0f / l[r];
          float* dst = out + size_t(p0 + p) * ldq + size_t(g * group + j) * d;
          for (int c = 0; c < d; ++c) dst[c] = acc[r * d + c] * inv;
        }
      if (!colsum) return;
      for (int k0 = 0, t = 0; k0 < keys; k0 += kKeys, ++t) {
        for (int j = 0; j < group; ++j) cs_heads[j] = cs.data() + size_t(g * group + j) * nk + k0;
        tile_column_sums(s.data() + size_t(t) * max_rows * kKeys, kKeys, rows, std::min(kKeys, keys - k0),
                         past + p0 - k0, m_tiles.data() + size_t(t) * max_rows, m.data(), l.data(), group,
                         cs_heads.data());
      }
    };
    if (colsum) {
      // Column sums the same from run to run: each thread takes fixed tasks in a fixed order, and the
      // threads' shares are added in thread order below (a thread count gives one set of sums).
#pragma omp for schedule(static, 1)
      for (int task = 0; task < hkv * tiles; ++task) run(task);
      shares[size_t(omp_get_thread_num())] = std::move(cs);
    } else {
#pragma omp for schedule(dynamic, 1)
      for (int task = 0; task < hkv * tiles; ++task) run(task);
    }
  }
  for (const auto& share : shares)
    for (size_t i = 0; i < share.size(); ++i) colsum[i] += share[i];
}

}  // namespace

void attention_prefill_fused(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d, float* out,
                             float* colsum, int past) {
  if (PackedProducts<32>::usable(d))
    attention_fused<PackedProducts<32>>(q, k, v, n, hq, hkv, d, out, colsum, past);
  else if (PackedProducts<16>::usable(d))
    attention_fused<PackedProducts<16>>(q, k, v, n, hq, hkv, d, out, colsum, past);
  else
    attention_fused<BlasProducts>(q, k, v, n, hq, hkv, d, out, colsum, past);
}

}  // namespace kvb
