#include "methods/matryoshkakv/maps.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <cmath>

#include "harness/method/artifact.hpp"
#include "harness/util/base64.hpp"
#include "harness/util/error.hpp"
#include "harness/util/linalg.hpp"

namespace kvb {

namespace {

// I - A/2 with A = X - X^T, in double.
std::vector<double> cayley_denominator(const std::vector<float>& X, int d) {
  std::vector<double> B(size_t(d) * d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) {
      const double a = double(X[size_t(i) * d + j]) - X[size_t(j) * d + i];
      B[size_t(i) * d + j] = (i == j ? 1.0 : 0.0) - 0.5 * a;
    }
  return B;
}

// c = a b for row-major [d, d] matrices in double.
void matmul(const std::vector<double>& a, const std::vector<double>& b, int d, std::vector<double>& c) {
  c.assign(size_t(d) * d, 0.0);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, d, d, 1.0, a.data(), d, b.data(), d, 0.0, c.data(), d);
}

}  // namespace

void matryoshka_cayley(const std::vector<float>& X, int d, std::vector<float>& C, const std::string& what) {
  std::vector<double> Binv = cayley_denominator(X, d), num(size_t(d) * d), out;
  if (!invert_in_place(Binv, d)) fail("{}: I - S/2 is singular, so the Cayley map is undefined", what);
  // I + S/2 = 2I - (I - S/2).
  const std::vector<double> B = cayley_denominator(X, d);
  for (size_t i = 0; i < num.size(); ++i) num[i] = -B[i];
  for (int i = 0; i < d; ++i) num[size_t(i) * d + i] += 2.0;
  matmul(Binv, num, d, out);
  C.assign(out.begin(), out.end());
}

void matryoshka_cayley_backward(const std::vector<float>& X, const std::vector<float>& C, const std::vector<double>& gC,
                                int d, std::vector<double>& gX) {
  std::vector<double> Binv = cayley_denominator(X, d);
  if (!invert_in_place(Binv, d)) fail("matryoshkakv: I - S/2 is singular in the backward pass");
  // T = G_C (C + I)^T, then G_S = B^-T T / 2.
  std::vector<double> CpI(size_t(d) * d), T(size_t(d) * d, 0.0), GA(size_t(d) * d, 0.0);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) CpI[size_t(i) * d + j] = double(C[size_t(i) * d + j]) + (i == j ? 1.0 : 0.0);
  cblas_dgemm(CblasRowMajor, CblasNoTrans, CblasTrans, d, d, d, 1.0, gC.data(), d, CpI.data(), d, 0.0, T.data(), d);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, d, 0.5, Binv.data(), d, T.data(), d, 0.0, GA.data(), d);
  gX.resize(size_t(d) * d, 0.0);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) gX[size_t(i) * d + j] += GA[size_t(i) * d + j] - GA[size_t(j) * d + i];
}

void matryoshka_refresh(MatryoshkaMap& m, const std::string& what) {
  std::vector<float> C;
  matryoshka_cayley(m.X, m.d, C, what);
  m.Q.assign(size_t(m.d) * m.d, 0.0f);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, m.d, m.d, m.d, 1.0f, m.anchor.data(), m.d, C.data(), m.d, 0.0f,
              m.Q.data(), m.d);
}

void matryoshka_map_backward(const MatryoshkaMap& m, const std::vector<double>& gQ, std::vector<double>& gX) {
  const int d = m.d;
  std::vector<float> C;
  matryoshka_cayley(m.X, d, C, "matryoshkakv backward");
  const std::vector<double> A(m.anchor.begin(), m.anchor.end());
  std::vector<double> gC(size_t(d) * d, 0.0);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, d, 1.0, A.data(), d, gQ.data(), d, 0.0, gC.data(), d);
  matryoshka_cayley_backward(m.X, C, gC, d, gX);
}

void matryoshka_project(const float* x, int n, int stride, const std::vector<float>& Q, int d, int r, const float* mean,
                        float* out) {
  if (n <= 0) return;
  // Y = x - mean (contiguous), C = Y Q_r, out = mean + C Q_r^T.
  std::vector<float> y(size_t(n) * d), c(size_t(n) * r);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) y[size_t(t) * d + i] = x[size_t(t) * stride + i] - (mean ? mean[i] : 0.0f);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, r, d, 1.0f, y.data(), d, Q.data(), d, 0.0f, c.data(), r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, d, r, 1.0f, c.data(), r, Q.data(), d, 0.0f, y.data(), d);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) out[size_t(t) * stride + i] = y[size_t(t) * d + i] + (mean ? mean[i] : 0.0f);
}

void matryoshka_project_ref(const float* x, int n, int stride, const std::vector<float>& Q, int d, int r,
                            const float* mean, float* out) {
  std::vector<double> y(d), c(r);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < d; ++i) y[i] = double(x[size_t(t) * stride + i]) - (mean ? mean[i] : 0.0);
    for (int j = 0; j < r; ++j) {
      c[j] = 0;
      for (int i = 0; i < d; ++i) c[j] += y[i] * Q[size_t(i) * d + j];
    }
    for (int i = 0; i < d; ++i) {
      double s = mean ? mean[i] : 0.0;
      for (int j = 0; j < r; ++j) s += c[j] * Q[size_t(i) * d + j];
      out[size_t(t) * stride + i] = static_cast<float>(s);
    }
  }
}

void matryoshka_project_backward(const float* x, float* g, int n, int stride, const std::vector<float>& Q, int d, int r,
                                 const float* mean, std::vector<double>& gQ, std::vector<double>* gmean) {
  if (n <= 0) return;
  // out = m + (x - m) P, P = Q_r Q_r^T symmetric. With Y = x - m and G = d loss / d out:
  // d/dQ_r = (Y^T G + G^T Y) Q_r, d/dm = sum_t G_t (I - P), d/dx = G P.
  std::vector<float> y(size_t(n) * d), gg(size_t(n) * d), S(size_t(d) * d), c(size_t(n) * r), gqr(size_t(d) * r);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) {
      y[size_t(t) * d + i] = x[size_t(t) * stride + i] - (mean ? mean[i] : 0.0f);
      gg[size_t(t) * d + i] = g[size_t(t) * stride + i];
    }
  cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, d, d, n, 1.0f, y.data(), d, gg.data(), d, 0.0f, S.data(), d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < i; ++j) {
      const float s = S[size_t(i) * d + j] + S[size_t(j) * d + i];
      S[size_t(i) * d + j] = S[size_t(j) * d + i] = s;
    }
  for (int i = 0; i < d; ++i) S[size_t(i) * d + i] *= 2.0f;
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, d, r, d, 1.0f, S.data(), d, Q.data(), d, 0.0f, gqr.data(), r);
  gQ.resize(size_t(d) * d, 0.0);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < r; ++j) gQ[size_t(i) * d + j] += gqr[size_t(i) * r + j];
  // G P, written back into g; the centre's gradient from the column sums of G - G P.
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, r, d, 1.0f, gg.data(), d, Q.data(), d, 0.0f, c.data(), r);
  cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, n, d, r, 1.0f, c.data(), r, Q.data(), d, 0.0f, y.data(), d);
  if (gmean) gmean->resize(size_t(d), 0.0);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i) {
      const float gp = y[size_t(t) * d + i];
      if (mean && gmean) (*gmean)[size_t(i)] += double(gg[size_t(t) * d + i]) - gp;
      g[size_t(t) * stride + i] = gp;
    }
}

void matryoshka_project_backward_ref(const float* x, float* g, int n, int stride, const std::vector<float>& Q, int d,
                                     int r, const float* mean, std::vector<double>& gQ, std::vector<double>* gmean) {
  // By the chain rule on out_t = m + sum_j c_tj Q[:, j], c_tj = sum_i y_ti Q[i][j]:
  // d/dQ[a][j] = sum_t (G_t . Q[:, j]) y_ta + c_tj G_ta.
  gQ.resize(size_t(d) * d, 0.0);
  if (gmean) gmean->resize(size_t(d), 0.0);
  std::vector<double> y(d), G(d), c(r), gc(r);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < d; ++i) {
      y[i] = double(x[size_t(t) * stride + i]) - (mean ? mean[i] : 0.0);
      G[i] = g[size_t(t) * stride + i];
    }
    for (int j = 0; j < r; ++j) {
      c[j] = gc[j] = 0;
      for (int i = 0; i < d; ++i) {
        c[j] += y[i] * Q[size_t(i) * d + j];
        gc[j] += G[i] * Q[size_t(i) * d + j];
      }
    }
    for (int a = 0; a < d; ++a)
      for (int j = 0; j < r; ++j) gQ[size_t(a) * d + j] += gc[j] * y[a] + c[j] * G[a];
    for (int i = 0; i < d; ++i) {
      double dy = 0;
      for (int j = 0; j < r; ++j) dy += gc[j] * Q[size_t(i) * d + j];
      if (mean && gmean) (*gmean)[size_t(i)] += G[i] - dy;
      g[size_t(t) * stride + i] = static_cast<float>(dy);
    }
  }
}

MatryoshkaWeights matryoshka_init(MatryoshkaPca pca) {
  MatryoshkaWeights w;
  w.head_dim = pca.head_dim;
  const int d = pca.head_dim;
  for (size_t l = 0; l < pca.layers.size(); ++l) {
    auto& heads = w.layers.emplace_back();
    for (size_t h = 0; h < pca.layers[l].size(); ++h) {
      auto& maps = heads.emplace_back();
      for (int z = 0; z < 2; ++z) {
        auto& e = pca.layers[l][h][size_t(z)];
        MatryoshkaMap& m = maps[size_t(z)];
        m.d = d;
        m.anchor = std::move(e.basis);
        m.X.assign(size_t(d) * d, 0.0f);
        m.Q = m.anchor;
        if (z == 1) m.mean = e.mean;
      }
    }
  }
  return w;
}

namespace {

constexpr const char* kKindNames[2] = {"K", "V"};

// The projections need orthonormal columns: a basis that is not is an error, not a silent distortion.
void check_orthogonal(const std::vector<float>& a, int d, const std::string& where) {
  double worst = 0;
  for (int i = 0; i < d; ++i)
    for (int j = i; j < d; ++j) {
      double s = 0;
      for (int k = 0; k < d; ++k) s += double(a[size_t(k) * d + i]) * a[size_t(k) * d + j];
      worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
    }
  if (!(worst < 1e-3)) fail("{}: columns not orthonormal (|A^T A - I| up to {:.3g}; expected < 1e-3)", where, worst);
}

// The body's layers[l].heads[h] after checking head_dim and the counts against the model.
const nlohmann::json& head_entry(const LoadedArtifact& a, const ModelConfig& m, int l, int h) {
  const auto& body = a.body;
  if (l == 0 && h == 0) {
    if (!body.contains("head_dim") || !body["head_dim"].is_number_integer())
      fail("{}: field 'head_dim' missing (expected an integer)", a.path);
    if (body["head_dim"].get<int>() != m.head_dim)
      fail("{}: head_dim = {}, but this model's is {}", a.path, body["head_dim"].get<int>(), m.head_dim);
    if (!body.contains("layers") || !body["layers"].is_array() || static_cast<int>(body["layers"].size()) != m.n_layers)
      fail("{}: field 'layers' must be an array of the model's {} layers", a.path, m.n_layers);
  }
  const auto& layer = body["layers"][size_t(l)];
  if (!layer.contains("heads") || !layer["heads"].is_array() || static_cast<int>(layer["heads"].size()) != m.n_kv_heads)
    fail("{}: layers[{}].heads must be an array of the model's {} KV heads", a.path, l, m.n_kv_heads);
  return layer["heads"][size_t(h)];
}

}  // namespace

nlohmann::json matryoshka_pca_json(const MatryoshkaPca& pca) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& heads : pca.layers) {
    nlohmann::json hs = nlohmann::json::array();
    for (const auto& e : heads) {
      nlohmann::json entry;
      for (int z = 0; z < 2; ++z)
        entry[kKindNames[z]] = {{"basis", floats_to_base64(e[size_t(z)].basis)},
                                {"mean", floats_to_base64(e[size_t(z)].mean)},
                                {"eigenvalues", e[size_t(z)].eigenvalues}};
      hs.push_back(std::move(entry));
    }
    layers.push_back({{"heads", std::move(hs)}});
  }
  return {{"head_dim", pca.head_dim}, {"layers", std::move(layers)}};
}

MatryoshkaPca matryoshka_pca_from(const LoadedArtifact& a, const ModelConfig& model) {
  MatryoshkaPca pca;
  pca.head_dim = model.head_dim;
  const int d = model.head_dim;
  for (int l = 0; l < model.n_layers; ++l) {
    auto& heads = pca.layers.emplace_back();
    for (int h = 0; h < model.n_kv_heads; ++h) {
      const auto& entry = head_entry(a, model, l, h);
      auto& e = heads.emplace_back();
      for (int z = 0; z < 2; ++z) {
        const std::string where = fmt::format("{}: layers[{}].heads[{}].{}", a.path, l, h, kKindNames[z]);
        if (!entry.contains(kKindNames[z])) fail("{}: missing", where);
        const auto& j = entry[kKindNames[z]];
        e[size_t(z)].basis = artifact_floats(j, "basis", size_t(d) * d, where);
        check_orthogonal(e[size_t(z)].basis, d, where + ".basis");
        e[size_t(z)].mean = artifact_floats(j, "mean", size_t(d), where);
        if (!j.contains("eigenvalues") || !j["eigenvalues"].is_array() ||
            static_cast<int>(j["eigenvalues"].size()) != d)
          fail("{}.eigenvalues: expected {} numbers", where, d);
        e[size_t(z)].eigenvalues = j["eigenvalues"].get<std::vector<double>>();
      }
    }
  }
  return pca;
}

nlohmann::json matryoshka_weights_json(const MatryoshkaWeights& w) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& heads : w.layers) {
    nlohmann::json hs = nlohmann::json::array();
    for (const auto& maps : heads) {
      nlohmann::json entry;
      for (int z = 0; z < 2; ++z) {
        const MatryoshkaMap& m = maps[size_t(z)];
        entry[kKindNames[z]] = {{"X", floats_to_base64(m.X)}, {"anchor", floats_to_base64(m.anchor)}};
        if (z == 1) entry[kKindNames[z]]["mean"] = floats_to_base64(m.mean);
      }
      hs.push_back(std::move(entry));
    }
    layers.push_back({{"heads", std::move(hs)}});
  }
  return {{"head_dim", w.head_dim}, {"layers", std::move(layers)}};
}

MatryoshkaWeights matryoshka_weights_from(const LoadedArtifact& a, const ModelConfig& model) {
  MatryoshkaWeights w;
  w.head_dim = model.head_dim;
  const int d = model.head_dim;
  for (int l = 0; l < model.n_layers; ++l) {
    auto& heads = w.layers.emplace_back();
    for (int h = 0; h < model.n_kv_heads; ++h) {
      const auto& entry = head_entry(a, model, l, h);
      auto& maps = heads.emplace_back();
      for (int z = 0; z < 2; ++z) {
        const std::string where = fmt::format("{}: layers[{}].heads[{}].{}", a.path, l, h, kKindNames[z]);
        if (!entry.contains(kKindNames[z])) fail("{}: missing", where);
        const auto& j = entry[kKindNames[z]];
        MatryoshkaMap& m = maps[size_t(z)];
        m.d = d;
        m.X = artifact_floats(j, "X", size_t(d) * d, where);
        m.anchor = artifact_floats(j, "anchor", size_t(d) * d, where);
        check_orthogonal(m.anchor, d, where + ".anchor");
        if (z == 1) m.mean = artifact_floats(j, "mean", size_t(d), where);
        matryoshka_refresh(m, where);
      }
    }
  }
  return w;
}

}  // namespace kvb
