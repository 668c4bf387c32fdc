#include "kernels/cpu/attention.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace kvb {

void attention_prefill_blockwise(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d,
                                 float* out, float* colsum) {
  constexpr int kBlock = 256;  // queries per block: the score block is kBlock x n floats
  const int group = hq / hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int ldq = hq * d, ldk = hkv * d;
  const int blocks = (n + kBlock - 1) / kBlock;
  if (colsum) std::fill(colsum, colsum + size_t(hq) * n, 0.0f);
  // One task per (head, block of queries), the largest blocks (last queries, most keys) first.
  // BLAS calls inside the parallel region run on the calling thread (OpenMP OpenBLAS), which
  // beats splitting these small products across threads.
#pragma omp parallel
  {
    std::vector<float> s(size_t(std::min(n, kBlock)) * n);
    std::vector<float> cs(colsum ? size_t(hq) * n : 0);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < hq * blocks; ++task) {
      const int h = task % hq, c0 = (blocks - 1 - task / hq) * kBlock;
      const int rows = std::min(kBlock, n - c0);
      const int keys = c0 + rows;  // causal: the block sees keys [0, c0 + rows)
      const float* kh = k + size_t(h / group) * d;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, scale, q + size_t(c0) * ldq + size_t(h) * d,
                  ldq, kh, ldk, 0.0f, s.data(), keys);
      for (int r = 0; r < rows; ++r) {
        float* row = s.data() + size_t(r) * keys;
        const int visible = c0 + r + 1;
        softmax_inplace(row, visible);
        std::fill(row + visible, row + keys, 0.0f);
        if (!cs.empty())
          for (int j = 0; j < visible; ++j) cs[size_t(h) * n + j] += row[j];
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

// Query rows (positions x group heads) per task and keys per tile. Measured on a 2-core Zen 3 at 8K
// (SmolLM2 shapes): 96 x 128 reached 97 GFLOP/s, 192 x 256 101, 384 x 512 109, larger no better; BLAS
// runs its products faster the larger they are, while a tile's scores (768 KiB) still stay in cache.
constexpr int kTileRows = 384;
constexpr int kKeyTile = 512;

// One key tile of the online softmax. Row r is position `first + r / group` (first: the query tile's
// first position less the key tile's) and sees the tile's scores up to it, at most `cols`
// (none: the row is zeroed and its state kept). The row's running max m and sum l are updated, its
// accumulator rescaled to the new max, and the scores replaced by their exponentials (0 where masked)
// for the product with V that follows.
KVB_VECTOR_CLONES void online_softmax_tile(float* s, int rows, int cols, int first, int group, float* m, float* l,
                                           float* acc, int d) {
  for (int r = 0; r < rows; ++r) {
    float* row = s + size_t(r) * kKeyTile;
    const int vis = std::clamp(first + r / group + 1, 0, cols);
    float mx = -std::numeric_limits<float>::infinity();
#pragma omp simd reduction(max : mx)
    for (int j = 0; j < vis; ++j) mx = std::max(mx, row[j]);
    const float m_new = std::max(m[r], mx);
    float sum = 0.0f;
#pragma omp simd reduction(+ : sum)
    for (int j = 0; j < vis; ++j) {
      row[j] = exp_poly(row[j] - m_new);
      sum += row[j];
    }
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
KVB_VECTOR_CLONES void tile_column_sums(const float* p, int rows, int cols, int first, const float* m_tile,
                                        const float* m, const float* l, int group, float* const* cs) {
  for (int r = 0; r < rows; ++r) {
    const int vis = std::clamp(first + r / group + 1, 0, cols);
    if (vis == 0) continue;
    const float coef = exp_poly(m_tile[r] - m[r]) / l[r];
    const float* row = p + size_t(r) * kKeyTile;
    float* c = cs[r % group];
#pragma omp simd
    for (int j = 0; j < vis; ++j) c[j] += row[j] * coef;
  }
}

}  // namespace

void attention_prefill_fused(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d,
                             float* out, float* colsum) {
  const int group = hq / hkv;
  const int positions = std::max(1, kTileRows / group);  // positions per task
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int ldq = hq * d, ldk = hkv * d;
  const int tiles = (n + positions - 1) / positions;
  if (colsum) std::fill(colsum, colsum + size_t(hq) * n, 0.0f);
#pragma omp parallel
  {
    const size_t max_rows = size_t(positions) * group;
    // With column sums every key tile's exponentials and row maxima stay until the row's final max and
    // sum are known: rows x n floats, like the blockwise kernel's score block; otherwise one tile.
    const int kept_tiles = colsum ? (n + kKeyTile - 1) / kKeyTile : 1;
    std::vector<float> qt(max_rows * d), s(max_rows * kKeyTile * kept_tiles), acc(max_rows * d), m(max_rows),
        l(max_rows), m_tiles(colsum ? max_rows * kept_tiles : 0), cs(colsum ? size_t(hq) * n : 0);
    std::vector<float*> cs_heads(group);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < hkv * tiles; ++task) {
      // The last tiles (most keys) first, so the threads finish together.
      const int g = task % hkv, p0 = (tiles - 1 - task / hkv) * positions;
      const int np = std::min(positions, n - p0), rows = np * group;
      // Row p * group + j is position p0 + p of head g * group + j, scaled so the scores need no scaling.
      for (int p = 0; p < np; ++p)
        for (int j = 0; j < group; ++j) {
          const float* src = q + size_t(p0 + p) * ldq + size_t(g * group + j) * d;
          float* dst = qt.data() + (size_t(p) * group + j) * d;
          for (int c = 0; c < d; ++c) dst[c] = src[c] * scale;
        }
      const float* kg = k + size_t(g) * d;
      const float* vg = v + size_t(g) * d;
      const int keys = p0 + np;  // causal: the tile's last position sees keys [0, p0 + np)
      std::fill(m.begin(), m.begin() + rows, -std::numeric_limits<float>::infinity());
      std::fill(l.begin(), l.begin() + rows, 0.0f);
      std::fill(acc.begin(), acc.begin() + size_t(rows) * d, 0.0f);
      for (int k0 = 0, t = 0; k0 < keys; k0 += kKeyTile, ++t) {
        const int cols = std::min(kKeyTile, keys - k0);
        const int kept = colsum ? t : 0;
        float* st = s.data() + size_t(kept) * max_rows * kKeyTile;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, cols, d, 1.0f, qt.data(), d,
                    kg + size_t(k0) * ldk, ldk, 0.0f, st, kKeyTile);
        online_softmax_tile(st, rows, cols, p0 - k0, group, m.data(), l.data(), acc.data(), d);
        if (colsum) std::copy(m.begin(), m.begin() + rows, m_tiles.begin() + size_t(t) * max_rows);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, cols, 1.0f, st, kKeyTile,
                    vg + size_t(k0) * ldk, ldk, 1.0f, acc.data(), d);
      }
      for (int p = 0; p < np; ++p)
        for (int j = 0; j < group; ++j) {
          const size_t r = size_t(p) * group + j;
          const float inv = 1.0f / l[r];
          float* dst = out + size_t(p0 + p) * ldq + size_t(g * group + j) * d;
          for (int c = 0; c < d; ++c) dst[c] = acc[r * d + c] * inv;
        }
      if (!colsum) continue;
      for (int k0 = 0, t = 0; k0 < keys; k0 += kKeyTile, ++t) {
        for (int j = 0; j < group; ++j) cs_heads[j] = cs.data() + size_t(g * group + j) * n + k0;
        tile_column_sums(s.data() + size_t(t) * max_rows * kKeyTile, rows, std::min(kKeyTile, keys - k0),
                         p0 - k0, m_tiles.data() + size_t(t) * max_rows, m.data(),
                         l.data(), group, cs_heads.data());
      }
    }
    if (colsum) {
#pragma omp critical
      for (size_t i = 0; i < cs.size(); ++i) colsum[i] += cs[i];
    }
  }
}

}  // namespace kvb
