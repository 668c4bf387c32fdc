// Method invariants, driven by the registry so that every registered method is covered, plus the
// shared parts against their references and the papers' worked examples.
#include <algorithm>

#include <fstream>
#include <numeric>
#include <random>
#include <set>

#include <yaml-cpp/yaml.h>

#include "harness/engine/backend.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/method/optimizer.hpp"
#include "harness/method/parts.hpp"
#include "harness/method/prefill_dump.hpp"
#include "harness/model/model_file.hpp"
#include "harness/model/random_model.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "kernels/cpu/ops.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"

using namespace kvb;
using kvb::test::kept_positions;
using kvb::test::SyntheticLayer;

namespace {

using test::method_test_params;

// Shapes for tests that only create methods.
ModelConfig small_config() {
  ModelConfig c;
  c.n_layers = 2;
  c.n_heads = 4;
  c.n_kv_heads = 2;
  c.head_dim = 8;
  return c;
}

// A method defined entirely in this test file: keeps the T most recent tokens. Registering it needs
// no edit anywhere else, and the registry-driven invariants below cover it like the real ones.
class RecentOnly final : public Method {
 public:
  LayerCache compress(const PrefillView& v, const Budget& b) override {
    std::vector<int32_t> keep(b.tokens);
    std::iota(keep.begin(), keep.end(), v.n_tokens - b.tokens);
    return gather(v, gqa(), std::vector<std::vector<int32_t>>(stored_heads(), keep));
  }
};
const bool toy_registered = register_method(
    {"test_recent_only", "test-only: most recent T tokens", {}, [] { return std::make_unique<RecentOnly>(); }});

}  // namespace

TEST_CASE("every registered method: bytes within budget, distinct positions sorted per segment, deterministic",
          "[methods]") {
  REQUIRE(toy_registered);
  const auto& reg = MethodRegistry::get();
  for (const auto& name : reg.names()) {
    if (reg.info(name).changes_model) continue;  // runs only inside its own prefill (its tests: test_dynakv)
    for (const char* gqa : {"native", "repeat"}) {
      for (int T : {40, 64, 100}) {
        SyntheticLayer L(300, 6, 2, 16, 32, 11);
        INFO(name << " gqa=" << gqa << " T=" << T);
        auto m = reg.create(name, method_test_params(name, {{"gqa", gqa}}), L.cfg);
        if (m->reads_whole_prompt()) break;  // decides inside an engine's prefill (KVzip: its own tests)
        // A method that sets its own memory (KVmix) runs without a budget and keeps every position.
        const KvBudget budget = m->budgeted() ? KvBudget(T) : KvBudget{};
        MethodRunner runner(*m, budget);
        for (int layer = 0; layer < L.cfg.n_layers; ++layer) {
          L.view.layer = layer;
          LayerCache c(6, 2, 16);
          runner.on_layer(L.view, c);
          const auto kept = kept_positions(c);
          CHECK(static_cast<int>(kept.size()) == (std::string(gqa) == "repeat" ? 6 : 2));
          for (int h = 0; h < c.n_cache_heads(); ++h)
            for (const auto& seg : c.segments(h))
              CHECK(std::is_sorted(seg->positions().begin(), seg->positions().end()));
          for (const auto& p : kept) {
            if (!m->budgeted()) CHECK(p.size() == 300);
            CHECK(std::set<int32_t>(p.begin(), p.end()).size() == p.size());
            CHECK((p.empty() || (p.front() >= 0 && p.back() < 300)));
          }
          LayerCache again(6, 2, 16);
          auto m2 = reg.create(name, method_test_params(name, {{"gqa", gqa}}), L.cfg);
          MethodRunner r2(*m2, budget);
          r2.on_layer(L.view, again);
          CHECK(kept_positions(again) == kept);
        }
        if (m->budgeted() && !m->may_exceed_budget())
          CHECK(runner.prefill_kv_bytes() <= runner.budget().bytes_per_layer * L.cfg.n_layers);
        CHECK(runner.compressed());
      }
    }
  }
}

TEST_CASE("every registered method keeps everything when the prompt fits the budget", "[methods]") {
  const auto& reg = MethodRegistry::get();
  SyntheticLayer L(50, 6, 2, 16, 32, 3);
  for (const auto& name : reg.names()) {
    INFO(name);
    if (reg.info(name).changes_model) continue;
    auto m = reg.create(name, method_test_params(name), L.cfg);
    if (!m->budgeted()) {
      test::require_error([&] { MethodRunner(*m, 50); }, {"takes no KV size"});
      continue;
    }
    // A prompt of exactly T tokens is kept whole, but by HeadKV, which compresses it as its authors'
    // code does.
    MethodRunner runner(*m, 50);
    LayerCache c(6, 2, 16);
    runner.on_layer(L.view, c);
    if (name == "headkv") {
      CHECK(runner.compressed());
      continue;
    }
    CHECK_FALSE(runner.compressed());
    for (const auto& p : kept_positions(c)) CHECK(p.size() == 50);
  }
}

TEST_CASE("in ratio mode every method keeps floor(S (1 - p_c)) tokens per head of every prompt", "[methods]") {
  const auto& reg = MethodRegistry::get();
  for (int S : {50, 300}) {
    SyntheticLayer L(S, 6, 2, 16, 32, 5);
    for (const std::string name : {"snapkv", "h2o", "streamingllm"}) {
      INFO(name << " S=" << S);
      auto m = reg.create(
          name,
          method_test_params(name, name == "streamingllm" ? std::map<std::string, std::string>{}
                                                          : std::map<std::string, std::string>{{"window", "8"}}),
          L.cfg);
      MethodRunner runner(*m, KvBudget::compression_ratio(0.75));
      LayerCache c(6, 2, 16);
      runner.on_layer(L.view, c);
      CHECK(runner.compressed());
      CHECK(runner.budget().tokens == S / 4);
      CHECK(runner.cache_profile()["budget_tokens"] == S / 4);
      for (const auto& p : kept_positions(c)) CHECK(static_cast<int>(p.size()) == S / 4);
    }
  }
  // A short prompt's T below the window (S = 20: T = 5 < 8): kvpress keeps T of the window's tokens,
  // kvbench the last T; the run goes on. Found by an independent check: the sample's error ended the run.
  SyntheticLayer L(20, 6, 2, 16, 32, 5);
  auto m = reg.create("snapkv", {{"window", "8"}}, L.cfg);
  MethodRunner runner(*m, KvBudget::compression_ratio(0.75));
  LayerCache c(6, 2, 16);
  runner.on_layer(L.view, c);
  for (const auto& p : kept_positions(c)) CHECK(p == std::vector<int32_t>{15, 16, 17, 18, 19});
  // Wrappers over it rank the window's other tokens with the prefix (found by a review: they failed).
  for (const std::string name : {"kvcrush", "vector"}) {
    INFO(name);
    auto w = reg.create(name, method_test_params(name, {{"base", "snapkv"}, {"base.window", "8"}}), L.cfg);
    MethodRunner wr(*w, KvBudget::compression_ratio(0.75));
    LayerCache wc(6, 2, 16);
    wr.on_layer(L.view, wc);
    CHECK(wr.compressed());
    CHECK(wr.prefill_kv_bytes() <= size_t(L.cfg.n_layers) * wr.budget().bytes_per_layer);
  }
}

TEST_CASE("a method at a budget >= the prompt gives exactly the FullKV logits", "[methods][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  Engine e(*model);
  std::vector<int32_t> ids(60);
  for (int i = 0; i < 60; ++i) ids[i] = 100 + 37 * i;
  e.prefill(ids);
  const auto full = e.decode(500);
  const auto& reg = MethodRegistry::get();
  for (const auto& name : reg.names()) {
    if (reg.info(name).changes_model) continue;
    for (const char* gqa : {"native", "repeat"}) {
      INFO(name << " " << gqa);
      auto m = reg.create(name, method_test_params(name, {{"gqa", gqa}}), e.config());
      if (!m->budgeted()) continue;  // no budget to fit the prompt into; KVmix's own tests cover r = 1
      MethodRunner runner(*m, 64);
      e.prefill(ids, &runner);
      CHECK(e.decode(500) == full);  // bit-identical
    }
  }
  // FullKV through a runner also equals the engine's own cache when compression is forced.
  auto fk = reg.create("fullkv", {}, e.config());
  MethodRunner forced(*fk, 8);
  e.prefill(ids, &forced);
  CHECK(forced.compressed());
  CHECK(e.decode(500) == full);
}

TEST_CASE("window scorer equals its reference, pooling edges, GQA mean", "[methods]") {
  SyntheticLayer L(200, 6, 2, 16, 16, 5);
  for (auto reduce : {WindowReduce::Sum, WindowReduce::Mean}) {
    auto fast = window_attention_scores(L.view, 16, reduce), ref = window_attention_scores_ref(L.view, 16, reduce);
    for (size_t h = 0; h < fast.size(); ++h)
      for (size_t j = 0; j < fast[h].size(); ++j) REQUIRE(fast[h][j] == Approx(ref[h][j]).margin(1e-6));
  }
  const std::vector<float> a = {1, 2, 3, 4, 5, 6};
  CHECK(pool1d(a, 5, Pooling::Avg)[0] == Approx((1 + 2 + 3) / 5.0));
  CHECK(pool1d(a, 3, Pooling::Max) == std::vector<float>{2, 3, 4, 5, 6, 6});
  CHECK(pool1d({-1, -2, -3}, 3, Pooling::Max)[0] == -1);  // padding never wins a max
  HeadScores s = {{1, 0}, {3, 0}, {5, 0}, {0, 2}, {0, 4}, {0, 6}};
  auto g = reduce_for_gqa(s, 2, GqaMode::Native);
  CHECK(g == HeadScores{{3, 0}, {0, 4}});
  CHECK(top_k_sorted({0.5f, 0.9f, 0.5f, 0.1f}, 2) == std::vector<int32_t>{0, 1});  // tie to lower position
}

TEST_CASE("fake_quantize: Palu's per-token quantizer, asymmetric and symmetric, groups, clip", "[methods][palu]") {
  // Asymmetric 2 bits over [-1, 2]: scale 1, zero point 1; 0.4 rounds to 0, 1.5 to 2 (half to even).
  std::vector<float> x = {-1.0f, 0.4f, 1.5f, 2.0f};
  LatentQuant q;
  q.bits = 2;
  fake_quantize(x.data(), 4, q);
  CHECK(x == std::vector<float>{-1.0f, 0.0f, 2.0f, 2.0f});
  x = {0.0f, 2.5f, 3.0f};  // scale 1: 2.5 steps round to 2 (half away from zero would give 3)
  fake_quantize(x.data(), 3, q);
  CHECK(x[1] == 2.0f);
  // Symmetric 3 bits: scale max|x| / 3, codes in [-4, 3]; in groups of two, each its own scale.
  x = {-3.0f, 1.2f, 0.5f, -0.25f};
  q.bits = 3;
  q.sym = true;
  q.group_size = 2;
  fake_quantize(x.data(), 4, q);
  CHECK(x[0] == -3.0f);
  CHECK(x[1] == 1.0f);
  CHECK(x[2] == Approx(0.5f));
  CHECK(x[3] == Approx(-1.0f / 3));  // -1.5 steps round to -2
  // Clip shrinks the range: 0.5 x max 4 gives scale 2 / 3 at 2 bits symmetric (codes -2..1).
  x = {4.0f, -4.0f, 0.0f};
  q.bits = 2;
  q.group_size = 0;
  q.clip = 0.5;
  fake_quantize(x.data(), 3, q);
  CHECK(x[0] == Approx(2.0f));
  CHECK(x[1] == Approx(-4.0f));
  CHECK(x[2] == 0.0f);
  // A constant positive latent: the range floored at 1e-5 and the zero point clamped to 0 leave it at
  // 1e-5, as Palu's formula does.
  x = {0.25f, 0.25f};
  q = LatentQuant{};
  q.bits = 3;
  fake_quantize(x.data(), 2, q);
  CHECK(x[0] == Approx(1e-5f));
  CHECK(q.stored_bits(64) == 64 * 3 + 32);
  q.sym = true;
  q.group_size = 32;
  CHECK(q.stored_bits(64) == 64 * 3 + 2 * 16);
}

TEST_CASE("SnapKV keeps the window and a one-hot target with its pooled neighbourhood", "[methods]") {
  SyntheticLayer L(256, 2, 1, 16, 8, 7, 0.01f);  // near-uniform attention
  // Make every window query attend strongly to position 100: align its key with the queries.
  for (int c = 0; c < 16; ++c) L.k[size_t(100) * 16 + c] = 0;
  for (int i = 0; i < 8; ++i)
    for (int h = 0; h < 2; ++h)
      for (int c = 0; c < 16; ++c) L.k[size_t(100) * 16 + c] += L.q[(size_t(248 + i) * 2 + h) * 16 + c] * 5;
  ModelConfig cfg = L.cfg;
  auto m = MethodRegistry::get().create("snapkv", {{"window", "8"}, {"gqa", "repeat"}}, cfg);
  MethodRunner r(*m, 16);
  LayerCache c(2, 2, 16);
  r.on_layer(L.view, c);
  for (const auto& p : kept_positions(c)) {
    CHECK(p.size() == 16);
    CHECK(std::count(p.begin(), p.end(), 100) == 1);
    for (int j = 248; j < 256; ++j) CHECK(std::count(p.begin(), p.end(), j) == 1);
    // Max pooling with kernel 7 gives 97..103 the same pooled score, so they are kept together.
    for (int j = 97; j <= 103; ++j) CHECK(std::count(p.begin(), p.end(), j) == 1);
  }
  // A KV size below the window is an error naming both.
  auto below_window = [&](const char* name) {
    return [&cfg, &L, name] {
      auto small = MethodRegistry::get().create(name, {{"window", "8"}}, cfg);
      MethodRunner sr(*small, 6);
      LayerCache sc(2, 1, 16);
      sr.on_layer(L.view, sc);
    };
  };
  test::require_error(below_window("snapkv"), {"a KV size of 6 tokens", "beyond the 8-token window"});
  test::require_error(below_window("pyramidkv"), {"KV size 6", "window 8"});
}

TEST_CASE("H2O with uniform attention keeps the earliest tokens, StreamingLLM's kept set", "[methods]") {
  SyntheticLayer L(120, 2, 2, 8, 8, 9, 0.0f);  // all-zero Q/K: uniform causal attention
  std::fill(L.q.begin(), L.q.end(), 0.0f);
  std::fill(L.k.begin(), L.k.end(), 0.0f);
  L.refresh_colsum();
  // s[j] = sum_{i >= j} 1/(i+1), decreasing in j.
  double s5 = 0;
  for (int i = 5; i < 120; ++i) s5 += 1.0 / (i + 1);
  CHECK(L.colsum[5] == Approx(s5).epsilon(1e-5));
  auto h2o = MethodRegistry::get().create("h2o", {{"window", "8"}}, L.cfg);
  MethodRunner r(*h2o, 20);
  LayerCache c(2, 2, 8);
  r.on_layer(L.view, c);
  std::vector<int32_t> want(12);
  std::iota(want.begin(), want.end(), 0);
  for (int j = 112; j < 120; ++j) want.push_back(j);
  for (const auto& p : kept_positions(c)) CHECK(p == want);

  auto sl = MethodRegistry::get().create("streamingllm", {}, L.cfg);
  MethodRunner rs(*sl, 20);
  LayerCache cs(2, 2, 8);
  rs.on_layer(L.view, cs);
  std::vector<int32_t> sw = {0, 1, 2, 3};
  for (int j = 104; j < 120; ++j) sw.push_back(j);
  for (const auto& p : kept_positions(cs)) CHECK(p == sw);
}

TEST_CASE("every wrapper over every selector stays within the bytes of T", "[methods]") {
  const auto& reg = MethodRegistry::get();
  for (const auto& wrapper : reg.names(Composition::Wrapper))
    for (const auto& selector : reg.names(Composition::Selector))
      for (const char* gqa : {"native", "repeat"}) {
        auto params = method_test_params(wrapper, {{"base", selector}, {"gqa", gqa}});
        for (const auto& [k, v] : method_test_params(selector)) params["base." + k] = v;
        INFO(wrapper << " over " << selector << ", gqa " << gqa);
        SyntheticLayer L(300, 6, 2, 16, 32, 2);
        auto m = reg.create(wrapper, params, L.cfg);
        if (m->reads_whole_prompt()) continue;  // its base decides inside an engine's prefill (KVzip)
        MethodRunner runner(*m, 80);
        for (int layer = 0; layer < L.cfg.n_layers; ++layer) {
          L.view.layer = layer;
          LayerCache c(6, gqa == std::string("repeat") ? 6 : 2, 16);
          runner.on_layer(L.view, c);
          for (auto head : kept_positions(c)) {  // each position once, over all of a head's segments
            std::sort(head.begin(), head.end());
            CHECK(std::adjacent_find(head.begin(), head.end()) == head.end());
          }
        }
        if (!m->may_exceed_budget())
          CHECK(runner.prefill_kv_bytes() <= runner.budget().bytes_per_layer * L.cfg.n_layers);
        CHECK(runner.cache_profile()["layers"].size() == size_t(L.cfg.n_layers));
      }
}

TEST_CASE("method parameters are validated with the valid keys listed", "[methods]") {
  const ModelConfig cfg = small_config();
  const auto& reg = MethodRegistry::get();
  test::require_error(
      [&] {
        reg.create("snapkv", {{"windw", "8"}}, cfg);
      },
      {"unknown parameter 'windw'", "window", "kernel"});
  test::require_error([&] { reg.create("snapkv", {{"window", "0"}}, cfg); }, {"'window' = '0'", "[1, 4096]"});
  test::require_error([&] { reg.create("snapkv", {{"pooling", "median"}}, cfg); }, {"max|avg|none"});
  test::require_error([&] { reg.create("snapkv", {{"gqa", "both"}}, cfg); }, {"native|repeat"});
  test::require_error([&] { reg.create("nosuch", {}, cfg); }, {"unknown method 'nosuch'", "snapkv"});
}

TEST_CASE("H2O decode-time eviction holds every head at T and keeps the recent window", "[methods][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  Engine e(*model);
  std::vector<int32_t> ids(80);
  for (int i = 0; i < 80; ++i) ids[i] = 200 + 13 * i;
  for (const char* gqa : {"native", "repeat"}) {
    INFO(gqa);
    auto m =
        MethodRegistry::get().create("h2o", {{"window", "4"}, {"decode_eviction", "true"}, {"gqa", gqa}}, e.config());
    MethodRunner runner(*m, 32);
    e.prefill(ids, &runner);
    for (int step = 0; step < 10; ++step) e.decode(300 + step);
    for (const auto& c : e.caches())
      for (int h = 0; h < c.n_cache_heads(); ++h) {
        REQUIRE(c.tokens(h) == 32);
        const auto pos = c.segments(h)[0]->positions();
        for (int32_t p = 86; p < 90; ++p) CHECK(std::count(pos.begin(), pos.end(), p) == 1);
      }
  }
}

TEST_CASE("H2O decode-time eviction starts every prompt afresh, also one that fits the KV size", "[methods][model]") {
  // Found by an audit: a prompt of S <= T skipped the method's prefill step, so its running scores were
  // the previous prompt's (a sweep reuses one method for all its samples).
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  Engine e(*model);
  const auto run = [&](Method& m, int first, int n) {
    std::vector<int32_t> ids(static_cast<size_t>(n));
    for (int i = 0; i < n; ++i) ids[size_t(i)] = first + 7 * i;
    MethodRunner runner(m, 32);
    std::vector<std::vector<float>> logits{e.prefill(ids, &runner)};
    for (int step = 0; step < 15; ++step) logits.push_back(e.decode(400 + 5 * step));  // evicts from step 9 on
    return logits;
  };
  const std::map<std::string, std::string> p{{"window", "4"}, {"decode_eviction", "true"}};
  auto reused = MethodRegistry::get().create("h2o", p, e.config());
  run(*reused, 300, 20);
  const auto after_another = run(*reused, 500, 24);
  auto fresh = MethodRegistry::get().create("h2o", p, e.config());
  const auto alone = run(*fresh, 500, 24);
  for (size_t step = 0; step < alone.size(); ++step) {
    INFO("step " << step);
    CHECK((alone[step] == after_another[step]));  // bit for bit; a bool, not two 49,152-float rows
  }
}

TEST_CASE("H2O legacy window-only mask lets early queries score future keys", "[methods]") {
  // methods/h2o/README.md §2: the paper-era code masked only the last w rows. A key that only earlier
  // queries attend to, and only if they may look ahead, is kept by the legacy scoring alone.
  SyntheticLayer L(64, 2, 2, 8, 64, 21, 0.0f);
  std::fill(L.q.begin(), L.q.end(), 0.0f);
  std::fill(L.k.begin(), L.k.end(), 0.0f);
  for (int i = 0; i < 40; ++i)
    for (int h = 0; h < 2; ++h) L.q[(size_t(i) * 2 + h) * 8] = 4.0f;
  for (int g = 0; g < 2; ++g) L.k[(size_t(50) * 2 + g) * 8] = 4.0f;  // q_i . k_50 = 16 for i < 40
  L.refresh_colsum();
  L.view.q_window = L.q.data();
  auto kept_with = [&](const char* mask) {
    auto m = MethodRegistry::get().create("h2o", {{"window", "8"}, {"mask", mask}}, L.cfg);
    MethodRunner r(*m, 16);
    LayerCache c(2, 2, 8);
    r.on_layer(L.view, c);
    return kept_positions(c);
  };
  for (const auto& p : kept_with("legacy_window_only")) CHECK(std::count(p.begin(), p.end(), 50) == 1);
  for (const auto& p : kept_with("causal")) CHECK(std::count(p.begin(), p.end(), 50) == 0);
}

TEST_CASE("per-head budgets follow HeadKV's guaranteed share plus proportional pool", "[methods]") {
  // Two layers x two heads, T = 128, w = 8, beta = 2: b = 120, b//beta = 60 guaranteed-free pool per
  // head, 60 guaranteed each.
  const std::vector<std::vector<double>> s = {{1, 1}, {2, 4}};
  const auto caps = per_head_budgets(s, 128, 8, 2.0);
  // pool = 60 x 4 = 240 shared in proportion 1:1:2:4 of 8.
  CHECK(caps == std::vector<std::vector<int>>{{60 + 30, 60 + 30}, {60 + 60, 60 + 120}});
  double mean = 0;
  for (const auto& l : caps)
    for (int c : l) mean += c / 4.0;
  CHECK(mean == Approx(120).margin(0.5));
  // Uniform scores give every head b.
  const auto flat = per_head_budgets({{3, 3, 3}}, 64, 8, 20.0);
  CHECK(flat == std::vector<std::vector<int>>{{56, 56, 56}});
  test::require_error([] { per_head_budgets({{1}}, 8, 8, 2.0); }, {"must exceed the window"});
}

TEST_CASE("method parameters from YAML", "[methods]") {
  const ModelConfig cfg = small_config();
  const auto node = YAML::Load("window: 8\npooling: avg\ngqa: repeat\n");
  auto m = MethodRegistry::get().create("snapkv", params_from_yaml(node, "spec.yaml"), cfg);
  CHECK(m->params().get_int("window") == 8);
  CHECK(m->params().get("pooling") == "avg");
  CHECK(m->params().get("kernel") == "7");  // default filled in
  CHECK(m->gqa() == GqaMode::Repeat);
  test::require_error([] { params_from_yaml(YAML::Load("window: [1, 2]"), "spec.yaml"); },
                      {"spec.yaml:1:9", "'window'", "single value"});
  test::require_error([] { params_from_yaml(YAML::Load("- 1\n- 2"), "spec.yaml"); }, {"spec.yaml:1:1", "mapping"});
  test::require_error(
      [&] { MethodRegistry::get().create("snapkv", params_from_yaml(YAML::Load("kernal: 5"), "s.yaml"), cfg); },
      {"unknown parameter 'kernal'", "kernel"});
}

TEST_CASE("a name the registry lacks goes to the resolver first and python names say where they run", "[methods]") {
  auto& reg = MethodRegistry::get();
  kvb::test::require_error([&] { reg.info("python:mod.Cls"); }, {"python:mod.Cls", "written in Python", "kvbench.run"});
  std::vector<std::string> asked;
  reg.set_resolver([&](const std::string& name) {
    asked.push_back(name);
    if (name != "resolved_on_demand") return false;
    MethodInfo info = reg.info("streamingllm");
    info.name = name;
    reg.add(info);
    return true;
  });
  CHECK(reg.info("resolved_on_demand").name == "resolved_on_demand");
  CHECK(reg.info("resolved_on_demand").name == "resolved_on_demand");  // registered now: not asked again
  kvb::test::require_error([&] { reg.info("still_unknown"); }, {"unknown method 'still_unknown'"});
  CHECK(asked == std::vector<std::string>{"resolved_on_demand", "still_unknown"});
  reg.set_resolver(nullptr);
}

namespace {

// Parameters under which `name` runs on a random model without offline artifacts: its test
// parameters, uniform head scores for a method that reads profiled ones, and the files its test
// registers a maker for (written to `dir`).
std::map<std::string, std::string> runnable_params(const std::string& name, const ModelFile& model,
                                                   const std::filesystem::path& dir) {
  auto p = method_test_params(name);
  for (const auto& spec : MethodRegistry::get().param_specs(name))
    if (spec.name == "scores") p.emplace("scores", "uniform");
  if (const auto it = test::method_test_artifacts().find(name); it != test::method_test_artifacts().end())
    p.merge(it->second(model, dir));
  return p;
}

}  // namespace

TEST_CASE("every registered method dumps its prefill views and gives logits under its cache", "[methods][engine]") {
  const test::TempDir dir("method_logits");
  ModelShape shape;
  shape.name = "tiny";
  shape.layers = 2;
  shape.hidden = 64;  // head_dim 16: KVmix's test groups of 16
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.ffn = 48;
  shape.vocab = 64;
  shape.context = 256;
  const std::string path = (dir / "tiny.gguf").string();
  write_random_model(path, shape, DType::F32, 23);
  auto model = ModelFile::open(path);
  Engine e(*model);
  std::vector<int32_t> ids(96);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((7 * i + 3) % 64);
  const StepLogits full = step_logits(e, ids, 4, {});
  REQUIRE(full.logits.size() == 5);

  const auto& reg = MethodRegistry::get();
  for (const auto& name : reg.names()) {
    INFO(name);
    const auto params = runnable_params(name, *model, dir.path());
    const int budget = reg.info(name).budgeted ? 48 : 0;  // half the prompt, room beyond the 32-token windows
    {
      auto [m, runner] = choose_method(name, params, budget, e.config(), name);
      // KVzip asks the model to repeat the context in words: the tiny model has no tokenizer (its own
      // tests run it, the dump included, on the default model).
      if (runner && runner->reads_whole_prompt()) continue;
      const auto out = dir / ("dump_" + name);
      std::filesystem::create_directories(out);
      PrefillDumper dumper(out.string(), {0, 1}, 8, runner.get());
      e.prefill(ids, &dumper);
      for (const char* f : {"layer0.k.npy", "layer1.v.npy", "layer1.q_window.npy"})
        CHECK(std::filesystem::exists(out / f));
      CHECK(std::filesystem::exists(out / "layer1.widths.npy") == bool(runner));
    }
    auto [m, runner] = choose_method(name, params, budget, e.config(), name);
    // Teacher forcing with the full cache's greedy tokens: every method is scored on the same sequence.
    const StepLogits sl = step_logits(e, ids, 4, full.fed, runner.get());
    REQUIRE(sl.logits.size() == 5);
    CHECK(sl.fed == full.fed);
    for (const auto& row : sl.logits) {
      REQUIRE(row.size() == 64);
      for (float x : row) REQUIRE(std::isfinite(x));
    }
    // Prefill attends over the whole prompt: the first row changes only if the method transforms K/V.
    CHECK((sl.logits[0] == full.logits[0]) == (!runner || !runner->kv_transform()));
    // Decode reads the cache the method kept: the full cache's logits exactly when nothing was dropped.
    const bool same = std::equal(sl.logits.begin() + 1, sl.logits.end(), full.logits.begin() + 1);
    CHECK(same == (name == "fullkv"));
  }
  test::require_error([&] { choose_method("snapkv", {}, 0, e.config(), "--method"); }, {"--method", "needs a budget"});
  test::require_error([&] { choose_method("kvmix", method_test_params("kvmix"), 16, e.config(), "Model.logits"); },
                      {"Model.logits", "takes no budget"});
  test::require_error([&] { choose_method("", {}, 16, e.config(), "--method"); }, {"need a method"});
  test::require_error([&] { choose_method("snapkv", {}, -5, e.config(), "Model.generate"); },
                      {"Model.generate: budget -5", "must be > 0"});
}

TEST_CASE("every registered method decodes in a batch exactly as alone, in every weight format", "[methods][engine]") {
  const auto [type, weights, kv] =
      GENERATE(table<DType, WeightFormat, KvDtype>({{DType::F32, WeightFormat::F32, KvDtype::F32},
                                                    {DType::F32, WeightFormat::BF16, KvDtype::F16},
                                                    {DType::Q4_K, WeightFormat::GGUF, KvDtype::F16}}));
  INFO(weight_format_name(weights) << " weights");
  const test::TempDir dir("method_batch");
  ModelShape shape;
  shape.name = "tiny";
  shape.layers = 2;
  const bool kquant = type == DType::Q4_K;  // blocks of 256
  shape.hidden = kquant ? 256 : 64;
  shape.heads = 4;
  shape.kv_heads = 2;
  shape.ffn = kquant ? 512 : 96;  // not a multiple of the vectors' 64 bytes
  shape.vocab = 64;
  shape.context = 256;
  const std::string path = (dir / "tiny.gguf").string();
  write_random_model(path, shape, type, 29);
  auto model = ModelFile::open(path);
  Engine e(*model, {.kv_dtype = kv, .weights = weights});
  constexpr int kSteps = 3;

  const auto& reg = MethodRegistry::get();
  std::vector<std::string> names;
  for (const auto& name : reg.names())
    if (name != "kvzip") names.push_back(name);  // it needs a tokenizer the tiny model lacks
  // Found by an audit: a batch mixing one stored head per query head (gqa=repeat) with one per KV head
  // failed every cell of the batch.
  const size_t repeat_from = names.size();
  for (const char* name : {"snapkv", "h2o"}) names.push_back(name);
  // Prompts of different lengths, each method alone on its own prompt with its own fed tokens.
  auto prompt = [](size_t i) {
    std::vector<int32_t> ids(70 + 3 * i);
    for (size_t t = 0; t < ids.size(); ++t) ids[t] = int32_t((5 * t + 7 * i + 1) % 64);
    return ids;
  };
  auto fed = [](size_t i) { return std::vector<int32_t>{int32_t(i % 64), int32_t((3 * i + 1) % 64), 63}; };
  auto choose = [&](size_t i) {
    auto params = runnable_params(names[i], *model, dir.path());
    if (i >= repeat_from) params["gqa"] = "repeat";
    return choose_method(names[i], params, reg.info(names[i]).budgeted ? 40 : 0, e.config(), names[i]);
  };
  std::vector<StepLogits> alone;
  for (size_t i = 0; i < names.size(); ++i) {
    const auto c = choose(i);
    alone.push_back(step_logits(e, prompt(i), kSteps, fed(i), c.runner.get()));
  }

  std::vector<MethodChoice> methods;
  std::vector<Sequence> seqs;
  for (size_t i = 0; i < names.size(); ++i) {
    methods.push_back(choose(i));
    // What a record keys on: the files read, by name, each with its digest (Method::artifacts).
    if (methods.back().method) {
      const nlohmann::json a = methods.back().method->artifacts();
      INFO(names[i] << " artifacts " << a.dump());
      CHECK((a.is_null() || a.is_object()));
      if (a.is_object())
        for (const auto& [name, file] : a.items())
          CHECK((file.is_object() && file.contains("digest") && file["digest"].is_string()));
    }
    CHECK(e.prefill(prompt(i), methods.back().runner.get()) == alone[i].logits[0]);
    seqs.push_back(e.detach());
  }
  CHECK(e.position() == 0);
  // One batch of the methods that keep the model's weights, one per method that makes its own (Atom).
  std::map<std::string, std::vector<size_t>> by_weights;
  for (size_t i = 0; i < names.size(); ++i) {
    LinearTransform* t = methods[i].runner ? methods[i].runner->linear_transform() : nullptr;
    by_weights[t ? t->weights_key() : std::string()].push_back(i);
  }
  CHECK(by_weights.at("").size() > names.size() / 2);
  for (const auto& [key, members] : by_weights) {
    INFO("weights " << (key.empty() ? "of the model" : key));
    std::vector<Sequence*> batch;
    for (size_t i : members) batch.push_back(&seqs[i]);
    for (int step = 0; step < kSteps; ++step) {
      std::vector<int32_t> tokens;
      for (size_t i : members) tokens.push_back(fed(i)[size_t(step)]);
      const auto logits = e.decode_batch(batch, tokens);
      REQUIRE(logits.size() == members.size());
      for (size_t j = 0; j < members.size(); ++j) {
        const size_t i = members[j];
        INFO(names[i] << (i >= repeat_from ? " gqa=repeat" : "") << " step " << step);
        CHECK(logits[j] == alone[i].logits[size_t(step) + 1]);  // bit for bit
        CHECK(seqs[i].position() == int(prompt(i).size()) + step + 1);
      }
    }
  }
  std::vector<Sequence*> batch;
  for (auto& sq : seqs) batch.push_back(&sq);
  const int32_t two[2] = {1, 2};
  test::require_error([&] { e.decode_batch(std::span(batch).first(2), std::span(two).first(1)); },
                      {"2 sequences and 1 tokens"});
  Sequence* twice[2] = {batch[0], batch[0]};
  test::require_error([&] { e.decode_batch(twice, two); }, {"sequence 1 is in the batch twice"});
}

TEST_CASE("read_id_sequences: sequences used as given, bad files named with the sequence and position",
          "[calibration]") {
  const test::TempDir dir("ids");
  const auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream((dir / name).string()) << text;
    return (dir / name).string();
  };
  CHECK(read_id_sequences(write("a.json", "[[1, 2, 3], [4, 5]]"), 10) ==
        std::vector<std::vector<int32_t>>{{1, 2, 3}, {4, 5}});
  CHECK(read_id_sequences(write("b.json", R"({"seqlen": 2, "sequences": [[9, 0]]})"), 10) ==
        std::vector<std::vector<int32_t>>{{9, 0}});
  const auto bad = [&](const std::string& text, std::initializer_list<std::string> fragments) {
    const auto path = write("bad.json", text);
    test::require_error([&] { read_id_sequences(path, 10); }, fragments);
  };
  bad("[[1, 2], [3, 10]]", {"bad.json", "sequence 1 position 1", "10 is not a token id", "0 to 9"});
  bad("[[1, 2], [-1, 2]]", {"sequence 1 position 0", "-1"});
  bad("[[1, 2.5]]", {"sequence 0 position 1", "2.5"});
  bad("[[1]]", {"sequence 0", "at least 2 token ids"});
  bad("[]", {"bad.json", "non-empty array"});
  bad(R"({"ids": [[1, 2]]})", {"bad.json", "\"sequences\""});
  bad("[[1, 2]", {"bad.json"});
  test::require_error([&] { read_id_sequences((dir / "none.json").string(), 10); }, {"none.json", "cannot read"});
}

TEST_CASE("token_sequences: text shorter than asked is a warning naming what asked, and all of it is used",
          "[calibration]") {
  const auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  const auto tok = load_tokenizer(*model);
  const std::vector<std::string> docs = {"a b c d e f g h i j k l m n o p", "q r s t u v w x y z"};
  std::vector<std::vector<int32_t>> short_text;
  const std::string warning =
      test::captured_stderr([&] { short_text = token_sequences(*tok, docs, 8, 1000, "kvbench calibrate x: tokens"); });
  size_t total = 0;
  for (const auto& s : short_text) total += s.size();
  CHECK(short_text.size() >= 2);
  CHECK(warning.find("kvbench calibrate x: tokens asks for 1000 tokens; the text gives " + std::to_string(total)) !=
        std::string::npos);
  std::vector<std::vector<int32_t>> enough;
  CHECK(test::captured_stderr([&] { enough = token_sequences(*tok, docs, 8, 16, "y"); }).empty());
  REQUIRE(enough.size() == 2);
  CHECK(enough[0] == short_text[0]);
  CHECK(enough[1] == short_text[1]);
}

TEST_CASE("a training checkpoint resumes only the run with the same options, model, start and text", "[calibration]") {
  // Found by an audit: a checkpoint matched on the optimizer's options alone, so retraining after a new
  // basis, on another text or another model resumed the old weights and labelled them with the new inputs.
  const test::TempDir dir("ckpt");
  const std::string path = (dir / "w.json.ckpt").string();
  const std::vector<std::vector<int32_t>> text = {{1, 2, 3}, {4, 5}}, held = {{6, 7}};
  const nlohmann::json start = {{"U", "AAAA"}};
  auto options = [&](const std::string& fp, const nlohmann::json& initial, const auto& train) {
    nlohmann::json o = {{"steps", 4}, {"lr", 0.001}};
    o["inputs"] = training_inputs(fp, initial, train, held);
    return o;
  };
  const nlohmann::json ran = options("123-abc", start, text);
  CHECK(read_checkpoint(path, ran).is_null());  // none yet
  write_artifact(path, {{"options", ran}, {"weights", start}});
  CHECK(read_checkpoint(path, options("123-abc", start, text))["weights"] == start);
  test::require_error([&] { read_checkpoint(path, options("999-fff", start, text)); },
                      {"w.json.ckpt", "another training run (inputs.model differ)", "delete it"});
  test::require_error([&] { read_checkpoint(path, options("123-abc", {{"U", "AAAB"}}, text)); }, {"inputs.initial"});
  test::require_error(
      [&] {
        read_checkpoint(path, options("123-abc", start, std::vector<std::vector<int32_t>>{{1, 2}, {3, 4, 5}}));
      },
      {"inputs.train_tokens"});
  nlohmann::json more_steps = ran;
  more_steps["steps"] = 8;
  test::require_error([&] { read_checkpoint(path, more_steps); }, {"(steps differ)"});
  nlohmann::json before = ran;  // a checkpoint written before inputs were recorded
  before.erase("inputs");
  write_artifact(path, {{"options", before}, {"weights", start}});
  test::require_error([&] { read_checkpoint(path, ran); }, {"did not record a run's inputs", "delete it"});
}
