// The backward pass: every backward kernel against its reference, every reference against finite
// differences of the forward, and whole-model gradients of tiny random models (llama and qwen2
// layouts, tied and separate heads) against finite differences along random directions.
#include <filesystem>
#include <fstream>
#include <functional>
#include <random>

#include "harness/engine/gradients.hpp"
#include "harness/model/model_file.hpp"
#include "harness/model/random_model.hpp"
#include "kernels/cpu/backward.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/dtype.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

using test::randn;

double dot(const std::vector<float>& a, const std::vector<float>& b) {
  double s = 0;
  for (size_t i = 0; i < a.size(); ++i) s += double(a[i]) * b[i];
  return s;
}

void check_close(const std::vector<float>& got, const std::vector<float>& want, double tol) {
  REQUIRE(got.size() == want.size());
  double scale = 0, worst = 0;
  for (float x : want) scale = std::max(scale, double(std::abs(x)));
  for (size_t i = 0; i < got.size(); ++i) worst = std::max(worst, double(std::abs(got[i] - want[i])));
  INFO("max |got - want| = " << worst << " against max |want| = " << scale);
  CHECK(worst <= tol * std::max(scale, 1e-6));
}

// Central differences of f at x along a few coordinates, against the analytic gradient g.
void check_fd(std::vector<float>& x, const std::function<double()>& f, const std::vector<float>& g, uint32_t seed,
              float h = 1e-3f) {
  std::mt19937 rng(seed);
  std::uniform_int_distribution<size_t> pick(0, x.size() - 1);
  for (int t = 0; t < 12; ++t) {
    const size_t i = pick(rng);
    const float x0 = x[i];
    x[i] = x0 + h;
    const double up = f();
    x[i] = x0 - h;
    const double down = f();
    x[i] = x0;
    const double fd = (up - down) / (2.0 * h);
    INFO("coordinate " << i << ": finite difference " << fd << ", analytic " << g[i]);
    CHECK(std::abs(fd - g[i]) <= 2e-3 + 1e-2 * std::abs(fd));
  }
}

}  // namespace

TEST_CASE(
    "backward kernels: linear, rmsnorm, layernorm, swiglu, gelu and cross-entropy against references and finite "
    "differences",
    "[backward]") {
  const int n = 7, in = 12, out = 10;
  auto x = randn(size_t(n) * in, 1), w = randn(size_t(out) * in, 2, 0.3f), dy = randn(size_t(n) * out, 3);
  std::vector<float> dx1(x.size(), 0.5f), dx2(dx1), dw1(w.size(), 0.25f), dw2(dw1), db1(out, 1.0f), db2(db1);
  linear_backward_ref(x.data(), w.data(), dy.data(), n, in, out, dx1.data(), dw1.data(), db1.data());
  linear_backward(x.data(), w.data(), dy.data(), n, in, out, dx2.data(), dw2.data(), db2.data());
  check_close(dx2, dx1, 1e-5);
  check_close(dw2, dw1, 1e-5);
  check_close(db2, db1, 1e-5);
  {  // sum(dy * (x W^T + b)) has gradient dy W with respect to x
    std::vector<float> y(size_t(n) * out), g(x.size(), 0.0f);
    linear_backward_ref(x.data(), w.data(), dy.data(), n, in, out, g.data(), nullptr, nullptr);
    check_fd(
        x,
        [&] {
          linear_ref(x.data(), w.data(), nullptr, n, in, out, y.data());
          return dot(y, dy);
        },
        g, 4);
    std::vector<float> gw(w.size(), 0.0f);
    linear_backward_ref(x.data(), w.data(), dy.data(), n, in, out, nullptr, gw.data(), nullptr);
    check_fd(
        w,
        [&] {
          linear_ref(x.data(), w.data(), nullptr, n, in, out, y.data());
          return dot(y, dy);
        },
        gw, 5);
  }

  const int dim = 24;
  auto xr = randn(size_t(n) * dim, 6), wr = randn(dim, 7), gr = randn(size_t(n) * dim, 8);
  std::vector<float> rx1(xr.size(), 0.0f), rx2(rx1), rw1(dim, 0.0f), rw2(rw1);
  rmsnorm_backward_ref(xr.data(), wr.data(), gr.data(), n, dim, 1e-5f, rx1.data(), rw1.data());
  rmsnorm_backward(xr.data(), wr.data(), gr.data(), n, dim, 1e-5f, rx2.data(), rw2.data());
  check_close(rx2, rx1, 1e-5);
  check_close(rw2, rw1, 1e-5);
  {
    std::vector<float> y(xr.size());
    auto f = [&] {
      rmsnorm_ref(xr.data(), wr.data(), n, dim, 1e-5f, y.data());
      return dot(y, gr);
    };
    check_fd(xr, f, rx1, 9);
    check_fd(wr, f, rw1, 10);
  }

  {  // LayerNorm (Falcon), rows off zero mean
    auto xl = randn(size_t(n) * dim, 20, 2.0f), bl = randn(dim, 21);
    for (auto& v : xl) v += 3.0f;
    std::vector<float> lx1(xl.size(), 0.5f), lx2(lx1), lw1(dim, 0.25f), lw2(lw1), lb1(dim, 1.0f), lb2(lb1);
    layernorm_backward_ref(xl.data(), wr.data(), gr.data(), n, dim, 1e-5f, lx1.data(), lw1.data(), lb1.data());
    layernorm_backward(xl.data(), wr.data(), gr.data(), n, dim, 1e-5f, lx2.data(), lw2.data(), lb2.data());
    check_close(lx2, lx1, 1e-5);
    check_close(lw2, lw1, 1e-5);
    check_close(lb2, lb1, 1e-5);
    std::vector<float> gx(xl.size(), 0.0f), gw(dim, 0.0f), gb(dim, 0.0f), y(xl.size());
    layernorm_backward_ref(xl.data(), wr.data(), gr.data(), n, dim, 1e-5f, gx.data(), gw.data(), gb.data());
    auto f = [&] {
      layernorm_ref(xl.data(), wr.data(), bl.data(), n, dim, 1e-5f, y.data());
      return dot(y, gr);
    };
    check_fd(xl, f, gx, 22);
    check_fd(wr, f, gw, 23);
    check_fd(bl, f, gb, 24);
  }

  const size_t m = 300;
  {  // GELU
    auto xg = randn(m, 25, 2.0f), dg = randn(m, 26);
    std::vector<float> g1(m), g2(m), y(m);
    gelu_backward_ref(xg.data(), dg.data(), m, g1.data());
    gelu_backward(xg.data(), dg.data(), m, g2.data());
    check_close(g2, g1, 1e-5);
    check_fd(
        xg,
        [&] {
          gelu_ref(xg.data(), m, y.data());
          return dot(y, dg);
        },
        g1, 27);
  }
  auto ga = randn(m, 11, 2.0f), ua = randn(m, 12), da = randn(m, 13);
  std::vector<float> dg1(m), du1(m), dg2(m), du2(m), y(m);
  swiglu_backward_ref(ga.data(), ua.data(), da.data(), m, dg1.data(), du1.data());
  swiglu_backward(ga.data(), ua.data(), da.data(), m, dg2.data(), du2.data());
  check_close(dg2, dg1, 1e-5);
  check_close(du2, du1, 1e-5);
  auto fs = [&] {
    swiglu_ref(ga.data(), ua.data(), m, y.data());
    return dot(y, da);
  };
  check_fd(ga, fs, dg1, 14);
  check_fd(ua, fs, du1, 15);

  const int rows = 5, vocab = 40;
  auto logits = randn(size_t(rows) * vocab, 16, 3.0f);
  const std::vector<int32_t> targets = {3, -1, 39, 0, 17};
  std::vector<float> d1(logits.size()), d2(logits.size());
  const double l1 = cross_entropy_ref(logits.data(), targets.data(), rows, vocab, 0.25f, d1.data());
  auto in_place = logits;
  const double l2 = cross_entropy(in_place.data(), targets.data(), rows, vocab, 0.25f, in_place.data());
  CHECK(l2 == Approx(l1).epsilon(1e-6));
  check_close(in_place, d1, 1e-6);
  for (int j = 0; j < vocab; ++j) CHECK(d1[size_t(vocab) + j] == 0.0f);  // the ignored row
  std::vector<float> scratch(logits.size());
  check_fd(
      logits,
      [&] { return 0.25 * cross_entropy_ref(logits.data(), targets.data(), rows, vocab, 1.0f, scratch.data()); }, d1,
      17);

  // Distillation: the fast kernel against the reference, in place, against finite differences, and
  // with no KL weight the cross-entropy itself.
  const auto teacher = randn(logits.size(), 18, 3.0f);
  std::vector<float> k1(logits.size());
  const auto [ce1, kl1] =
      distill_loss_ref(logits.data(), teacher.data(), targets.data(), rows, vocab, 0.75f, 0.2f, k1.data());
  auto k2 = logits;
  const auto [ce2, kl2] = distill_loss(k2.data(), teacher.data(), targets.data(), rows, vocab, 0.75f, 0.2f, k2.data());
  CHECK(ce2 == Approx(ce1).epsilon(1e-6));
  CHECK(kl2 == Approx(kl1).epsilon(1e-5));
  CHECK(ce1 == Approx(l1).epsilon(1e-9));
  CHECK(kl1 > 0);
  check_close(k2, k1, 1e-6);
  check_fd(
      logits,
      [&] {
        const auto [c, k] =
            distill_loss_ref(logits.data(), teacher.data(), targets.data(), rows, vocab, 1.0f, 1.0f, scratch.data());
        return 0.75 * c + 0.2 * k;
      },
      k1, 19);
  const auto self =
      distill_loss(teacher.data(), teacher.data(), targets.data(), rows, vocab, 0.0f, 1.0f, scratch.data());
  CHECK(std::abs(self.second) < 1e-5);  // KL of a distribution to itself
  distill_loss(logits.data(), teacher.data(), targets.data(), rows, vocab, 0.25f, 0.0f, scratch.data());
  check_close(scratch, d1, 1e-6);

  std::vector<float> table(4 * 3, 0.0f);
  const std::vector<int32_t> ids = {2, 0, 2};
  const std::vector<float> g = {1, 2, 3, 4, 5, 6, 7, 8, 9};
  embed_backward(ids.data(), 3, 3, g.data(), table.data());
  CHECK(table == std::vector<float>{4, 5, 6, 0, 0, 0, 8, 10, 12, 0, 0, 0});
}

TEST_CASE("backward kernels: blockwise causal GQA attention against the reference and finite differences",
          "[backward]") {
  struct Shape {
    int n, hq, hkv, d;
  };
  // 300 tokens cross the 128-query blocks; 1 KV head for 4 query heads, and plain multi-head.
  for (const Shape& s : {Shape{300, 4, 1, 16}, Shape{37, 6, 2, 8}, Shape{9, 2, 2, 4}}) {
    INFO("n " << s.n << " hq " << s.hq << " hkv " << s.hkv << " d " << s.d);
    auto q = randn(size_t(s.n) * s.hq * s.d, 20), k = randn(size_t(s.n) * s.hkv * s.d, 21),
         v = randn(size_t(s.n) * s.hkv * s.d, 22), dout = randn(q.size(), 23);
    std::vector<float> o1(q.size()), o2(q.size()), lse1(size_t(s.hq) * s.n), lse2(lse1.size());
    attention_forward_ref(q.data(), k.data(), v.data(), s.n, s.hq, s.hkv, s.d, o1.data(), lse1.data());
    attention_forward(q.data(), k.data(), v.data(), s.n, s.hq, s.hkv, s.d, o2.data(), lse2.data());
    check_close(o2, o1, 1e-5);
    check_close(lse2, lse1, 1e-6);
    {  // the forward equals the engine's reference attention
      std::vector<int32_t> pos(static_cast<size_t>(s.n));
      std::iota(pos.begin(), pos.end(), 0);
      std::vector<float> o3(q.size());
      attention_ref(q.data(), k.data(), v.data(), s.n, s.n, s.hq, s.hkv, s.d, pos.data(), pos.data(), o3.data());
      check_close(o3, o1, 1e-5);
    }
    std::vector<float> dq1(q.size()), dk1(k.size()), dv1(v.size()), dq2(q.size(), 9.0f), dk2(k.size(), 9.0f),
        dv2(v.size(), 9.0f);
    attention_backward_ref(q.data(), k.data(), v.data(), o1.data(), lse1.data(), dout.data(), s.n, s.hq, s.hkv, s.d,
                           dq1.data(), dk1.data(), dv1.data());
    attention_backward(q.data(), k.data(), v.data(), o2.data(), lse2.data(), dout.data(), s.n, s.hq, s.hkv, s.d,
                       dq2.data(), dk2.data(), dv2.data());
    check_close(dq2, dq1, 1e-4);
    check_close(dk2, dk1, 1e-4);
    check_close(dv2, dv1, 1e-4);
    if (s.n > 100) continue;  // the reference is O(n^2 d) per evaluation
    std::vector<float> o(q.size()), l(lse1.size());
    auto f = [&] {
      attention_forward_ref(q.data(), k.data(), v.data(), s.n, s.hq, s.hkv, s.d, o.data(), l.data());
      return dot(o, dout);
    };
    check_fd(q, f, dq1, 24);
    check_fd(k, f, dk1, 25);
    check_fd(v, f, dv1, 26);
  }
}

TEST_CASE("model gradients of tiny random models equal finite differences of the loss", "[backward]") {
  struct Case {
    const char* arch;
    bool tied;
    int kv_heads;
  };
  for (const Case& c : {Case{"llama", true, 2}, Case{"qwen2", false, 1}}) {
    INFO(c.arch << (c.tied ? " tied" : " separate head"));
    ModelShape shape;
    shape.name = "tiny";
    shape.arch = c.arch;
    shape.layers = 2;
    shape.hidden = 32;
    shape.heads = 4;
    shape.kv_heads = c.kv_heads;
    shape.ffn = 48;
    shape.vocab = 64;
    shape.context = 256;
    shape.tied_embeddings = c.tied;
    const test::TempDir dir("tiny_model");
    const auto path = (dir / fmt::format("kvb_tiny_{}.gguf", c.arch)).string();
    write_random_model(path, shape, DType::F32, 7);
    auto model = ModelFile::open(path);
    ModelGradients mg(*model);
    mg.set_loss_chunk(5);  // several loss chunks
    std::vector<int32_t> ids(19);
    std::mt19937 rng(3);
    for (auto& t : ids) t = static_cast<int32_t>(rng() % 64);
    const auto names = mg.tensor_names();
    const std::set<std::string> all(names.begin(), names.end());
    CHECK(all.count("blk.1.attn_k.weight"));
    CHECK(all.count("blk.0.attn_q.bias") == (std::string(c.arch) == "qwen2"));
    CHECK(all.count("output.weight") == !c.tied);
    const LossGradients g = mg.compute(ids, all);
    CHECK(g.n_targets == 18);
    CHECK(g.loss == Approx(mg.loss(ids)).epsilon(1e-6));
    CHECK(g.grads.size() == all.size());
    // Along a random direction per tensor: <grad, delta> against the central difference of the loss.
    uint32_t seed = 100;
    for (const auto& name : names) {
      auto& w = mg.weight(name);
      const auto delta = randn(w.size(), ++seed);
      const auto w0 = w;
      const float h = 1e-3f;
      for (size_t i = 0; i < w.size(); ++i) w[i] = w0[i] + h * delta[i];
      const double up = mg.loss(ids);
      for (size_t i = 0; i < w.size(); ++i) w[i] = w0[i] - h * delta[i];
      const double down = mg.loss(ids);
      w = w0;
      const double fd = (up - down) / (2.0 * h), analytic = dot(g.grads.at(name), delta);
      INFO(name << ": finite difference " << fd << ", analytic " << analytic);
      CHECK(std::abs(fd - analytic) <= 2e-3 + 2e-2 * std::abs(analytic));
    }
    // Asking for one layer's K/V weights gives the same numbers as asking for everything.
    const LossGradients kv = mg.compute(ids, {"blk.1.attn_k.weight", "blk.1.attn_v.weight"});
    CHECK(kv.grads.size() == 2);
    CHECK(kv.grads.at("blk.1.attn_k.weight") == g.grads.at("blk.1.attn_k.weight"));
    CHECK(kv.grads.at("blk.1.attn_v.weight") == g.grads.at("blk.1.attn_v.weight"));
    // Targets two ahead (Palu's Fisher loss): the mean cross-entropy of the logits at ids[t + 2], and
    // gradients that follow the loss it reports.
    {
      std::vector<float> logits;
      const LossOptions two{.logits_out = &logits, .target_offset = 2};
      const LossGradients g2 = mg.compute(ids, {"blk.0.attn_k.weight"}, nullptr, two);
      CHECK(g2.n_targets == 17);
      const int V = shape.vocab;
      double ce = 0;
      for (size_t t = 0; t + 2 < ids.size(); ++t) {
        const float* row = logits.data() + t * size_t(V);
        const double m = *std::max_element(row, row + V);
        double z = 0;
        for (int j = 0; j < V; ++j) z += std::exp(row[j] - m);
        ce += m + std::log(z) - row[ids[t + 2]];
      }
      CHECK(g2.loss == Approx(ce / 17).epsilon(1e-5));
      CHECK(std::abs(g2.loss - g.loss) > 1e-4);  // not the next-token loss
      auto& w = mg.weight("blk.0.attn_k.weight");
      const auto delta = randn(w.size(), 999), w0 = w;
      const float h = 1e-3f;
      for (size_t i = 0; i < w.size(); ++i) w[i] = w0[i] + h * delta[i];
      const double up = mg.compute(ids, {}, nullptr, {.target_offset = 2}).loss;
      for (size_t i = 0; i < w.size(); ++i) w[i] = w0[i] - h * delta[i];
      const double down = mg.compute(ids, {}, nullptr, {.target_offset = 2}).loss;
      w = w0;
      const double fd = (up - down) / (2.0 * h), analytic = dot(g2.grads.at("blk.0.attn_k.weight"), delta);
      INFO("offset 2: finite difference " << fd << ", analytic " << analytic);
      CHECK(std::abs(fd - analytic) <= 2e-3 + 2e-2 * std::abs(analytic));
      test::require_error([&] { mg.compute(ids, {}, nullptr, {.target_offset = 19}); },
                          {"target offset of 19", "19 tokens"});
    }
    test::require_error([&] { mg.compute(ids, {"blk.0.attn_x.weight"}); },
                        {"no model tensor 'blk.0.attn_x.weight'", "attn_k"});
    test::require_error([&] { mg.compute(std::vector<int32_t>{5}, {}); }, {"1 tokens", "at least 2"});
    test::require_error([&] { mg.compute(std::vector<int32_t>{5, 64}, {}); }, {"token id 64"});
    std::filesystem::remove(path);
  }
}

TEST_CASE("default-model gradients of every weight match torch autograd on the same GGUF", "[backward][model]") {
  const auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  // tools/reference/grad_reference.py --float64: transformers' LlamaForCausalLM loaded from the GGUF,
  // computed in float64 (the ground truth; torch's own fp32 gradients are 1.8e-4 of the largest entry
  // away from it, ours 1.2e-5), 256 tokens; per tensor the Frobenius norm, its largest entry and 24
  // sampled entries.
  std::ifstream in(test::fixture("engine/grad_reference_256_f64.json"));
  REQUIRE(in.good());
  const auto ref = nlohmann::json::parse(in);
  auto model = ModelFile::open(*path);
  ModelGradients mg(*model);
  const auto ids = ref.at("ids").get<std::vector<int32_t>>();
  const auto names = mg.tensor_names();
  const LossGradients g = mg.compute(ids, std::set<std::string>(names.begin(), names.end()));
  CHECK(g.loss == Approx(ref.at("loss").get<double>()).margin(2e-6));
  CHECK(g.n_targets == ref.at("n_targets").get<int>());
  const double gmax = std::abs(ref.at("max_abs_grad").at("value").get<double>());
  double worst = 0;
  size_t compared = 0;
  for (const auto& t : ref.at("tensors")) {
    const std::string name = t.at("name");
    INFO(name);
    REQUIRE(g.grads.count(name));
    const auto& v = g.grads.at(name);
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    CHECK(std::sqrt(ss) == Approx(t.at("frobenius").get<double>()).epsilon(1e-3));
    auto samples = t.at("samples");
    samples.push_back(t.at("argmax"));
    for (const auto& s : samples) {
      const auto i = s.at(0).get<size_t>();
      REQUIRE(i < v.size());
      worst = std::max(worst, std::abs(double(v[i]) - s.at(1).get<double>()) / gmax);
      ++compared;
    }
  }
  CHECK(compared == 272 * 25);
  INFO("largest sampled difference, relative to the largest gradient entry: " << worst);
  CHECK(worst < 1e-4);
}
