// DynaKV's maps (maps.*) and their training (train_hook.*): the gate
// and its backward against their references and finite differences, the invariants of README.md
// §12, the artifacts' checks, the whole-model hook against finite differences, and one e2e gradient of
// the default model against torch autograd (methods/dynakv/reference.py).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>

#include "harness/engine/engine.hpp"
#include "harness/engine/gradients.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/model/random_model.hpp"
#include "harness/util/linalg.hpp"
#include "kernels/dtype.hpp"
#include "methods/dynakv/maps.hpp"
#include "methods/dynakv/train_hook.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

using test::randn;

// An identity PCA basis for a model, as `calibrate dynakv-pca` writes it.
DynaKvPca identity_pca(const ModelConfig& c) {
  DynaKvPca pca;
  pca.d = c.n_kv_heads * c.head_dim;
  std::vector<float> eye(size_t(pca.d) * pca.d, 0.0f);
  for (int i = 0; i < pca.d; ++i) eye[size_t(i) * pca.d + i] = 1.0f;
  std::vector<double> eig(size_t(pca.d));
  for (int i = 0; i < pca.d; ++i) eig[size_t(i)] = pca.d - i;
  for (int l = 0; l < c.n_layers; ++l) {
    pca.basis.push_back({eye, eye});
    pca.eigenvalues.push_back({eig, eig});
  }
  return pca;
}

// DynaKV maps started from an identity basis, for the registry-driven tests on a random model (both
// methods that read trained maps).
std::map<std::string, std::string> identity_maps(const ModelFile& model, const std::filesystem::path& dir) {
  const ModelConfig& c = model.config();
  auto body = dynakv_weights_json(dynakv_init(identity_pca(c), 0.6, 0.1));
  body["header"] = artifact_header(kDynaKvKind, c, model.path());
  const std::string file = (dir / "dynakv_weights.json").string();
  write_artifact(file, body);
  return {{"weights", file}};
}

// Palu reads a basis in this PCA format (kvbench calibrate palu runs dynakv-pca's step).
std::map<std::string, std::string> identity_basis(const ModelFile& model, const std::filesystem::path& dir) {
  auto body = dynakv_pca_json(identity_pca(model.config()));
  body["header"] = artifact_header(kDynaKvPcaKind, model.config(), model.path());
  const std::string file = (dir / "palu_basis.json").string();
  write_artifact(file, body);
  return {{"basis", file}};
}
const bool test_artifacts_registered = test::register_method_test_artifacts("dynakv", identity_maps) &&
                                       test::register_method_test_artifacts("dynakv-snapkv", identity_maps) &&
                                       test::register_method_test_artifacts("palu", identity_basis);

// A well-conditioned, non-orthogonal map: U = I + small noise, a random gate.
DynaKvMap random_map(int d, uint32_t seed, float gate_scale = 0.3f) {
  DynaKvMap m;
  m.d = d;
  m.U = randn(size_t(d) * d, seed);
  for (auto& x : m.U) x *= 0.3f / static_cast<float>(d);
  for (int i = 0; i < d; ++i) m.U[size_t(i) * d + i] += 1.0f;
  m.W = randn(size_t(d) * d, seed + 1);
  for (auto& x : m.W) x *= gate_scale;
  m.b = randn(size_t(d), seed + 2);
  refresh_inverse(m, "test map");
  return m;
}

double max_diff(const std::vector<float>& a, const std::vector<float>& b) {
  REQUIRE(a.size() == b.size());
  double w = 0;
  for (size_t i = 0; i < a.size(); ++i) w = std::max(w, double(std::abs(a[i] - b[i])));
  return w;
}

double max_abs(const std::vector<float>& a) {
  double w = 0;
  for (float x : a) w = std::max(w, double(std::abs(x)));
  return w;
}

// sum(c . x_bar) + rate_grad * sum_t R_tok: the scalar whose gradient dynakv_backward computes when
// dxbar = c.
double probe_loss(const DynaKvMap& m, const std::vector<float>& x, int n, const std::vector<float>& c,
                  float rate_grad) {
  DynaKvGate g;
  dynakv_gate_ref(m, x.data(), n, g);
  std::vector<float> xbar(size_t(n) * m.d);
  dynakv_soft_reconstruct(m, g, xbar.data());
  double s = 0;
  for (size_t i = 0; i < xbar.size(); ++i) s += double(c[i]) * xbar[i];
  for (int t = 0; t < n; ++t) s += rate_grad * dynakv_soft_rate(g.m.data() + size_t(t) * m.d, m.d);
  return s;
}

}  // namespace

TEST_CASE("DynaKV gate: BLAS path matches the reference, mask invariants (spec 2.9.1-2)", "[dynakv]") {
  const int d = 24, n = 9;
  const DynaKvMap m = random_map(d, 11);
  const auto x = randn(size_t(n) * d, 5);
  DynaKvGate fast, ref;
  dynakv_gate(m, x.data(), n, fast);
  dynakv_gate_ref(m, x.data(), n, ref);
  CHECK(max_diff(fast.xt, ref.xt) < 1e-5 * std::max(1.0, max_abs(ref.xt)));
  CHECK(max_diff(fast.p, ref.p) < 1e-6);
  CHECK(max_diff(fast.m, ref.m) < 1e-5);
  for (int t = 0; t < n; ++t) {
    const float* mm = fast.m.data() + size_t(t) * d;
    const float* p = fast.p.data() + size_t(t) * d;
    CHECK(mm[0] == Approx(1.0).margin(1e-6));
    double expected = 0;
    for (int i = 0; i < d; ++i) {
      CHECK(mm[i] >= 0.0f);
      CHECK(mm[i] <= 1.0f + 1e-6f);
      if (i > 0) CHECK(mm[i] <= mm[i - 1] + 1e-7f);
      expected += double(i + 1) * p[i];
    }
    CHECK(dynakv_soft_rate(mm, d) == Approx(expected / d).epsilon(1e-5));
    for (double tau : {0.0, 0.1, 0.5, 0.99}) {
      const int k = dynakv_width(mm, d, tau);
      CHECK(k >= 1);
      for (int i = 1; i < d; ++i) CHECK((mm[i] > tau) == (i < k));  // the kept set is a prefix
    }
    CHECK(dynakv_width(mm, d, -1.0) == d);
  }
}

TEST_CASE("DynaKV backward: BLAS path matches the reference, the reference matches finite differences", "[dynakv]") {
  const int d = 6, n = 4;
  DynaKvMap m = random_map(d, 21, 1.0f);
  const auto x = randn(size_t(n) * d, 7);
  const auto c = randn(size_t(n) * d, 8);
  const float rate_grad = 0.7f;
  DynaKvGate g;
  dynakv_gate_ref(m, x.data(), n, g);
  DynaKvGrads fast, ref;
  fast.reset(d, true);
  ref.reset(d, true);
  std::vector<float> dx_fast(size_t(n) * d), dx_ref(size_t(n) * d);
  dynakv_backward(m, x.data(), g, c.data(), rate_grad, true, fast, dx_fast.data());
  dynakv_backward_ref(m, x.data(), g, c.data(), rate_grad, true, ref, dx_ref.data());
  for (auto [a, b] : {std::pair{&fast.U, &ref.U},
                      {&fast.U_inv, &ref.U_inv},
                      {&fast.W, &ref.W},
                      {&fast.b, &ref.b},
                      {&dx_fast, &dx_ref}})
    CHECK(max_diff(*a, *b) < 1e-5 * std::max(1.0, max_abs(*b)));
  fold_inverse_grad(m, ref);

  // Central differences in each parameter (U with U^-1 recomputed from it) and in x.
  const float h = 1e-3f;
  auto check = [&](std::vector<float>& p, const std::vector<float>& analytic, bool basis, const char* what) {
    for (size_t i = 0; i < p.size(); i += 5) {
      const float p0 = p[i];
      p[i] = p0 + h;
      if (basis) refresh_inverse(m, "fd");
      const double up = probe_loss(m, x, n, c, rate_grad);
      p[i] = p0 - h;
      if (basis) refresh_inverse(m, "fd");
      const double down = probe_loss(m, x, n, c, rate_grad);
      p[i] = p0;
      if (basis) refresh_inverse(m, "fd");
      const double fd = (up - down) / (2.0 * h);
      INFO(what << "[" << i << "]: finite difference " << fd << ", analytic " << analytic[i]);
      CHECK(std::abs(fd - analytic[i]) <= 2e-3 + 1e-2 * std::abs(fd));
    }
  };
  check(m.W, ref.W, false, "W");
  check(m.b, ref.b, false, "b");
  check(m.U, ref.U, true, "U");
  std::vector<float> xs = x;
  for (size_t i = 0; i < xs.size(); i += 3) {
    const float x0 = xs[i];
    xs[i] = x0 + h;
    const double up = probe_loss(m, xs, n, c, rate_grad);
    xs[i] = x0 - h;
    const double down = probe_loss(m, xs, n, c, rate_grad);
    xs[i] = x0;
    CHECK(std::abs((up - down) / (2.0 * h) - dx_ref[i]) <= 2e-3 + 1e-2 * std::abs(dx_ref[i]));
  }
}

TEST_CASE("DynaKV full width reconstructs exactly, latent value aggregation equals reconstruct-then-sum (2.9.3, 2.9.5)",
          "[dynakv]") {
  const int d = 16, n = 5;
  const DynaKvMap m = random_map(d, 31);
  const auto x = randn(size_t(n) * d, 9);
  DynaKvGate g;
  dynakv_gate(m, x.data(), n, g);
  std::vector<float> out(static_cast<size_t>(d));
  for (int t = 0; t < n; ++t) {
    dynakv_expand(m, g.xt.data() + size_t(t) * d, dynakv_width(g.m.data() + size_t(t) * d, d, -1.0), 0, d, out.data());
    for (int i = 0; i < d; ++i) CHECK(out[size_t(i)] == Approx(x[size_t(t) * d + i]).margin(1e-4));
  }
  // Weights p over tokens with ragged widths: (sum_t p_t pad(x~_t[0:k_t])) U^-1[:, block] against the
  // weighted sum of each token's reconstructed block.
  const int col0 = 4, cols = 8;
  const std::vector<float> p = {0.1f, 0.3f, 0.2f, 0.25f, 0.15f};
  const std::vector<int> widths = {1, 16, 7, 3, 12};
  const auto dn = static_cast<size_t>(d), cn = static_cast<size_t>(cols);
  std::vector<float> pooled(dn, 0.0f), direct(cn, 0.0f), latent_way(cn);
  for (int t = 0; t < n; ++t) {
    for (int i = 0; i < widths[size_t(t)]; ++i) pooled[size_t(i)] += p[size_t(t)] * g.xt[size_t(t) * d + i];
    std::vector<float> block(cn);
    dynakv_expand(m, g.xt.data() + size_t(t) * d, widths[size_t(t)], col0, cols, block.data());
    for (int j = 0; j < cols; ++j) direct[size_t(j)] += p[size_t(t)] * block[size_t(j)];
  }
  dynakv_expand(m, pooled.data(), d, col0, cols, latent_way.data());
  CHECK(max_diff(latent_way, direct) < 1e-4 * std::max(1.0, max_abs(direct)));
}

TEST_CASE("DynaKV batched reconstruction of ragged rows equals the per-row reference", "[dynakv]") {
  const int d = 24, n = 150;  // more than two tiles, the last one partial
  const DynaKvMap m = random_map(d, 17);
  const auto lat = randn(size_t(n) * d, 5);
  std::vector<const float*> rows;
  std::vector<int> widths;
  for (int t = 0; t < n; ++t) {
    rows.push_back(lat.data() + size_t(t) * d);
    widths.push_back(1 + (t * 7) % d);
  }
  const int col0 = 8, cols = 8;
  std::vector<float> fast(size_t(n) * cols), ref(fast.size());
  dynakv_expand_rows(m, rows, widths, col0, cols, fast.data());
  for (int t = 0; t < n; ++t)
    dynakv_expand(m, rows[size_t(t)], widths[size_t(t)], col0, cols, ref.data() + size_t(t) * cols);
  CHECK(max_diff(fast, ref) < 1e-5 * std::max(1.0, max_abs(ref)));
}

TEST_CASE("DynaKV initialisation from PCA: orthonormal basis, transposed inverse, initial soft rate (2.9.6)",
          "[dynakv]") {
  const int d = 12;
  // A PCA basis from a symmetric eigenproblem: eigenvectors of a random moment.
  const auto a = randn(size_t(40) * d, 3);
  std::vector<double> moment(size_t(d) * d, 0.0), vals, vecs;
  for (int t = 0; t < 40; ++t)
    for (int i = 0; i < d; ++i)
      for (int j = 0; j < d; ++j) moment[size_t(i) * d + j] += double(a[size_t(t) * d + i]) * a[size_t(t) * d + j] / 40;
  symmetric_eigen(moment, d, vals, vecs);
  for (int i = 1; i < d; ++i) CHECK(vals[size_t(i)] <= vals[size_t(i - 1)]);
  DynaKvPca pca;
  pca.d = d;
  pca.basis.push_back({std::vector<float>(vecs.begin(), vecs.end()), std::vector<float>(vecs.begin(), vecs.end())});
  pca.eigenvalues.push_back({vals, vals});
  const DynaKvWeights w = dynakv_init(pca, 0.9, 0.1);
  const DynaKvMap& m = w.layers[0][0];
  CHECK(inverse_error(m) < 1e-5);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) CHECK(m.U_inv[size_t(i) * d + j] == m.U[size_t(j) * d + i]);
  // Truncation to the leading r columns reconstructs the calibration rows at least as well as any
  // other r columns (here: the trailing r).
  const int r = 4;
  auto error_of = [&](int first) {
    double e = 0;
    for (int t = 0; t < 40; ++t) {
      std::vector<double> rec(static_cast<size_t>(d), 0.0);
      for (int c = first; c < first + r; ++c) {
        double coef = 0;
        for (int i = 0; i < d; ++i) coef += double(a[size_t(t) * d + i]) * m.U[size_t(i) * d + c];
        for (int i = 0; i < d; ++i) rec[size_t(i)] += coef * m.U[size_t(i) * d + c];
      }
      for (int i = 0; i < d; ++i) e += std::pow(rec[size_t(i)] - a[size_t(t) * d + i], 2);
    }
    return e;
  };
  CHECK(error_of(0) <= error_of(d - r) + 1e-9);
  DynaKvGate g;
  const auto x = randn(size_t(3) * d, 4);
  dynakv_gate(m, x.data(), 3, g);
  for (int t = 0; t < 3; ++t) CHECK(dynakv_soft_rate(g.m.data() + size_t(t) * d, d) == Approx(0.9).epsilon(1e-6));
  test::require_error([] { dynakv_bias_ramp(8, 0.1); }, {"outside (1/d, 1)"});
}

TEST_CASE("DynaKV artifacts: round trip, another model's shape, a basis whose inverse is wrong", "[dynakv]") {
  ModelConfig cfg;
  cfg.n_layers = 2;
  cfg.n_kv_heads = 2;
  cfg.head_dim = 4;
  const int d = 8;
  DynaKvWeights w;
  w.d = d;
  w.tau = 0.1;
  for (int l = 0; l < 2; ++l) w.layers.push_back({random_map(d, 40 + l), random_map(d, 50 + l)});
  const test::TempDir dir("dynakv_artifacts");
  const auto path = (dir / "w.json").string();
  write_artifact(path, dynakv_weights_json(w));
  auto load = [&](const ModelConfig& m) { return dynakv_weights_from(load_artifact(kDynaKvKind, path, m, "make"), m); };
  const DynaKvWeights back = load(cfg);
  CHECK(back.layers[1][1].W == w.layers[1][1].W);
  CHECK(back.tau == 0.1);
  ModelConfig other = cfg;
  other.n_layers = 3;
  test::require_error([&] { load(other); }, {"w.json", "2 layers, but the model has 3"});
  other = cfg;
  other.head_dim = 8;
  test::require_error([&] { load(other); }, {"d = 8", "16"});
  w.layers[1][0].U_inv[3] += 0.5f;
  write_artifact(path, dynakv_weights_json(w));
  test::require_error([&] { load(cfg); }, {"layers[1].K", "not the inverse of U"});
  DynaKvMap singular = random_map(d, 60);
  for (int j = 0; j < d; ++j) singular.U[size_t(3) * d + j] = singular.U[size_t(2) * d + j];
  test::require_error([&] { refresh_inverse(singular, "layer 9 V"); }, {"layer 9 V", "singular"});
}

TEST_CASE("DynaKV hook in the whole model: gradients of the maps against finite differences of CE + alpha R^2",
          "[dynakv]") {
  ModelShape shape;
  shape.name = "tiny";
  shape.arch = "llama";
  shape.layers = 2;
  shape.hidden = 32;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.ffn = 48;
  shape.vocab = 64;
  shape.context = 128;
  const test::TempDir dir("dynakv_hook");
  const auto path = (dir / "tiny.gguf").string();
  write_random_model(path, shape, DType::F32, 9);
  auto model = ModelFile::open(path);
  ModelGradients mg(*model);
  const int d = 2 * (32 / 4);
  DynaKvWeights w;
  w.d = d;
  for (int l = 0; l < 2; ++l) w.layers.push_back({random_map(d, 70 + l), random_map(d, 80 + l)});
  std::vector<int32_t> ids(13);
  std::mt19937 rng(5);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 64);
  const double alpha = 0.8;
  auto objective = [&] {
    DynaKvHook h(w, DynaKvPath::Soft);
    const double ce = mg.compute(ids, {}, &h).loss;
    return ce + alpha * h.sequence_soft_rate() * h.sequence_soft_rate();
  };
  DynaKvHook hook(w, DynaKvPath::Soft);
  hook.set_objective(DynaKvHook::Objective::E2E, alpha);
  hook.set_train_basis(true);
  hook.reset_grads();
  mg.compute(ids, {}, &hook);
  for (int l = 0; l < 2; ++l)
    for (int z = 0; z < 2; ++z) fold_inverse_grad(w.layers[size_t(l)][size_t(z)], hook.grads()[size_t(l)][size_t(z)]);
  uint32_t seed = 300;
  for (int l = 0; l < 2; ++l)
    for (int z = 0; z < 2; ++z) {
      DynaKvMap& m = w.layers[size_t(l)][size_t(z)];
      const DynaKvGrads& g = hook.grads()[size_t(l)][size_t(z)];
      for (auto [p, an, basis] : {std::tuple{&m.W, &g.W, false}, {&m.b, &g.b, false}, {&m.U, &g.U, true}}) {
        const auto delta = randn(p->size(), ++seed);
        const auto p0 = *p;
        const float h = 1e-3f;
        for (size_t i = 0; i < p->size(); ++i) (*p)[i] = p0[i] + h * delta[i];
        if (basis) refresh_inverse(m, "fd");
        const double up = objective();
        for (size_t i = 0; i < p->size(); ++i) (*p)[i] = p0[i] - h * delta[i];
        if (basis) refresh_inverse(m, "fd");
        const double down = objective();
        *p = p0;
        if (basis) refresh_inverse(m, "fd");
        double analytic = 0;
        for (size_t i = 0; i < p->size(); ++i) analytic += double((*an)[i]) * delta[i];
        const double fd = (up - down) / (2.0 * h);
        INFO("layer " << l << " kind " << z << (basis ? " U" : " W/b") << ": fd " << fd << ", analytic " << analytic);
        CHECK(std::abs(fd - analytic) <= 2e-3 + 2e-2 * std::abs(analytic));
      }
    }
  // Layer-local: with every coordinate kept at full scale the student is the teacher (D_l = 0).
  for (auto& layer : w.layers)
    for (auto& m : layer) {
      std::fill(m.W.begin(), m.W.end(), 0.0f);
      std::fill(m.b.begin(), m.b.end(), 0.0f);
      m.b.back() = 60.0f;
    }
  DynaKvHook keep(w, DynaKvPath::Soft);
  keep.set_objective(DynaKvHook::Objective::LayerLocal, 0.0);
  for (double D : mg.attention_distortion(ids, keep)) CHECK(D < 1e-8);
}

TEST_CASE("DynaKV e2e gradient of the default model matches torch autograd (methods/dynakv/reference.py)",
          "[dynakv][model]") {
  const auto model_path = test::model_file(test::kDefaultModel);
  if (!model_path) return;
  std::ifstream in(test::source_path("methods/dynakv/fixtures/dynakv_e2e_128_f64.json"));
  REQUIRE(in.good());
  const auto ref = nlohmann::json::parse(in);
  auto model = ModelFile::open(*model_path);
  ModelGradients mg(*model);
  const ModelConfig& cfg = mg.config();
  const int d = cfg.n_kv_heads * cfg.head_dim;
  // The fixture's deterministic initialisation (computed in double, then cast).
  DynaKvWeights w;
  w.d = d;
  for (int l = 0; l < cfg.n_layers; ++l) {
    auto& layer = w.layers.emplace_back();
    for (int z = 0; z < 2; ++z) {
      DynaKvMap& m = layer[size_t(z)];
      m.d = d;
      m.U.resize(size_t(d) * d);
      m.W.resize(size_t(d) * d);
      m.b.resize(size_t(d));
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) {
          m.U[size_t(i) * d + j] = static_cast<float>(
              (i == j ? 1.0 : 0.0) + (0.3 / 192) * std::sin(0.37 * (i + 1) * (j + 2) + 1.3 * l + 0.7 * z));
          m.W[size_t(i) * d + j] = static_cast<float>(0.02 * std::cos(0.11 * (i + 1) * (j + 1) + 0.5 * l + 0.3 * z));
        }
      for (int j = 0; j < d; ++j) m.b[size_t(j)] = static_cast<float>(2.0 * j / 191 + 0.1 * std::sin(j + l + 2 * z));
      refresh_inverse(m, "fixture init");
    }
  }
  const double alpha = ref.at("alpha").get<double>();
  DynaKvHook hook(w, DynaKvPath::Soft);
  hook.set_objective(DynaKvHook::Objective::E2E, alpha);
  hook.set_train_basis(true);
  hook.reset_grads();
  const auto ids = ref.at("ids").get<std::vector<int32_t>>();
  const double ce = mg.compute(ids, {}, &hook).loss;
  const double R = hook.sequence_soft_rate();
  CHECK(ce == Approx(ref.at("ce").get<double>()).epsilon(1e-5));
  CHECK(R == Approx(ref.at("R").get<double>()).epsilon(1e-5));
  CHECK(ce + alpha * R * R == Approx(ref.at("loss").get<double>()).epsilon(1e-5));
  double worst = 0;
  for (const auto& p : ref.at("params")) {
    const int l = p.at("layer"), z = p.at("kind") == "K" ? 0 : 1;
    DynaKvGrads& g = hook.grads()[size_t(l)][size_t(z)];
    fold_inverse_grad(w.layers[size_t(l)][size_t(z)], g);
    const std::string which = p.at("param");
    const auto& v = which == "U" ? g.U : which == "W" ? g.W : g.b;
    INFO("layer " << l << " " << p.at("kind") << " " << which);
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    CHECK(std::sqrt(ss) == Approx(p.at("frobenius").get<double>()).epsilon(5e-4));
    const double scale = p.at("max_abs").get<double>();
    for (const auto& s : p.at("samples")) {
      const double diff = std::abs(v[s.at(0).get<size_t>()] - s.at(1).get<double>()) / scale;
      worst = std::max(worst, diff);
      CHECK(diff < 5e-4);
    }
  }
  // Measured: 1.5e-4 at worst (layer 0's key gate, after the fp32 backward through all 30 layers;
  // every other layer within 1e-4).
  INFO("largest sampled difference relative to the tensor's largest entry: " << worst);
  CHECK(worst < 5e-4);
}

namespace {

// A tiny random model on disk and DynaKV weights for it (an artifact with its header), in a fresh
// temporary directory.
struct TinyDynaKv {
  test::TempDir dir{"dynakv_engine"};  // first, so that it is removed after the model is closed
  std::string model_path = (dir / "tiny.gguf").string(), weights_path = (dir / "w.json").string(),
              pca_path = (dir / "pca.json").string();
  std::unique_ptr<ModelFile> model;
  DynaKvWeights w;
  int d = 0;

  explicit TinyDynaKv(float gate_scale) {
    ModelShape shape;
    shape.name = "tiny";
    shape.arch = "llama";
    shape.layers = 2;
    shape.hidden = 32;
    shape.heads = 4;
    shape.kv_heads = 2;
    shape.ffn = 48;
    shape.vocab = 64;
    shape.context = 128;
    write_random_model(model_path, shape, DType::F32, 17);
    model = ModelFile::open(model_path);
    d = 2 * 8;
    w.d = d;
    w.tau = 0.1;
    for (int l = 0; l < 2; ++l)
      w.layers.push_back({random_map(d, 90 + l, gate_scale), random_map(d, 95 + l, gate_scale)});
    auto body = dynakv_weights_json(w);
    body["header"] = artifact_header(kDynaKvKind, model->config(), model_path);
    write_artifact(weights_path, body);
  }
};

// Mean next-token cross-entropy of ids read off the engine one token at a time (prefill of the first,
// then decode), with an observer for the sequence.
double engine_ce(Engine& e, const std::vector<int32_t>& ids, PrefillObserver* obs) {
  double ce = 0;
  auto logits = e.prefill(std::span<const int32_t>(ids.data(), 1), obs);
  for (size_t t = 1; t < ids.size(); ++t) {
    const float mx = *std::max_element(logits.begin(), logits.end());
    double z = 0;
    for (float x : logits) z += std::exp(double(x) - mx);
    ce += std::log(z) + mx - logits[size_t(ids[t])];
    if (t + 1 < ids.size()) logits = e.decode(ids[t]);
  }
  return ce / double(ids.size() - 1);
}

}  // namespace

TEST_CASE("DynaKV method: all coordinates kept gives the base model's logits (2.9.3, 2.9.4)", "[dynakv]") {
  TinyDynaKv tiny(0.3f);
  Engine e(*tiny.model);
  std::vector<int32_t> ids = {3, 17, 42, 8, 8, 60, 1, 33, 21, 9, 14, 50};
  const auto base_prefill = e.prefill(ids);
  const auto base_next = e.decode(5);
  auto m = MethodRegistry::get().create("dynakv", {{"weights", tiny.weights_path}, {"tau", "-1"}}, e.config());
  MethodRunner runner(*m, KvBudget{});
  const auto got_prefill = e.prefill(ids, &runner);
  const auto got_next = e.decode(5);
  for (size_t i = 0; i < base_prefill.size(); ++i) {
    CHECK(got_prefill[i] == Approx(base_prefill[i]).margin(1e-4));
    CHECK(got_next[i] == Approx(base_next[i]).margin(1e-4));
  }
}

TEST_CASE("DynaKV method: past the context length the rebuilt keys rotate as the model's do", "[dynakv]") {
  // All coordinates kept: the base model's logits, also at positions 128-139 of a 128-token context,
  // where the keys rebuilt every step need rotations the method's table did not start with.
  TinyDynaKv tiny(0.3f);
  Engine e(*tiny.model);
  std::vector<int32_t> ids(120);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 13 + 3) % 64);
  auto m = MethodRegistry::get().create("dynakv", {{"weights", tiny.weights_path}, {"tau", "-1"}}, e.config());
  MethodRunner runner(*m, KvBudget{});
  std::vector<std::vector<float>> base = {e.prefill(ids)}, got;
  for (int32_t t = 0; t < 20; ++t) base.push_back(e.decode(t));
  got.push_back(e.prefill(ids, &runner));
  for (int32_t t = 0; t < 20; ++t) got.push_back(e.decode(t));
  CHECK(e.position() == 140);
  for (size_t s = 0; s < base.size(); ++s) {
    INFO("step " << s);
    CHECK(test::max_abs_diff(got[s], base[s]) < 1e-4f);
  }
}

TEST_CASE("DynaKV method: the latent cache decodes what the training side's hard path computes", "[dynakv]") {
  TinyDynaKv tiny(2.0f);
  Engine e(*tiny.model);
  std::vector<int32_t> ids(24);
  std::mt19937 rng(8);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 64);
  auto m = MethodRegistry::get().create("dynakv", {{"weights", tiny.weights_path}}, e.config());
  MethodRunner runner(*m, KvBudget{});
  const double via_cache = engine_ce(e, ids, &runner);
  ModelGradients mg(*tiny.model);
  DynaKvHook hard(tiny.w, DynaKvPath::Hard);
  const double teacher_forced = mg.compute(ids, {}, &hard).loss;
  CHECK(via_cache == Approx(teacher_forced).epsilon(1e-4));
  const double rate = hard.hard_rate();
  INFO("hard retain rate " << rate);
  CHECK(rate < 0.9);  // the gate really truncates
  // The prompt prefilled at once, then decoded, equals decoding from the first token.
  const std::vector<int32_t> prompt(ids.begin(), ids.begin() + 16);
  e.prefill(prompt, &runner);
  std::vector<float> a;
  for (size_t t = 16; t < ids.size(); ++t) a = e.decode(ids[t]);
  e.prefill(std::span<const int32_t>(ids.data(), 1), &runner);
  std::vector<float> b;
  for (size_t t = 1; t < ids.size(); ++t) b = e.decode(ids[t]);
  for (size_t i = 0; i < a.size(); ++i) CHECK(a[i] == Approx(b[i]).margin(1e-4));
  // Memory (README.md §12, inv. 7): per token and layer k_K + k_V stored numbers plus two uint16 widths; every
  // position once, in every head's view.
  double numbers = 0;
  for (int l = 0; l < 2; ++l)
    for (int z = 0; z < 2; ++z) numbers += hard.hard_rate(l, z) * double(ids.size()) * tiny.d;
  for (const auto& c : e.caches())
    for (int h = 0; h < c.n_cache_heads(); ++h) CHECK(c.tokens(h) == ids.size());
  const double length_fields = 2.0 * 2 * double(ids.size()) * 2;
  CHECK(double(e.kv_bytes()) == Approx(4 * numbers + length_fields).epsilon(0.01));
  // At fp16 (with every coordinate kept, so that widths cannot shift with the rounded upstream cache):
  // 2 bytes a number.
  Engine half(*tiny.model, {.kv_dtype = KvDtype::F16});
  auto keep_all = MethodRegistry::get().create("dynakv", {{"weights", tiny.weights_path}, {"tau", "-1"}}, e.config());
  MethodRunner keep_runner(*keep_all, KvBudget{});
  engine_ce(half, ids, &keep_runner);  // caches every token but the last, whose logits are not needed
  const size_t cached = ids.size() - 1;
  CHECK(half.kv_bytes() == 2 * size_t(2 * tiny.d) * cached * 2 + 2 * 2 * cached * 2);
}

TEST_CASE("DynaKV method: the fixed-rank PCA baseline keeps round(r d) coordinates, bad parameters", "[dynakv]") {
  TinyDynaKv tiny(0.3f);
  DynaKvPca pca;
  pca.d = tiny.d;
  for (int l = 0; l < 2; ++l) {
    std::array<std::vector<float>, 2> basis;
    for (auto& b : basis) {
      b.assign(size_t(tiny.d) * tiny.d, 0.0f);
      for (int i = 0; i < tiny.d; ++i) b[size_t(i) * tiny.d + (tiny.d - 1 - i)] = 1.0f;  // a permutation
    }
    pca.basis.push_back(basis);
    pca.eigenvalues.push_back({std::vector<double>(size_t(tiny.d), 1.0), std::vector<double>(size_t(tiny.d), 1.0)});
  }
  auto body = dynakv_pca_json(pca);
  body["header"] = artifact_header(kDynaKvPcaKind, tiny.model->config(), tiny.model_path);
  write_artifact(tiny.pca_path, body);
  Engine e(*tiny.model);
  const std::vector<int32_t> ids = {1, 2, 3, 4, 5, 6, 7, 8, 9, 10};
  auto m = MethodRegistry::get().create("dynakv", {{"fixed_rate", "0.25"}, {"pca", tiny.pca_path}}, e.config());
  MethodRunner runner(*m, KvBudget{});
  e.prefill(ids, &runner);
  e.decode(11);
  // 4 of 16 coordinates for K and V, 11 tokens, 2 layers: numbers + widths.
  CHECK(e.kv_bytes() == size_t(2 * 11 * (4 + 4) * 4 + 2 * 11 * 4));
  ModelGradients mg(*tiny.model);
  auto w = dynakv_init(pca, 0.5, 0.1);
  DynaKvHook fixed(w, DynaKvPath::Fixed, 4);
  std::vector<int32_t> all = ids;
  all.push_back(11);
  CHECK(engine_ce(e, all, &runner) == Approx(mg.compute(all, {}, &fixed).loss).epsilon(1e-4));

  const auto& reg = MethodRegistry::get();
  // Per-layer widths: layer 0 keeps 2 and 6, layer 1 keeps 4 and 4 of the 16 coordinates.
  {
    auto per_layer = reg.create("dynakv", {{"fixed_ranks", "2/6/4/4"}, {"pca", tiny.pca_path}}, e.config());
    MethodRunner r2(*per_layer, KvBudget{});
    e.prefill(ids, &r2);
    CHECK(e.kv_bytes() == size_t(10 * (2 + 6 + 4 + 4) * 4 + 2 * 10 * 4));
  }
  // Palu's latent quantization: a token's stored bits are its codes and, per scale group, an fp16 scale
  // (and zero point, asymmetric); a rotation or grouping that does not fit the ranks is refused.
  {
    auto q =
        reg.create("dynakv", {{"fixed_ranks", "2/6/4/4"}, {"pca", tiny.pca_path}, {"latent_bits", "3"}}, e.config());
    MethodRunner r3(*q, KvBudget{});
    e.prefill(ids, &r3);
    // Per token: layer 0 (2 + 6) x 3 + 2 x 32 bits, layer 1 (4 + 4) x 3 + 2 x 32 bits; and the widths.
    CHECK(e.kv_bytes() == size_t((10 * (24 + 64) + 7) / 8 * 2 + 2 * 10 * 4));
  }
  for (const auto& [extra, message] : std::vector<std::pair<std::map<std::string, std::string>, std::string>>{
           {{{"latent_hadamard", "true"}, {"fixed_ranks", "2/6/4/4"}}, "no Hadamard matrix of order 6"},
           {{{"latent_group_size", "4"}, {"fixed_ranks", "2/6/4/4"}}, "latent_group_size 4 does not divide"},
           {{{"fixed_rate", ""}}, "latent_bits quantizes the fixed-rank latent"}}) {  // "": left out
    std::map<std::string, std::string> p = {{"pca", tiny.pca_path}, {"latent_bits", "3"}};
    for (const auto& [k, v] : extra)
      if (!v.empty()) p[k] = v;
    test::require_error([&] { reg.create("dynakv", p, e.config()); }, {message});
  }
  // DynaKV + SnapKV admits tokens by their float bytes: it takes no latent quantization.
  test::require_error(
      [&] {
        reg.create("dynakv-snapkv", {{"fixed_rate", "0.25"}, {"pca", tiny.pca_path}, {"latent_bits", "3"}}, e.config());
      },
      {"latent_bits"});
  for (const auto& [ranks, message] :
       std::vector<std::pair<std::string, std::string>>{{"2/6/4", "holds 3 entries; expected 2 per layer"},
                                                        {"2/6/4/17", "fixed_ranks[3] = 17 outside 1..16"},
                                                        {"2/6/0/4", "fixed_ranks[2] = 0"},
                                                        {"2,6,4,4", "separated by '/'"},
                                                        {"2/6//4", "separated by '/'"},
                                                        {"1+1/6/4/4", "gives 2 group ranks; the basis"}})
    test::require_error(
        [&] {
          reg.create("dynakv", {{"fixed_ranks", ranks}, {"pca", tiny.pca_path}}, e.config());
        },
        {message});
  test::require_error(
      [&] {
        reg.create("dynakv", {{"fixed_ranks", "2/6/4/4"}, {"fixed_rate", "0.5"}, {"pca", tiny.pca_path}}, e.config());
      },
      {"not both"});
  test::require_error([&] { reg.create("dynakv", {}, e.config()); }, {"weights=FILE", "fixed_rate"});
  ModelConfig other = e.config();
  other.fingerprint = "0123456789abcdef";
  test::require_error(
      [&] {
        reg.create("dynakv", {{"weights", tiny.weights_path}}, other);
      },
      {"w.json", "not this one"});
  // Found by an audit: an eigenvalue edited into a string aborted the program.
  body["layers"][0]["K"]["eigenvalues"][0] = "x";
  write_artifact(tiny.pca_path, body);
  test::require_error(
      [&] {
        reg.create("dynakv", {{"fixed_rate", "0.25"}, {"pca", tiny.pca_path}}, e.config());
      },
      {"method dynakv", tiny.pca_path, "wrong type", "/layers/0/K/eigenvalues/0"});
  PrefillView view;
  view.n_tokens = 4;
  auto direct = reg.create("dynakv", {{"weights", tiny.weights_path}}, e.config());
  test::require_error([&] { direct->compress(view, Budget{}); }, {"did not pass through its transform"});
  test::require_error([&] { e.resume(e.prefill_capture(ids, {}), &runner); }, {"needs a prefill of its own"});
}

TEST_CASE("DynaKV + SnapKV: within KV size T, every token when T covers them, the window first (2.9.8)", "[dynakv]") {
  TinyDynaKv tiny(2.0f);
  Engine e(*tiny.model);
  std::vector<int32_t> ids(60);
  std::mt19937 rng(12);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 64);
  const auto& reg = MethodRegistry::get();
  auto plain = reg.create("dynakv", {{"weights", tiny.weights_path}}, e.config());
  MethodRunner plain_runner(*plain, KvBudget{});
  const auto want = e.prefill(ids, &plain_runner);
  const auto want_next = e.decode(7);
  auto snap = reg.create("dynakv-snapkv", {{"weights", tiny.weights_path}, {"window", "8"}}, e.config());
  {
    MethodRunner runner(*snap, 60);  // T = the prompt: every token fits (their widths are below d)
    CHECK(e.prefill(ids, &runner) == want);
    CHECK(e.decode(7) == want_next);
    for (const auto& c : e.caches()) CHECK(c.tokens(0) == 61);
  }
  for (int T : {4, 10, 20}) {
    INFO("T = " << T);
    MethodRunner runner(*snap, T);
    e.prefill(ids, &runner);
    const size_t limit = size_t(T) * 2 * tiny.d * 4;
    for (const auto& c : e.caches()) {
      CHECK(c.bytes() <= limit);
      CHECK(c.tokens(0) > 0);
      const auto pos = c.segments(0)[0]->positions();
      CHECK(std::is_sorted(pos.begin(), pos.end()));
      CHECK(pos.back() == 59);  // the newest window token is admitted first
    }
    e.decode(7);
    for (const auto& c : e.caches()) CHECK(c.segments(1)[0]->positions().back() == 60);
  }
}
