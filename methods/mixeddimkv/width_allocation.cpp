#include "methods/mixeddimkv/width_allocation.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>
#include <sstream>

#include "harness/util/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

std::vector<ParamSpec> mixed_dim_params() {
  return {ParamSpec::integer("window", 8, 1, 4096, "observation window alpha (kept at full width, inside T)"),
          ParamSpec::text("widths", "0,0.125,0.25,1", "candidate width ratios; must include 0 and 1"),
          ParamSpec::boolean("top_up", true, "greedy top-up of the items that flip inside the final bracket")};
}

WidthSet parse_widths(const std::string& text, int head_dim, const std::string& param) {
  WidthSet ws;
  std::stringstream in(text);
  std::string item;
  while (std::getline(in, item, ',')) {
    size_t used = 0;
    double r = 0;
    try {
      r = std::stod(item, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used == 0 || item.find_first_not_of(" \t", used) != std::string::npos || !(r >= 0 && r <= 1))
      fail("parameter '{}': '{}' is not a ratio in [0, 1] (expected a list such as 0,0.125,0.25,1)", param, item);
    ws.rho.push_back(r);
  }
  std::sort(ws.rho.begin(), ws.rho.end());
  if (ws.rho.empty() || ws.rho.front() != 0.0 || ws.rho.back() != 1.0)
    fail("parameter '{}': the widths '{}' must include 0 (evict) and 1 (full width)", param, text);
  for (double r : ws.rho) {
    // Reduced widths snap down to a multiple of 8 dimensions (README.md §2).
    const int dim = r == 1.0 ? head_dim : static_cast<int>(std::floor(r * head_dim / 8.0)) * 8;
    if (r > 0 && r < 1 && (dim <= 0 || dim > head_dim - 8))
      fail("parameter '{}': ratio {} gives {} of {} dimensions; reduced widths need 8 to {}", param, r, dim, head_dim,
           head_dim - 8);
    if (!ws.dims.empty() && dim == ws.dims.back())
      fail("parameter '{}': ratios in '{}' give the same width {} twice", param, text, dim);
    ws.dims.push_back(dim);
    if (r > 0 && r < 1) ws.r_max = std::max(ws.r_max, dim);
  }
  // Costs in token units are the widths actually stored.
  for (size_t j = 0; j < ws.rho.size(); ++j) ws.rho[j] = double(ws.dims[j]) / head_dim;
  return ws;
}

std::vector<HeadSlice> head_slices(const PrefillView& v, GqaMode mode, int window) {
  if (window <= 0 || window >= v.n_tokens)
    fail("observation window {} must be between 1 and the prompt length - 1 ({})", window, v.n_tokens - 1);
  if (v.window < window || !v.q_window)
    fail("internal: the prefill provided {} window queries, the method needs {}", v.window, window);
  const int d = v.head_dim, hq = v.n_heads, hkv = v.n_kv_heads, G = hq / hkv;
  const int stored = mode == GqaMode::Repeat ? hq : hkv;
  std::vector<HeadSlice> out(stored);
  for (int s = 0; s < stored; ++s) {
    HeadSlice& h = out[s];
    const int g = mode == GqaMode::Repeat ? s / G : s;
    h.k = v.k + size_t(g) * d;
    h.v = v.v + size_t(g) * d;
    h.stride = hkv * d;
    const int q0 = mode == GqaMode::Repeat ? s : g * G, nq = mode == GqaMode::Repeat ? 1 : G;
    for (int qh = q0; qh < q0 + nq; ++qh)
      for (int i = 0; i < window; ++i) {
        h.q.push_back(v.q_window + (size_t(v.window - window + i) * hq + qh) * d);
        h.q_pos.push_back(v.n_tokens - window + i);
      }
  }
  return out;
}

namespace {

void check_basis(const LowRankBasis* basis, const WidthSet& ws, int d) {
  if (ws.r_max > 0 && (!basis || basis->rank < ws.r_max || basis->head_dim != d))
    fail("internal: widths up to {} need a basis of that rank", ws.r_max);
}

}  // namespace

HeadLosses width_losses(const HeadSlice& s, int N, int d, int window, const LowRankBasis* basis, const WidthSet& ws) {
  check_basis(basis, ws, d);
  const int prefix = N - window, M = static_cast<int>(s.q.size()), m = static_cast<int>(ws.rho.size());
  const int R = ws.r_max;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  HeadLosses out{prefix, m, std::vector<double>(size_t(prefix) * m, 0.0)};

  // Contiguous copies: keys, and (with reduced widths) keys, queries and values in the basis.
  std::vector<float> K(size_t(N) * d), Q(size_t(M) * d);
  for (int t = 0; t < N; ++t) std::copy_n(s.k + size_t(t) * s.stride, d, K.data() + size_t(t) * d);
  for (int i = 0; i < M; ++i) std::copy_n(s.q[i], d, Q.data() + size_t(i) * d);
  std::vector<double> vnorm2(prefix), vn(prefix);
  std::vector<float> KP, QP, VP;
  for (int t = 0; t < prefix; ++t) {
    double a = 0;
    for (int c = 0; c < d; ++c) a += double(s.v[size_t(t) * s.stride + c]) * s.v[size_t(t) * s.stride + c];
    vnorm2[t] = a;
    vn[t] = std::sqrt(a);
  }
  if (R > 0) {
    KP.resize(size_t(N) * R);
    QP.resize(size_t(M) * R);
    VP.resize(size_t(prefix) * R);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, N, R, d, 1.0f, K.data(), d, basis->k.data(), basis->rank,
                0.0f, KP.data(), R);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, M, R, d, 1.0f, Q.data(), d, basis->k.data(), basis->rank,
                0.0f, QP.data(), R);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, prefix, R, d, 1.0f, s.v, s.stride, basis->v.data(),
                basis->rank, 0.0f, VP.data(), R);
  }

  // Column sums over the window rows: of P, and of |P' - P| for each reduced width.
  std::vector<double> colP(prefix, 0.0);
  std::vector<std::vector<double>> absdiff(m);
  for (int j = 0; j < m; ++j)
    if (ws.rho[j] > 0 && ws.rho[j] < 1) absdiff[j].assign(prefix, 0.0);
  constexpr int kChunk = 16;
  std::vector<float> P(size_t(kChunk) * N), Pr(size_t(kChunk) * N);
  for (int i0 = 0; i0 < M; i0 += kChunk) {
    const int rows = std::min(kChunk, M - i0);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, N, d, scale, Q.data() + size_t(i0) * d, d, K.data(), d,
                0.0f, P.data(), N);
    for (int r = 0; r < rows; ++r) {
      const int visible = s.q_pos[i0 + r] + 1;
      float* row = P.data() + size_t(r) * N;
      softmax_inplace(row, visible);
      for (int t = 0; t < prefix; ++t) colP[t] += row[t];
    }
    for (int j = 0; j < m; ++j) {
      if (absdiff[j].empty()) continue;
      const int r_j = ws.dims[j];
      // (Q P_r)(K P_r)^T: the logits against keys reconstructed at width r_j.
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, N, r_j, scale, QP.data() + size_t(i0) * R, R,
                  KP.data(), R, 0.0f, Pr.data(), N);
      for (int r = 0; r < rows; ++r) {
        const int visible = s.q_pos[i0 + r] + 1;
        float* row = Pr.data() + size_t(r) * N;
        softmax_inplace(row, visible);
        const float* p = P.data() + size_t(r) * N;
        for (int t = 0; t < prefix; ++t) absdiff[j][t] += std::fabs(double(row[t]) - double(p[t]));
      }
    }
  }
  for (int t = 0; t < prefix; ++t) {
    double* L = out.loss.data() + size_t(t) * m;
    for (int j = 0; j < m; ++j) {
      if (ws.rho[j] == 0) {
        L[j] = 2.0 * colP[t] * vn[t];
      } else if (ws.rho[j] < 1) {
        // |V - V P P^T|^2 = |V|^2 - |V P|^2 for orthonormal P.
        double kept = 0;
        for (int c = 0; c < ws.dims[j]; ++c) kept += double(VP[size_t(t) * R + c]) * VP[size_t(t) * R + c];
        const double verr = std::sqrt(std::max(0.0, vnorm2[t] - kept));
        L[j] = absdiff[j][t] * vn[t] + colP[t] * verr;
      }
    }
  }
  return out;
}

HeadLosses width_losses_ref(const HeadSlice& s, int N, int d, int window, const LowRankBasis* basis,
                            const WidthSet& ws) {
  check_basis(basis, ws, d);
  const int prefix = N - window, M = static_cast<int>(s.q.size()), m = static_cast<int>(ws.rho.size());
  HeadLosses out{prefix, m, std::vector<double>(size_t(prefix) * m, 0.0)};
  auto at = [&](const float* base, int t, int c) { return double(base[size_t(t) * s.stride + c]); };
  // Attention of every window row over keys given as a function, in double.
  auto attention = [&](auto key) {
    std::vector<std::vector<double>> P(M);
    for (int i = 0; i < M; ++i) {
      const int visible = s.q_pos[i] + 1;
      P[i].assign(N, 0.0);
      double mx = -std::numeric_limits<double>::infinity();
      for (int t = 0; t < visible; ++t) {
        double z = 0;
        for (int c = 0; c < d; ++c) z += double(s.q[i][c]) * key(t, c);
        P[i][t] = z / std::sqrt(double(d));
        mx = std::max(mx, P[i][t]);
      }
      double sum = 0;
      for (int t = 0; t < visible; ++t) sum += (P[i][t] = std::exp(P[i][t] - mx));
      for (int t = 0; t < visible; ++t) P[i][t] /= sum;
    }
    return P;
  };
  // Row x of a reconstruction through the first r columns of basis B: x P P^T.
  auto reconstruct = [&](const float* base, const std::vector<float>& B, int r) {
    std::vector<double> out_rows(size_t(N) * d, 0.0);
    for (int t = 0; t < N; ++t) {
      std::vector<double> c(r, 0.0);
      for (int k = 0; k < r; ++k)
        for (int e = 0; e < d; ++e) c[k] += at(base, t, e) * B[size_t(e) * basis->rank + k];
      for (int e = 0; e < d; ++e)
        for (int k = 0; k < r; ++k) out_rows[size_t(t) * d + e] += c[k] * B[size_t(e) * basis->rank + k];
    }
    return out_rows;
  };
  const auto P = attention([&](int t, int c) { return at(s.k, t, c); });
  for (int j = 0; j < m; ++j) {
    if (ws.rho[j] == 1) continue;
    std::vector<std::vector<double>> Pp;
    std::vector<double> Vr;
    if (ws.rho[j] > 0) {
      const auto Kr = reconstruct(s.k, basis->k, ws.dims[j]);
      Vr = reconstruct(s.v, basis->v, ws.dims[j]);
      Pp = attention([&](int t, int c) { return Kr[size_t(t) * d + c]; });
    }
    for (int t = 0; t < prefix; ++t) {
      double vn = 0, verr = 0;
      for (int c = 0; c < d; ++c) {
        vn += at(s.v, t, c) * at(s.v, t, c);
        if (!Vr.empty()) verr += (at(s.v, t, c) - Vr[size_t(t) * d + c]) * (at(s.v, t, c) - Vr[size_t(t) * d + c]);
      }
      vn = std::sqrt(vn);
      verr = std::sqrt(verr);
      double sum = 0;
      for (int i = 0; i < M; ++i)
        sum += ws.rho[j] == 0 ? 2 * P[i][t] * vn : std::fabs(Pp[i][t] - P[i][t]) * vn + P[i][t] * verr;
      out.loss[size_t(t) * m + j] = sum;
    }
  }
  return out;
}

namespace {

// One allocation problem: items are (head, token) pairs of the given loss tables.
struct Problem {
  const std::vector<const HeadLosses*>& heads;
  const std::vector<double>& rho;
  std::vector<bool> allowed;

  template <typename F>
  void for_items(F f) const {
    for (size_t h = 0; h < heads.size(); ++h)
      for (int t = 0; t < heads[h]->tokens; ++t) f(h, t, heads[h]->loss.data() + size_t(t) * rho.size());
  }
  // argmin_j loss[j] + lambda rho_j, ties to the smaller width.
  int choose(const double* L, double lambda) const {
    int best = -1;
    double bv = 0;
    for (size_t j = 0; j < rho.size(); ++j) {
      if (!allowed[j]) continue;
      const double val = L[j] + lambda * rho[j];
      if (best < 0 || val < bv) {
        best = static_cast<int>(j);
        bv = val;
      }
    }
    return best;
  }
  double cost(double lambda) const {
    double c = 0;
    for_items([&](size_t, int, const double* L) { c += rho[choose(L, lambda)]; });
    return c;
  }
};

}  // namespace

WidthAllocation allocate_widths(const std::vector<const HeadLosses*>& heads, const std::vector<double>& rho,
                                double budget, bool top_up, const std::vector<bool>& allowed_in) {
  if (budget < 0) fail("internal: negative width budget {}", budget);
  std::vector<bool> allowed = allowed_in.empty() ? std::vector<bool>(rho.size(), true) : allowed_in;
  if (!allowed[0]) fail("internal: the allocation needs the zero width");
  Problem pb{heads, rho, allowed};
  double lo = 0, hi = 0;
  if (pb.cost(0) > budget) {
    // Above the largest breakpoint slope every item prefers width 0 (C = 0).
    double slope = 0;
    pb.for_items([&](size_t, int, const double* L) {
      for (size_t j = 1; j < rho.size(); ++j)
        if (allowed[j] && rho[j] > 0) slope = std::max(slope, (L[0] - L[j]) / rho[j]);
    });
    hi = slope * (1 + 1e-9) + std::numeric_limits<double>::denorm_min();
    for (int it = 0; it < 200 && hi - lo > 1e-9 * hi; ++it) {
      const double mid = 0.5 * (lo + hi);
      (pb.cost(mid) <= budget ? hi : lo) = mid;
    }
  }
  WidthAllocation a;
  a.lambda = hi;
  a.width.resize(heads.size());
  for (size_t h = 0; h < heads.size(); ++h) a.width[h].assign(heads[h]->tokens, 0);
  pb.for_items([&](size_t h, int t, const double* L) { a.width[h][t] = pb.choose(L, hi); });
  double cost = 0;
  pb.for_items([&](size_t h, int t, const double*) { cost += rho[a.width[h][t]]; });
  if (top_up && hi > 0) {
    // Items that flip inside the final bracket, best loss saved per unit first (ties by order).
    struct Up {
      size_t h;
      int t, to;
      double ratio, dcost;
    };
    std::vector<Up> ups;
    pb.for_items([&](size_t h, int t, const double* L) {
      const int from = a.width[h][t], to = pb.choose(L, lo);
      if (to != from && rho[to] > rho[from])
        ups.push_back({h, t, to, (L[from] - L[to]) / (rho[to] - rho[from]), rho[to] - rho[from]});
    });
    std::stable_sort(ups.begin(), ups.end(), [](const Up& x, const Up& y) { return x.ratio > y.ratio; });
    for (const Up& u : ups)
      if (cost + u.dcost <= budget + 1e-9) {
        a.width[u.h][u.t] = u.to;
        cost += u.dcost;
      }
  }
  a.cost = cost;
  double dual = -hi * budget;
  pb.for_items([&](size_t h, int t, const double* L) {
    a.primal += L[a.width[h][t]];
    dual += L[pb.choose(L, hi)] + hi * rho[pb.choose(L, hi)];
  });
  a.dual = dual;
  return a;
}

double width_cost(const std::vector<const HeadLosses*>& heads, const std::vector<double>& rho, double lambda) {
  return Problem{heads, rho, std::vector<bool>(rho.size(), true)}.cost(lambda);
}

MixedChoice solve_mixed(const std::vector<const HeadLosses*>& heads, const WidthSet& ws, double budget_with_bases,
                        double budget_without, bool top_up) {
  // Eviction only: widths {0, 1}, no basis to pay for.
  std::vector<bool> evict(ws.rho.size(), false);
  evict.front() = evict.back() = true;
  MixedChoice best{allocate_widths(heads, ws.rho, std::max(0.0, budget_without), top_up, evict), true};
  if (ws.r_max > 0 && budget_with_bases >= 0) {
    WidthAllocation full = allocate_widths(heads, ws.rho, budget_with_bases, top_up);
    if (full.primal < best.alloc.primal) best = {std::move(full), false};
  }
  return best;
}

std::vector<std::shared_ptr<const LowRankBasis>> head_bases(const PrefillView& v, GqaMode mode, int r_max) {
  const int stored = mode == GqaMode::Repeat ? v.n_heads : v.n_kv_heads, G = v.n_heads / v.n_kv_heads;
  const int d = v.head_dim, N = v.n_tokens;
  std::vector<std::shared_ptr<const LowRankBasis>> out(stored);
  if (r_max == 0) return out;
  std::vector<std::shared_ptr<const LowRankBasis>> per_kv(v.n_kv_heads);
#pragma omp parallel for schedule(dynamic, 1)
  for (int g = 0; g < v.n_kv_heads; ++g) {
    std::vector<float> k(size_t(N) * d), vv(size_t(N) * d);
    for (int t = 0; t < N; ++t) {
      std::copy_n(v.k + (size_t(t) * v.n_kv_heads + g) * d, d, k.data() + size_t(t) * d);
      std::copy_n(v.v + (size_t(t) * v.n_kv_heads + g) * d, d, vv.data() + size_t(t) * d);
    }
    per_kv[g] = std::make_shared<const LowRankBasis>(pca_basis(k.data(), vv.data(), N, d, r_max));
  }
  // Repeat mode: each query head stores (and pays for) its own copy of its KV head's basis.
  for (int s = 0; s < stored; ++s) {
    const int g = mode == GqaMode::Repeat ? s / G : s;
    out[s] = mode == GqaMode::Repeat && s % G ? std::make_shared<const LowRankBasis>(*per_kv[g]) : per_kv[g];
  }
  return out;
}

LayerCache build_mixed_cache(const PrefillView& v, GqaMode mode, int window, const WidthSet& ws,
                             const std::vector<std::shared_ptr<const LowRankBasis>>& bases,
                             const std::vector<std::vector<int>>& width) {
  const int stored = mode == GqaMode::Repeat ? v.n_heads : v.n_kv_heads, G = v.n_heads / v.n_kv_heads;
  const int d = v.head_dim, N = v.n_tokens, m = static_cast<int>(ws.rho.size());
  LayerCache cache(v.n_heads, stored, d);
  for (int s = 0; s < stored; ++s) {
    const int g = mode == GqaMode::Repeat ? s / G : s;
    auto row = [&](const float* base, int t) { return base + (size_t(t) * v.n_kv_heads + g) * d; };
    auto& segs = cache.segments(s);
    bool charged = false;
    for (int j = 1; j + 1 < m; ++j) {
      std::unique_ptr<LowRankSegment> seg;
      for (int t = 0; t < N - window; ++t) {
        if (width[s][t] != j) continue;
        if (!seg) {
          seg = std::make_unique<LowRankSegment>(bases[s], ws.dims[j], ws.dims[j], !charged);
          charged = true;
        }
        seg->append(row(v.k, t), row(v.v, t), v.positions[t]);
      }
      if (seg) segs.push_back(std::move(seg));
    }
    // Full width last, so that decoding appends to it.
    auto dense = std::make_unique<DenseSegment>(d);
    for (int t = 0; t < N; ++t)
      if (t >= N - window || width[s][t] == m - 1) dense->append(row(v.k, t), row(v.v, t), v.positions[t]);
    segs.push_back(std::move(dense));
  }
  return cache;
}

nlohmann::json mixed_stats(const std::vector<MixedChoice>& choices, const WidthSet& ws) {
  std::vector<size_t> hist(ws.rho.size(), 0);
  double primal = 0, dual = 0;
  std::vector<double> lambdas;
  int evict_only = 0;
  for (const auto& c : choices) {
    for (const auto& head : c.alloc.width)
      for (int j : head) ++hist[j];
    primal += c.alloc.primal;
    dual += c.alloc.dual;
    lambdas.push_back(c.alloc.lambda);
    evict_only += c.eviction_only;
  }
  nlohmann::json widths = nlohmann::json::object();
  for (size_t j = 0; j < hist.size(); ++j) widths[std::to_string(ws.dims[j])] = hist[j];
  nlohmann::json j = {{"widths", widths}, {"primal", primal}, {"gap", primal - dual}, {"eviction_only", evict_only}};
  if (lambdas.size() == 1) {
    j["lambda"] = lambdas[0];
  } else {
    std::sort(lambdas.begin(), lambdas.end());
    j["lambda_median"] = lambdas[lambdas.size() / 2];
  }
  return j;
}

}  // namespace kvb
