#include "kernels/cpu/backward.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <cstring>
#include <vector>

#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace kvb {

// ---------------------------------------------------------------------------------------------------
// Linear

void linear_backward_ref(const float* x, const float* w, const float* dy, int n, int in, int out, float* dx, float* dw,
                         float* db) {
  if (dx)
    for (int i = 0; i < n; ++i)
      for (int k = 0; k < in; ++k) {
        double s = 0;
        for (int o = 0; o < out; ++o) s += double(dy[size_t(i) * out + o]) * w[size_t(o) * in + k];
        dx[size_t(i) * in + k] += static_cast<float>(s);
      }
  if (dw)
    for (int o = 0; o < out; ++o)
      for (int k = 0; k < in; ++k) {
        double s = 0;
        for (int i = 0; i < n; ++i) s += double(dy[size_t(i) * out + o]) * x[size_t(i) * in + k];
        dw[size_t(o) * in + k] += static_cast<float>(s);
      }
  if (db)
    for (int o = 0; o < out; ++o) {
      double s = 0;
      for (int i = 0; i < n; ++i) s += dy[size_t(i) * out + o];
      db[o] += static_cast<float>(s);
    }
}

void linear_backward(const float* x, const float* w, const float* dy, int n, int in, int out, float* dx, float* dw,
                     float* db) {
  if (dx) cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, in, out, 1.0f, dy, out, w, in, 1.0f, dx, in);
  if (dw) cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, out, in, n, 1.0f, dy, out, x, in, 1.0f, dw, in);
  if (db) {
#pragma omp parallel for schedule(static) if (size_t(n) * out > 65536)
    for (int o = 0; o < out; ++o) {
      float s = 0;
      for (int i = 0; i < n; ++i) s += dy[size_t(i) * out + o];
      db[o] += s;
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// RMSNorm

void rmsnorm_backward_ref(const float* x, const float* w, const float* dy, int n, int dim, float eps, float* dx,
                          float* dw) {
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * dim;
    const float* gi = dy + size_t(i) * dim;
    double ss = 0, dot = 0;
    for (int k = 0; k < dim; ++k) {
      ss += double(xi[k]) * xi[k];
      dot += double(gi[k]) * w[k] * xi[k];
    }
    const double r = 1.0 / std::sqrt(ss / dim + eps);
    for (int k = 0; k < dim; ++k) {
      dx[size_t(i) * dim + k] += static_cast<float>(r * w[k] * gi[k] - xi[k] * r * r * r * dot / dim);
      if (dw) dw[k] += static_cast<float>(double(gi[k]) * xi[k] * r);
    }
  }
}

void rmsnorm_backward(const float* x, const float* w, const float* dy, int n, int dim, float eps, float* dx,
                      float* dw) {
#pragma omp parallel if (n > 4)
  {
    std::vector<float> dw_local(dw ? size_t(dim) : 0, 0.0f);
#pragma omp for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* xi = x + size_t(i) * dim;
      const float* gi = dy + size_t(i) * dim;
      float* di = dx + size_t(i) * dim;
      float ss = 0, dot = 0;
      for (int k = 0; k < dim; ++k) {
        ss += xi[k] * xi[k];
        dot += gi[k] * w[k] * xi[k];
      }
      const float r = 1.0f / std::sqrt(ss / static_cast<float>(dim) + eps);
      const float c = r * r * r * dot / static_cast<float>(dim);
      for (int k = 0; k < dim; ++k) di[k] += r * w[k] * gi[k] - xi[k] * c;
      if (dw)
        for (int k = 0; k < dim; ++k) dw_local[k] += gi[k] * xi[k] * r;
    }
    if (dw) {
#pragma omp critical
      for (int k = 0; k < dim; ++k) dw[k] += dw_local[k];
    }
  }
}

// ---------------------------------------------------------------------------------------------------
// SwiGLU

void layernorm_backward_ref(const float* x, const float* w, const float* dy, int n, int dim, float eps, float* dx,
                            float* dw, float* db) {
  std::vector<double> xh(static_cast<size_t>(dim));
  for (int i = 0; i < n; ++i) {
    const float* xi = x + size_t(i) * dim;
    const float* gi = dy + size_t(i) * dim;
    double mean = 0, var = 0;
    for (int k = 0; k < dim; ++k) mean += xi[k];
    mean /= dim;
    for (int k = 0; k < dim; ++k) var += (xi[k] - mean) * (xi[k] - mean);
    const double r = 1.0 / std::sqrt(var / dim + eps);
    double mg = 0, mgx = 0;
    for (int k = 0; k < dim; ++k) {
      xh[k] = (xi[k] - mean) * r;
      mg += double(w[k]) * gi[k];
      mgx += double(w[k]) * gi[k] * xh[k];
    }
    mg /= dim;
    mgx /= dim;
    for (int k = 0; k < dim; ++k) {
      dx[size_t(i) * dim + k] += static_cast<float>(r * (double(w[k]) * gi[k] - mg - xh[k] * mgx));
      if (dw) dw[k] += static_cast<float>(gi[k] * xh[k]);
      if (db) db[k] += gi[k];
    }
  }
}

void layernorm_backward(const float* x, const float* w, const float* dy, int n, int dim, float eps, float* dx,
                        float* dw, float* db) {
#pragma omp parallel if (n > 4)
  {
    std::vector<float> dw_local(dw ? size_t(dim) : 0, 0.0f), db_local(db ? size_t(dim) : 0, 0.0f),
        xh(static_cast<size_t>(dim));
#pragma omp for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* xi = x + size_t(i) * dim;
      const float* gi = dy + size_t(i) * dim;
      float* di = dx + size_t(i) * dim;
      // The row statistics in double, as the forward kernel takes them.
      double sum = 0, ss = 0;
      for (int k = 0; k < dim; ++k) sum += xi[k];
      const double mean = sum / dim;
      for (int k = 0; k < dim; ++k) ss += (xi[k] - mean) * (xi[k] - mean);
      const auto m = static_cast<float>(mean), r = static_cast<float>(1.0 / std::sqrt(ss / dim + eps));
      float mg = 0, mgx = 0;
      for (int k = 0; k < dim; ++k) {
        xh[k] = (xi[k] - m) * r;
        mg += w[k] * gi[k];
        mgx += w[k] * gi[k] * xh[k];
      }
      mg /= static_cast<float>(dim);
      mgx /= static_cast<float>(dim);
      for (int k = 0; k < dim; ++k) di[k] += r * (w[k] * gi[k] - mg - xh[k] * mgx);
      if (dw)
        for (int k = 0; k < dim; ++k) dw_local[k] += gi[k] * xh[k];
      if (db)
        for (int k = 0; k < dim; ++k) db_local[k] += gi[k];
    }
#pragma omp critical
    {
      if (dw)
        for (int k = 0; k < dim; ++k) dw[k] += dw_local[k];
      if (db)
        for (int k = 0; k < dim; ++k) db[k] += db_local[k];
    }
  }
}

void gelu_backward_ref(const float* x, const float* dout, size_t n, float* dx) {
  const double inv_sqrt2 = 1.0 / std::sqrt(2.0), inv_sqrt2pi = 1.0 / std::sqrt(2.0 * M_PI);
  for (size_t i = 0; i < n; ++i) {
    const double v = x[i];
    dx[i] = static_cast<float>(dout[i] *
                               (0.5 * (1.0 + std::erf(v * inv_sqrt2)) + v * std::exp(-0.5 * v * v) * inv_sqrt2pi));
  }
}

void gelu_backward(const float* x, const float* dout, size_t n, float* dx) {
  constexpr float kInvSqrt2 = 0.70710678118654752f, kInvSqrt2Pi = 0.39894228040143268f;
#pragma omp parallel for schedule(static) if (n > 16384)
  for (size_t i = 0; i < n; ++i) {
    const float v = x[i];
    dx[i] = dout[i] * (0.5f * (1.0f + std::erf(v * kInvSqrt2)) + v * std::exp(-0.5f * v * v) * kInvSqrt2Pi);
  }
}

void swiglu_backward_ref(const float* gate, const float* up, const float* dout, size_t n, float* dgate, float* dup) {
  for (size_t i = 0; i < n; ++i) {
    const double g = gate[i], s = 1.0 / (1.0 + std::exp(-g));
    dgate[i] = static_cast<float>(dout[i] * up[i] * s * (1.0 + g * (1.0 - s)));
    dup[i] = static_cast<float>(dout[i] * g * s);
  }
}

void swiglu_backward(const float* gate, const float* up, const float* dout, size_t n, float* dgate, float* dup) {
#pragma omp parallel for schedule(static) if (n > 16384)
  for (size_t i = 0; i < n; ++i) {
    const float g = gate[i], s = 1.0f / (1.0f + std::exp(-g));
    dgate[i] = dout[i] * up[i] * s * (1.0f + g * (1.0f - s));
    dup[i] = dout[i] * g * s;
  }
}

// ---------------------------------------------------------------------------------------------------
// Attention

namespace {

// Queries per block: the score and gradient blocks are kBlock x n floats per thread.
constexpr int kBlock = 128;

}  // namespace

void attention_forward_ref(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d, float* out,
                           float* lse) {
  const int group = hq / hkv;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> s(static_cast<size_t>(n));
  for (int h = 0; h < hq; ++h) {
    const int g = h / group;
    for (int i = 0; i < n; ++i) {
      const float* qi = q + (size_t(i) * hq + h) * d;
      double m = -INFINITY;
      for (int j = 0; j <= i; ++j) {
        const float* kj = k + (size_t(j) * hkv + g) * d;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(qi[c]) * kj[c];
        s[j] = dot * scale;
        m = std::max(m, s[j]);
      }
      double sum = 0;
      for (int j = 0; j <= i; ++j) sum += std::exp(s[j] - m);
      const double l = m + std::log(sum);
      lse[size_t(h) * n + i] = static_cast<float>(l);
      for (int c = 0; c < d; ++c) {
        double o = 0;
        for (int j = 0; j <= i; ++j) o += std::exp(s[j] - l) * v[(size_t(j) * hkv + g) * d + c];
        out[(size_t(i) * hq + h) * d + c] = static_cast<float>(o);
      }
    }
  }
}

void attention_forward(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d, float* out,
                       float* lse) {
  const int group = hq / hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int ldq = hq * d, ldk = hkv * d;
  const int chunks = (n + kBlock - 1) / kBlock;
  const int tasks = hq * chunks;
  // One task per (head, block of queries), the largest blocks first; BLAS runs on the calling thread.
#pragma omp parallel
  {
    std::vector<float> s(size_t(std::min(n, kBlock)) * n);
#pragma omp for schedule(dynamic, 1)
    for (int task = 0; task < tasks; ++task) {
      const int h = task % hq, c0 = (chunks - 1 - task / hq) * kBlock, g = h / group;
      const int rows = std::min(kBlock, n - c0), keys = c0 + rows;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, scale, q + size_t(c0) * ldq + size_t(h) * d,
                  ldq, k + size_t(g) * d, ldk, 0.0f, s.data(), keys);
      for (int r = 0; r < rows; ++r) {
        float* row = s.data() + size_t(r) * keys;
        const int visible = c0 + r + 1;
        const float m = max_of(row, visible);
        const float sum = exp_shifted(row, visible, m);
        const float inv = 1.0f / sum;
        for (int j = 0; j < visible; ++j) row[j] *= inv;
        std::fill(row + visible, row + keys, 0.0f);
        lse[size_t(h) * n + c0 + r] = m + std::log(sum);
      }
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, keys, 1.0f, s.data(), keys, v + size_t(g) * d,
                  ldk, 0.0f, out + size_t(c0) * ldq + size_t(h) * d, ldq);
    }
  }
}

void attention_backward_ref(const float* q, const float* k, const float* v, const float* /*out*/, const float* /*lse*/,
                            const float* dout, int n, int hq, int hkv, int d, float* dq, float* dk, float* dv) {
  // Recomputes the probabilities and outputs in double from q, k, v alone.
  const int group = hq / hkv;
  const double scale = 1.0 / std::sqrt(double(d));
  std::vector<double> dkd(size_t(n) * hkv * d, 0.0), dvd(dkd.size(), 0.0), p(static_cast<size_t>(n)),
      dp(static_cast<size_t>(n));
  for (int h = 0; h < hq; ++h) {
    const int g = h / group;
    for (int i = 0; i < n; ++i) {
      const float* qi = q + (size_t(i) * hq + h) * d;
      const float* gi = dout + (size_t(i) * hq + h) * d;
      double m = -INFINITY;
      for (int j = 0; j <= i; ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(qi[c]) * k[(size_t(j) * hkv + g) * d + c];
        p[j] = dot * scale;
        m = std::max(m, p[j]);
      }
      double sum = 0;
      for (int j = 0; j <= i; ++j) sum += (p[j] = std::exp(p[j] - m));
      double D = 0;  // sum_j p_j (dO . v_j) = dO . O
      for (int j = 0; j <= i; ++j) {
        p[j] /= sum;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(gi[c]) * v[(size_t(j) * hkv + g) * d + c];
        dp[j] = dot;
        D += p[j] * dot;
      }
      for (int c = 0; c < d; ++c) {
        double acc = 0;
        for (int j = 0; j <= i; ++j) acc += p[j] * (dp[j] - D) * k[(size_t(j) * hkv + g) * d + c];
        dq[(size_t(i) * hq + h) * d + c] = static_cast<float>(acc * scale);
      }
      for (int j = 0; j <= i; ++j) {
        const double ds = p[j] * (dp[j] - D) * scale;
        for (int c = 0; c < d; ++c) {
          dkd[(size_t(j) * hkv + g) * d + c] += ds * qi[c];
          dvd[(size_t(j) * hkv + g) * d + c] += p[j] * gi[c];
        }
      }
    }
  }
  for (size_t i = 0; i < dkd.size(); ++i) {
    dk[i] = static_cast<float>(dkd[i]);
    dv[i] = static_cast<float>(dvd[i]);
  }
}

void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, int n, int hq, int hkv, int d, float* dq, float* dk, float* dv) {
  const int group = hq / hkv;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  const int ldq = hq * d, ldk = hkv * d;
  // Each query head accumulates its own dK/dV over all its query blocks (one task per head, so no two
  // threads write one buffer); the heads of a group are summed into their KV head at the end.
  std::vector<float> dkh(size_t(hq) * n * d, 0.0f), dvh(dkh.size(), 0.0f);
#pragma omp parallel
  {
    const size_t block = size_t(std::min(n, kBlock)) * n;
    std::vector<float> p(block), dp(block);
#pragma omp for schedule(dynamic, 1)
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      const float* kg = k + size_t(g) * d;
      const float* vg = v + size_t(g) * d;
      float* dkg = dkh.data() + size_t(h) * n * d;
      float* dvg = dvh.data() + size_t(h) * n * d;
      for (int c0 = 0; c0 < n; c0 += kBlock) {
        const int rows = std::min(kBlock, n - c0), keys = c0 + rows;
        const float* qb = q + size_t(c0) * ldq + size_t(h) * d;
        const float* gb = dout + size_t(c0) * ldq + size_t(h) * d;
        const float* ob = out + size_t(c0) * ldq + size_t(h) * d;
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, scale, qb, ldq, kg, ldk, 0.0f, p.data(),
                    keys);
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, keys, d, 1.0f, gb, ldq, vg, ldk, 0.0f, dp.data(),
                    keys);
        for (int r = 0; r < rows; ++r) {
          float* pr = p.data() + size_t(r) * keys;
          float* dr = dp.data() + size_t(r) * keys;
          const int visible = c0 + r + 1;
          exp_shifted(pr, visible, lse[size_t(h) * n + c0 + r]);
          float D = 0;  // dO . O
          for (int c = 0; c < d; ++c) D += gb[size_t(r) * ldq + c] * ob[size_t(r) * ldq + c];
          for (int j = 0; j < visible; ++j) dr[j] = pr[j] * (dr[j] - D);
          std::fill(pr + visible, pr + keys, 0.0f);
          std::fill(dr + visible, dr + keys, 0.0f);
        }
        cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, rows, d, keys, scale, dp.data(), keys, kg, ldk, 0.0f,
                    dq + size_t(c0) * ldq + size_t(h) * d, ldq);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, d, rows, scale, dp.data(), keys, qb, ldq, 1.0f, dkg,
                    d);
        cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, keys, d, rows, 1.0f, p.data(), keys, gb, ldq, 1.0f, dvg,
                    d);
      }
    }
  }
#pragma omp parallel for schedule(static)
  for (int t = 0; t < n; ++t)
    for (int g = 0; g < hkv; ++g) {
      float* a = dk + (size_t(t) * hkv + g) * d;
      float* b = dv + (size_t(t) * hkv + g) * d;
      std::fill(a, a + d, 0.0f);
      std::fill(b, b + d, 0.0f);
      for (int h = g * group; h < (g + 1) * group; ++h)
        for (int c = 0; c < d; ++c) {
          a[c] += dkh[(size_t(h) * n + t) * d + c];
          b[c] += dvh[(size_t(h) * n + t) * d + c];
        }
    }
}

// ---------------------------------------------------------------------------------------------------
// Loss and embedding

double cross_entropy_ref(const float* logits, const int32_t* targets, int n, int vocab, float grad_scale,
                         float* dlogits) {
  double total = 0;
  for (int i = 0; i < n; ++i) {
    const float* x = logits + size_t(i) * vocab;
    float* g = dlogits + size_t(i) * vocab;
    if (targets[i] < 0) {
      std::fill(g, g + vocab, 0.0f);
      continue;
    }
    double m = -INFINITY;
    for (int j = 0; j < vocab; ++j) m = std::max(m, double(x[j]));
    double sum = 0;
    for (int j = 0; j < vocab; ++j) sum += std::exp(x[j] - m);
    const double lse = m + std::log(sum);
    total += lse - x[targets[i]];
    for (int j = 0; j < vocab; ++j) g[j] = static_cast<float>((std::exp(x[j] - lse) - (j == targets[i])) * grad_scale);
  }
  return total;
}

double cross_entropy(const float* logits, const int32_t* targets, int n, int vocab, float grad_scale, float* dlogits) {
  double total = 0;
#pragma omp parallel for schedule(static) reduction(+ : total)
  for (int i = 0; i < n; ++i) {
    const float* x = logits + size_t(i) * vocab;
    float* g = dlogits + size_t(i) * vocab;
    const int t = targets[i];
    if (t < 0) {
      std::fill(g, g + vocab, 0.0f);
      continue;
    }
    const float m = *std::max_element(x, x + vocab), xt = x[t];
    if (g != x) std::memcpy(g, x, sizeof(float) * vocab);
    exp_shifted(g, vocab, m);
    double sum = 0;
    for (int j = 0; j < vocab; ++j) sum += g[j];
    total += double(m) + std::log(sum) - xt;
    const auto s = static_cast<float>(grad_scale / sum);
    for (int j = 0; j < vocab; ++j) g[j] *= s;
    g[t] -= grad_scale;
  }
  return total;
}

std::pair<double, double> distill_loss_ref(const float* logits, const float* teacher, const int32_t* targets, int n,
                                           int vocab, float ce_scale, float kl_scale, float* dlogits) {
  double ce = 0, kl = 0;
  std::vector<double> p(static_cast<size_t>(vocab)), pt(static_cast<size_t>(vocab));
  auto log_softmax = [&](const float* x, std::vector<double>& out) {
    double m = -INFINITY, sum = 0;
    for (int j = 0; j < vocab; ++j) m = std::max(m, double(x[j]));
    for (int j = 0; j < vocab; ++j) sum += std::exp(x[j] - m);
    for (int j = 0; j < vocab; ++j) out[size_t(j)] = x[j] - m - std::log(sum);
  };
  for (int i = 0; i < n; ++i) {
    const float* x = logits + size_t(i) * vocab;
    float* g = dlogits + size_t(i) * vocab;
    log_softmax(x, p);
    log_softmax(teacher + size_t(i) * vocab, pt);
    const int t = targets[i];
    if (t >= 0) ce -= p[size_t(t)];
    for (int j = 0; j < vocab; ++j) kl += std::exp(pt[size_t(j)]) * (pt[size_t(j)] - p[size_t(j)]);
    for (int j = 0; j < vocab; ++j) {
      const double q = std::exp(p[size_t(j)]);
      double d = kl_scale * (q - std::exp(pt[size_t(j)]));
      if (t >= 0) d += ce_scale * (q - (j == t));
      g[j] = static_cast<float>(d);
    }
  }
  return {ce, kl};
}

std::pair<double, double> distill_loss(const float* logits, const float* teacher, const int32_t* targets, int n,
                                       int vocab, float ce_scale, float kl_scale, float* dlogits) {
  double ce = 0, kl = 0;
#pragma omp parallel reduction(+ : ce, kl)
  {
    std::vector<float> pt(static_cast<size_t>(vocab));
#pragma omp for schedule(static)
    for (int i = 0; i < n; ++i) {
      const float* x = logits + size_t(i) * vocab;
      const float* y = teacher + size_t(i) * vocab;
      float* g = dlogits + size_t(i) * vocab;
      const int t = targets[i];
      const float m = *std::max_element(x, x + vocab), mt = *std::max_element(y, y + vocab);
      const float xt = t >= 0 ? x[t] : 0.0f;
      // log p_j = x_j - lse, log p_t,j = y_j - lse_t; KL = sum p_t,j (y_j - lse_t - x_j + lse).
      std::copy_n(y, vocab, pt.data());
      const double st = exp_shifted(pt.data(), vocab, mt);
      const double lse_t = double(mt) + std::log(st);
      double cross = 0;  // sum p_t,j (y_j - x_j)
      for (int j = 0; j < vocab; ++j) cross += double(pt[size_t(j)]) * (double(y[j]) - x[j]);
      cross /= st;
      if (g != x) std::memcpy(g, x, sizeof(float) * vocab);
      const double s = exp_shifted(g, vocab, m);
      const double lse = double(m) + std::log(s);
      if (t >= 0) ce += lse - xt;
      kl += cross - lse_t + lse;
      const auto a = static_cast<float>((ce_scale * (t >= 0 ? 1.0 : 0.0) + kl_scale) / s);
      const auto b = static_cast<float>(kl_scale / st);
      for (int j = 0; j < vocab; ++j) g[j] = g[j] * a - pt[size_t(j)] * b;
      if (t >= 0) g[t] -= ce_scale;
    }
  }
  return {ce, kl};
}

void embed_backward(const int32_t* ids, int n, int dim, const float* dout, float* dtable) {
  for (int i = 0; i < n; ++i)
    for (int k = 0; k < dim; ++k) dtable[size_t(ids[i]) * dim + k] += dout[size_t(i) * dim + k];
}

}  // namespace kvb
