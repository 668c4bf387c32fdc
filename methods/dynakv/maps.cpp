#include "methods/dynakv/maps.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>

#include "harness/method/artifact.hpp"
#include "harness/util/base64.hpp"
#include "harness/util/error.hpp"
#include "harness/util/linalg.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

namespace {

// c[n, d] (+)= a[n, d] B or a B^T, B [d, d] row-major.
void times(const float* a, const float* B, int n, int d, bool transpose_b, float beta, float* c) {
  cblas_sgemm(CblasRowMajor, CblasNoTrans, transpose_b ? CblasTrans : CblasNoTrans, n, d, d, 1.0f, a, d, B, d, beta, c,
              d);
}

// G[d, d] += a^T b for a, b [n, d].
void outer_add(const float* a, const float* b, int n, int d, float* G) {
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, n, 1.0f, a, d, b, d, 1.0f, G, d);
}

// m = reverse cumulative sum of p, in double so that m[0] is 1 to rounding.
void reverse_cumsum(const float* p, int d, float* m) {
  double s = 0;
  for (int i = d - 1; i >= 0; --i) {
    s += p[i];
    m[i] = static_cast<float>(s);
  }
}

void check_map(const DynaKvMap& map) {
  const size_t dd = size_t(map.d) * map.d;
  if (map.d <= 0 || map.U.size() != dd || map.U_inv.size() != dd || map.W.size() != dd || map.b.size() != size_t(map.d))
    fail("internal: DynaKV map of d = {} with U {}, U^-1 {}, W {}, b {} numbers", map.d, map.U.size(), map.U_inv.size(),
         map.W.size(), map.b.size());
}

}  // namespace

void dynakv_rotate(const DynaKvMap& map, const float* x, int n, float* xt) {
  times(x, map.U.data(), n, map.d, false, 0.0f, xt);
}

void dynakv_gate(const DynaKvMap& map, const float* x, int n, DynaKvGate& g) {
  check_map(map);
  const int d = map.d;
  g.n = n;
  g.d = d;
  g.xt.resize(size_t(n) * d);
  g.p.resize(size_t(n) * d);
  g.m.resize(size_t(n) * d);
  dynakv_rotate(map, x, n, g.xt.data());
  for (int t = 0; t < n; ++t) std::copy_n(map.b.data(), d, g.p.data() + size_t(t) * d);
  times(g.xt.data(), map.W.data(), n, d, false, 1.0f, g.p.data());
#pragma omp parallel for schedule(static) if (n > 64)
  for (int t = 0; t < n; ++t) {
    softmax_inplace(g.p.data() + size_t(t) * d, d);
    reverse_cumsum(g.p.data() + size_t(t) * d, d, g.m.data() + size_t(t) * d);
  }
}

void dynakv_gate_ref(const DynaKvMap& map, const float* x, int n, DynaKvGate& g) {
  check_map(map);
  const int d = map.d;
  g.n = n;
  g.d = d;
  g.xt.assign(size_t(n) * d, 0.0f);
  g.p.assign(size_t(n) * d, 0.0f);
  g.m.assign(size_t(n) * d, 0.0f);
  std::vector<double> xt(static_cast<size_t>(d)), z(static_cast<size_t>(d));
  for (int t = 0; t < n; ++t) {
    for (int j = 0; j < d; ++j) {
      double s = 0;
      for (int i = 0; i < d; ++i) s += double(x[size_t(t) * d + i]) * map.U[size_t(i) * d + j];
      xt[size_t(j)] = s;
    }
    double mx = -1e300;
    for (int j = 0; j < d; ++j) {
      double s = map.b[size_t(j)];
      for (int i = 0; i < d; ++i) s += xt[size_t(i)] * map.W[size_t(i) * d + j];
      z[size_t(j)] = s;
      mx = std::max(mx, s);
    }
    double total = 0;
    for (int j = 0; j < d; ++j) total += std::exp(z[size_t(j)] - mx);
    double tail = 0;
    for (int j = d - 1; j >= 0; --j) {
      const double p = std::exp(z[size_t(j)] - mx) / total;
      tail += p;
      g.xt[size_t(t) * d + j] = static_cast<float>(xt[size_t(j)]);
      g.p[size_t(t) * d + j] = static_cast<float>(p);
      g.m[size_t(t) * d + j] = static_cast<float>(tail);
    }
  }
}

double dynakv_soft_rate(const float* m, int d) {
  double s = 0;
  for (int i = 0; i < d; ++i) s += m[i];
  return s / d;
}

int dynakv_width(const float* m, int d, double tau) {
  if (tau < 0) return d;
  // m is non-increasing, so the kept set is a prefix; m[0] = 1 > tau keeps at least one.
  int k = 1;
  while (k < d && m[k] > tau) ++k;
  return k;
}

void dynakv_soft_reconstruct(const DynaKvMap& map, const DynaKvGate& g, float* xbar) {
  std::vector<float> xh(g.xt.size());
  for (size_t i = 0; i < xh.size(); ++i) xh[i] = g.xt[i] * g.m[i];
  times(xh.data(), map.U_inv.data(), g.n, g.d, false, 0.0f, xbar);
}

void dynakv_expand(const DynaKvMap& map, const float* lat, int k, int col0, int cols, float* out) {
  std::fill(out, out + cols, 0.0f);
  for (int i = 0; i < k; ++i) {
    const float c = lat[i];
    const float* row = map.U_inv.data() + size_t(i) * map.d + col0;
    for (int j = 0; j < cols; ++j) out[j] += c * row[j];
  }
}

void dynakv_expand_rows(const DynaKvMap& map, std::span<const float* const> rows, std::span<const int> widths, int col0,
                        int cols, float* out) {
  std::vector<float> pad;
  for (size_t t0 = 0; t0 < rows.size(); t0 += kDynaKvExpandTile) {
    const size_t n = std::min(kDynaKvExpandTile, rows.size() - t0);
    const int k = *std::max_element(widths.begin() + t0, widths.begin() + t0 + n);
    pad.assign(n * size_t(k), 0.0f);
    for (size_t t = 0; t < n; ++t) std::copy_n(rows[t0 + t], widths[t0 + t], pad.data() + t * k);
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, static_cast<int>(n), cols, k, 1.0f, pad.data(), k,
                map.U_inv.data() + col0, map.d, 0.0f, out + t0 * cols, cols);
  }
}

void DynaKvGrads::reset(int d, bool with_basis) {
  const size_t dd = size_t(d) * d;
  U.assign(with_basis ? dd : 0, 0.0f);
  U_inv.assign(with_basis ? dd : 0, 0.0f);
  W.assign(dd, 0.0f);
  b.assign(size_t(d), 0.0f);
}

void dynakv_backward(const DynaKvMap& map, const float* x, const DynaKvGate& g, const float* dxbar, float rate_grad,
                     bool train_basis, DynaKvGrads& grads, float* dx) {
  const int n = g.n, d = g.d;
  const size_t nd = size_t(n) * d;
  std::vector<float> gxh(nd), gxt(nd), gz(nd);
  times(dxbar, map.U_inv.data(), n, d, true, 0.0f, gxh.data());  // dL/d(x~ . m) = dxbar U^-T
  if (train_basis) {
    std::vector<float> xh(nd);
    for (size_t i = 0; i < nd; ++i) xh[i] = g.xt[i] * g.m[i];
    outer_add(xh.data(), dxbar, n, d, grads.U_inv.data());
  }
  const float rate_per_coordinate = rate_grad / static_cast<float>(d);
#pragma omp parallel for schedule(static) if (n > 64)
  for (int t = 0; t < n; ++t) {
    const size_t o = size_t(t) * d;
    // dL/dm_i = gxh_i x~_i + rate_grad / d; m_i = sum_{j >= i} p_j gives dL/dp_j = sum_{i <= j} dL/dm_i;
    // the softmax then gives dL/dz = p (dL/dp - p . dL/dp).
    double prefix = 0, dot = 0;
    for (int j = 0; j < d; ++j) {
      prefix += double(gxh[o + j]) * g.xt[o + j] + rate_per_coordinate;
      gz[o + j] = static_cast<float>(prefix);
      dot += prefix * g.p[o + j];
    }
    for (int j = 0; j < d; ++j) {
      gz[o + j] = static_cast<float>(g.p[o + j] * (gz[o + j] - dot));
      gxt[o + j] = gxh[o + j] * g.m[o + j];
    }
  }
  outer_add(g.xt.data(), gz.data(), n, d, grads.W.data());
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < d; ++j) grads.b[size_t(j)] += gz[size_t(t) * d + j];
  times(gz.data(), map.W.data(), n, d, true, 1.0f, gxt.data());  // the gate's path into x~
  if (train_basis) outer_add(x, gxt.data(), n, d, grads.U.data());
  if (dx) times(gxt.data(), map.U.data(), n, d, true, 0.0f, dx);
}

void dynakv_backward_ref(const DynaKvMap& map, const float* x, const DynaKvGate& g, const float* dxbar, float rate_grad,
                         bool train_basis, DynaKvGrads& grads, float* dx) {
  const int n = g.n, d = g.d;
  auto at = [d](const std::vector<float>& a, int i, int j) { return double(a[size_t(i) * d + j]); };
  const auto dn = static_cast<size_t>(d);
  std::vector<double> gxh(dn), gm(dn), gp(dn), gz(dn), gxt(dn);
  for (int t = 0; t < n; ++t) {
    const size_t o = size_t(t) * d;
    for (int i = 0; i < d; ++i) {
      double s = 0;
      for (int j = 0; j < d; ++j) s += double(dxbar[o + j]) * at(map.U_inv, i, j);
      gxh[size_t(i)] = s;
    }
    if (train_basis)
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j)
          grads.U_inv[size_t(i) * d + j] += static_cast<float>(double(g.xt[o + i]) * g.m[o + i] * dxbar[o + j]);
    for (int i = 0; i < d; ++i) gm[size_t(i)] = gxh[size_t(i)] * g.xt[o + i] + double(rate_grad) / d;
    for (int j = 0; j < d; ++j) {
      double s = 0;
      for (int i = 0; i <= j; ++i) s += gm[size_t(i)];
      gp[size_t(j)] = s;
    }
    double dot = 0;
    for (int j = 0; j < d; ++j) dot += gp[size_t(j)] * g.p[o + j];
    for (int j = 0; j < d; ++j) gz[size_t(j)] = g.p[o + j] * (gp[size_t(j)] - dot);
    for (int i = 0; i < d; ++i) {
      double s = gxh[size_t(i)] * g.m[o + i];
      for (int j = 0; j < d; ++j) s += gz[size_t(j)] * at(map.W, i, j);
      gxt[size_t(i)] = s;
    }
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) grads.W[size_t(i) * d + j] += static_cast<float>(double(g.xt[o + i]) * gz[size_t(j)]);
    for (int j = 0; j < d; ++j) grads.b[size_t(j)] += static_cast<float>(gz[size_t(j)]);
    if (train_basis)
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) grads.U[size_t(i) * d + j] += static_cast<float>(double(x[o + i]) * gxt[size_t(j)]);
    if (dx)
      for (int i = 0; i < d; ++i) {
        double s = 0;
        for (int j = 0; j < d; ++j) s += gxt[size_t(j)] * at(map.U, i, j);
        dx[o + i] = static_cast<float>(s);
      }
  }
}

void fold_inverse_grad(const DynaKvMap& map, DynaKvGrads& grads) {
  const int d = map.d;
  if (grads.U_inv.empty()) return;
  // -U^-T G U^-T, with U^-1 as the run holds it.
  std::vector<float> a(size_t(d) * d);
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, d, 1.0f, map.U_inv.data(), d, grads.U_inv.data(), d, 0.0f,
              a.data(), d);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d, d, d, -1.0f, a.data(), d, map.U_inv.data(), d, 1.0f,
              grads.U.data(), d);
  std::fill(grads.U_inv.begin(), grads.U_inv.end(), 0.0f);
}

double inverse_error(const DynaKvMap& map) {
  const int d = map.d;
  double worst = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      double s = 0;
      for (int k = 0; k < d; ++k) s += double(map.U[size_t(i) * d + k]) * map.U_inv[size_t(k) * d + j];
      worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
    }
  return worst;
}

void refresh_inverse(DynaKvMap& map, const std::string& what, double tol) {
  std::vector<double> a(map.U.begin(), map.U.end());
  if (!invert_in_place(a, map.d))
    fail("{}: the basis U is singular (not invertible); DynaKV needs an invertible U", what);
  map.U_inv.assign(a.begin(), a.end());
  const double err = inverse_error(map);
  if (!(err < tol))
    fail("{}: the basis U is too ill-conditioned: ||U U^-1 - I||_max = {:.3g} after the cast to float32 (limit {:g})",
         what, err, tol);
}

double dynakv_bias_ramp(int d, double rate) {
  if (!(rate > 1.0 / d && rate < 1.0))
    fail("DynaKV initial retain rate {} outside (1/d, 1) = ({:.4f}, 1)", rate, 1.0 / d);
  auto soft = [d](double beta) {
    double z = 0, s = 0, mx = beta > 0 ? beta : 0;
    for (int j = 0; j < d; ++j) {
      const double e = std::exp(beta * j / std::max(1, d - 1) - mx);
      z += e;
      s += e * (j + 1);
    }
    return s / z / d;
  };
  double lo = -200, hi = 200;  // soft(beta) increases with beta
  for (int it = 0; it < 200; ++it) {
    const double mid = 0.5 * (lo + hi);
    (soft(mid) < rate ? lo : hi) = mid;
  }
  return 0.5 * (lo + hi);
}

DynaKvWeights dynakv_init(const DynaKvPca& pca, double rate, double tau) {
  DynaKvWeights w;
  w.d = pca.d;
  w.tau = tau;
  const int d = pca.d;
  const double beta = dynakv_bias_ramp(d, rate);
  for (const auto& layer : pca.basis) {
    auto& maps = w.layers.emplace_back();
    for (int z = 0; z < 2; ++z) {
      DynaKvMap& m = maps[size_t(z)];
      m.d = d;
      m.U = layer[size_t(z)];
      m.U_inv.resize(m.U.size());
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) m.U_inv[size_t(j) * d + i] = m.U[size_t(i) * d + j];
      m.W.assign(size_t(d) * d, 0.0f);
      m.b.resize(size_t(d));
      for (int j = 0; j < d; ++j) m.b[size_t(j)] = static_cast<float>(beta * j / std::max(1, d - 1));
    }
  }
  return w;
}

// ---------------------------------------------------------------------------------------------------
// Artifacts

namespace {

constexpr const char* kKindNames[2] = {"K", "V"};

int expected_d(const ModelConfig& m) { return m.n_kv_heads * m.head_dim; }

const nlohmann::json& layers_of(const LoadedArtifact& a, const ModelConfig& model) {
  const auto& body = a.body;
  if (!body.contains("d") || !body["d"].is_number_integer())
    fail("{}: field 'd' missing (expected an integer)", a.path);
  if (body["d"].get<int>() != expected_d(model))
    fail("{}: d = {}, but this model has {} KV heads x {} head dims = {}", a.path, body["d"].get<int>(),
         model.n_kv_heads, model.head_dim, expected_d(model));
  if (!body.contains("layers") || !body["layers"].is_array())
    fail("{}: field 'layers' missing (expected an array of {} layers)", a.path, model.n_layers);
  if (static_cast<int>(body["layers"].size()) != model.n_layers)
    fail("{}: {} layers, but the model has {}", a.path, body["layers"].size(), model.n_layers);
  return body["layers"];
}

}  // namespace

nlohmann::json dynakv_pca_json(const DynaKvPca& pca) {
  nlohmann::json layers = nlohmann::json::array();
  for (size_t l = 0; l < pca.basis.size(); ++l) {
    nlohmann::json entry;
    for (int z = 0; z < 2; ++z)
      entry[kKindNames[z]] = {{"U", floats_to_base64(pca.basis[l][size_t(z)])},
                              {"eigenvalues", pca.eigenvalues[l][size_t(z)]}};
    layers.push_back(std::move(entry));
  }
  return {{"d", pca.d}, {"layers", std::move(layers)}};
}

DynaKvPca dynakv_pca_from(const LoadedArtifact& a, const ModelConfig& model) {
  const auto& layers = layers_of(a, model);
  DynaKvPca pca;
  pca.d = expected_d(model);
  const size_t dd = size_t(pca.d) * pca.d;
  for (int l = 0; l < model.n_layers; ++l)
    for (int z = 0; z < 2; ++z) {
      const std::string where = fmt::format("{}: layers[{}].{}", a.path, l, kKindNames[z]);
      if (!layers[size_t(l)].contains(kKindNames[z])) fail("{}: missing", where);
      const auto& e = layers[size_t(l)][kKindNames[z]];
      if (z == 0) {
        pca.basis.emplace_back();
        pca.eigenvalues.emplace_back();
      }
      pca.basis.back()[size_t(z)] = artifact_floats(e, "U", dd, where);
      if (!e.contains("eigenvalues") || !e["eigenvalues"].is_array() ||
          static_cast<int>(e["eigenvalues"].size()) != pca.d)
        fail("{}.eigenvalues: expected {} numbers", where, pca.d);
      pca.eigenvalues.back()[size_t(z)] = e["eigenvalues"].get<std::vector<double>>();
    }
  return pca;
}

nlohmann::json dynakv_weights_json(const DynaKvWeights& w) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& maps : w.layers) {
    nlohmann::json entry;
    for (int z = 0; z < 2; ++z) {
      const DynaKvMap& m = maps[size_t(z)];
      entry[kKindNames[z]] = {{"U", floats_to_base64(m.U)},
                              {"U_inv", floats_to_base64(m.U_inv)},
                              {"W", floats_to_base64(m.W)},
                              {"b", floats_to_base64(m.b)}};
    }
    layers.push_back(std::move(entry));
  }
  return {{"d", w.d}, {"tau", w.tau}, {"layers", std::move(layers)}};
}

DynaKvWeights dynakv_weights_from(const LoadedArtifact& a, const ModelConfig& model) {
  const auto& layers = layers_of(a, model);
  DynaKvWeights w;
  w.d = expected_d(model);
  if (!a.body.contains("tau") || !a.body["tau"].is_number())
    fail("{}: field 'tau' missing (expected a number)", a.path);
  w.tau = a.body["tau"].get<double>();
  const size_t dd = size_t(w.d) * w.d;
  for (int l = 0; l < model.n_layers; ++l) {
    auto& maps = w.layers.emplace_back();
    for (int z = 0; z < 2; ++z) {
      const std::string where = fmt::format("{}: layers[{}].{}", a.path, l, kKindNames[z]);
      if (!layers[size_t(l)].contains(kKindNames[z])) fail("{}: missing", where);
      const auto& e = layers[size_t(l)][kKindNames[z]];
      DynaKvMap& m = maps[size_t(z)];
      m.d = w.d;
      m.U = artifact_floats(e, "U", dd, where);
      m.U_inv = artifact_floats(e, "U_inv", dd, where);
      m.W = artifact_floats(e, "W", dd, where);
      m.b = artifact_floats(e, "b", size_t(w.d), where);
      const double err = inverse_error(m);
      if (!(err < 1e-3))
        fail(
            "{}: U_inv is not the inverse of U (||U U_inv - I||_max = {:.3g}, limit 1e-3): a non-invertible or "
            "corrupted basis",
            where, err);
    }
  }
  return w;
}

}  // namespace kvb
