// KVCrush (README.md §8) and method composition: a wrapper over every selector, its
// parameters through the registry and YAML, and the fingerprint/grouping parts against references.
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "harness/experiment/experiment.hpp"
#include "harness/method/compose.hpp"
#include "harness/method/parts.hpp"
#include "methods/kvcrush/fingerprints.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"
#include "width_fixture.hpp"

using namespace kvb;
using kvb::test::kept_positions;
using kvb::test::SyntheticLayer;

namespace {

std::vector<std::vector<int32_t>> run(const std::string& name, const std::map<std::string, std::string>& params,
                                      SyntheticLayer& L, int T, int layer = 0) {
  auto m = MethodRegistry::get().create(name, params, L.cfg);
  MethodRunner runner(*m, T);
  L.view.layer = layer;
  LayerCache c(L.view.n_heads, 1, L.view.head_dim);
  runner.on_layer(L.view, c);
  return kept_positions(c);
}

const std::vector<std::map<std::string, std::string>> kBases = {
    {{"base", "snapkv"}, {"base.window", "8"}},
    {{"base", "pyramidkv"}, {"base.window", "8"}},
    {{"base", "h2o"}, {"base.window", "8"}},
    {{"base", "headkv"}, {"base.window", "8"}, {"base.scores", "uniform"}},
};

std::map<std::string, std::string> with(std::map<std::string, std::string> a,
                                        const std::map<std::string, std::string>& b) {
  for (const auto& [k, v] : b) a[k] = v;
  return a;
}

}  // namespace

TEST_CASE("kvcrush: ratio 0 reproduces every base exactly, both GQA modes", "[kvcrush]") {
  for (const auto& base : kBases)
    for (const char* gqa : {"native", "repeat"}) {
      SyntheticLayer L(400, 6, 2, 16, 32, 5);
      INFO(base.at("base") << " " << gqa);
      std::map<std::string, std::string> bp{{"gqa", gqa}};
      for (const auto& [k, v] : base)
        if (k != "base") bp[k.substr(5)] = v;
      for (int layer : {0, 3})
        CHECK(run("kvcrush", with(base, {{"ratio", "0"}, {"gqa", gqa}}), L, 64, layer) ==
              run(base.at("base"), bp, L, 64, layer));
    }
}

TEST_CASE("kvcrush: budget split, base part, representatives outside it, window kept", "[kvcrush]") {
  for (const char* gqa : {"native", "repeat"})
    for (const char* anchor : {"alternate", "mean", "random", "zeros", "ones", "inv_mean"})
      for (const char* group : {"sorted_stride", "floor_stride", "bucket_centroid"}) {
        SyntheticLayer L(500, 6, 2, 16, 32, 9);
        INFO(gqa << " " << anchor << " " << group);
        const int T = 100, w = 8, reps = 25;  // round(0.25 x 100)
        const auto got =
            run("kvcrush", {{"gqa", gqa}, {"anchor", anchor}, {"group", group}, {"base.window", "8"}}, L, T);
        // The base part is SnapKV at T - reps, head by head.
        const auto base = run("snapkv", {{"gqa", gqa}, {"window", "8"}}, L, T - reps);
        REQUIRE(got.size() == base.size());
        for (size_t h = 0; h < got.size(); ++h) {
          CHECK(got[h].size() == size_t(T));
          std::set<int32_t> g(got[h].begin(), got[h].end());
          for (int32_t p : base[h]) CHECK(g.count(p));
          for (int j = 500 - w; j < 500; ++j) CHECK(g.count(j));
        }
      }
}

TEST_CASE("kvcrush: every layer's representatives are recorded", "[kvcrush]") {
  SyntheticLayer L(300, 6, 2, 16, 32, 2);
  auto m = MethodRegistry::get().create("kvcrush", {{"base", "snapkv"}, {"ratio", "0.5"}}, L.cfg);
  MethodRunner runner(*m, 80);
  for (int layer = 0; layer < L.cfg.n_layers; ++layer) {
    L.view.layer = layer;
    LayerCache c(6, 2, 16);
    runner.on_layer(L.view, c);
  }
  const auto prof = runner.cache_profile();
  REQUIRE(prof["layers"].size() == size_t(L.cfg.n_layers));
  for (const auto& layer : prof["layers"]) CHECK(layer["representatives"].get<long>() > 0);
}

TEST_CASE("kvcrush: parameters resolve with the base's, bad compositions are clear errors", "[kvcrush]") {
  const auto& reg = MethodRegistry::get();
  SyntheticLayer L(100, 6, 2, 16, 32, 1);
  const Params p = reg.resolve("kvcrush", {{"base", "pyramidkv"}, {"base.beta", "5"}});
  CHECK(p.get("base.beta") == "5");
  CHECK(p.get("base.window") == "32");  // the base's defaults are part of the key
  CHECK(p.get("base.schedule") == "exact");
  CHECK_FALSE(p.values().count("base.gqa"));
  test::require_error(
      [&] {
        reg.create("kvcrush", {{"base", "fullkv"}}, L.cfg);
      },
      {"kvcrush", "base 'fullkv' cannot be wrapped", "snapkv"});
  test::require_error([&] { reg.create("kvcrush", {{"base", "kvcrush"}}, L.cfg); }, {"'kvcrush' cannot be wrapped"});
  test::require_error([&] { reg.create("kvcrush", {{"base", "nosuch"}}, L.cfg); }, {"'nosuch' cannot be wrapped"});
  test::require_error(
      [&] {
        reg.create("kvcrush", {{"base.windw", "8"}}, L.cfg);
      },
      {"unknown parameter 'base.windw'", "base.window"});
  test::require_error([&] { reg.create("kvcrush", {{"base.gqa", "repeat"}}, L.cfg); }, {"'base.gqa'"});
  test::require_error([&] { reg.create("kvcrush", {{"ratio", "1.5"}}, L.cfg); }, {"'ratio'", "1.5"});
  test::require_error(
      [&] {
        reg.create("kvcrush", {{"base", "h2o"}, {"base.decode_eviction", "true"}}, L.cfg);
      },
      {"base h2o also evicts during decoding"});
  // The wrapper's GQA mode is the base's.
  CHECK(run("kvcrush", {{"gqa", "repeat"}}, L, 50).size() == 6);
}

TEST_CASE("kvcrush: YAML base_params and dotted keys, conflicts refused", "[kvcrush]") {
  const std::string model = "model: " + test::source_path("methods/kvcrush/test_kvcrush.cpp") + "\n";
  const test::TempDir dir("kvcrush_specs");
  auto write = [&](const std::string& name, const std::string& text) {
    const auto p = (dir / name).string();
    std::ofstream(p) << text;
    return p;
  };
  const auto s = load_experiment(write("kvb_crush.yaml", model + R"(task: niah
methods:
  - {name: kvcrush, params: {ratio: 0.5}, base_params: {window: 8}}
  - {name: kvcrush, params: {base: h2o, base.window: 4}}
budgets: [64]
)"));
  REQUIRE(s.configs.size() == 2);
  CHECK(s.configs[0].params.at("base.window") == "8");
  CHECK(s.configs[1].params.at("base.window") == "4");
  test::require_error(
      [&] {
        load_experiment(
            write("kvb_crush2.yaml", model + "task: niah\nmethods:\n  - {name: kvcrush, params: {base.window: 4}, "
                                             "base_params: {window: 8}}\nbudgets: [64]\n"));
      },
      {"kvb_crush2.yaml", "also given as base.window"});
  test::require_error(
      [&] {
        load_experiment(
            write("kvb_crush3.yaml", model + "task: niah\nmethods:\n  - {name: kvcrush, base_params: {windw: 8}}\n"
                                             "budgets: [64]\n"));
      },
      {"kvb_crush3.yaml", "'base.windw'"});
}

TEST_CASE("fingerprints: each head marks its top share plus ties, Hamming equals the bit loop", "[kvcrush]") {
  std::mt19937 rng(3);
  std::uniform_real_distribution<float> u(0, 1);
  HeadScores s(70, std::vector<float>(101));
  for (auto& h : s)
    for (auto& x : h) x = u(rng);
  s[5].assign(101, 0.5f);  // all tied: every token marked
  const auto prints = fingerprints(s, 101, share_counts(static_cast<int>(s.size()), 101, 0.5));
  for (int h = 0; h < 70; ++h) {
    int ones = 0;
    for (const auto& b : prints) ones += test_bit(b, h);
    CHECK(ones == (h == 5 ? 101 : 51));  // ceil(0.5 x 101)
  }
  for (size_t i = 0; i + 1 < prints.size(); ++i)
    CHECK(hamming(prints[i], prints[i + 1]) == hamming_ref(prints[i], prints[i + 1]));
}

TEST_CASE("threshold=budget: each head marks what its budget keeps, and the run keeps T per head", "[kvcrush]") {
  HeadScores s(3, std::vector<float>(40));
  for (int h = 0; h < 3; ++h)
    for (int j = 0; j < 40; ++j) s[size_t(h)][size_t(j)] = float((j * (h + 3)) % 41);  // distinct: 41 is prime
  const auto prints = fingerprints(s, 40, {3, 10, 60});                                // the last clamped to E
  for (int h = 0; h < 3; ++h) {
    int ones = 0;
    for (const auto& b : prints) ones += test_bit(b, h);
    CHECK(ones == std::vector<int>{3, 10, 40}[size_t(h)]);
  }
  for (const char* gqa : {"native", "repeat"})
    for (const char* base : {"snapkv", "pyramidkv"}) {
      INFO(base << " gqa " << gqa);
      test::SyntheticLayer L(300, 6, 2, 16, 32, 9);
      auto m = MethodRegistry::get().create(
          "kvcrush", {{"base", base}, {"gqa", gqa}, {"threshold", "budget"}, {"group", "bucket_centroid"}}, L.cfg);
      auto share = MethodRegistry::get().create("kvcrush", {{"base", base}, {"gqa", gqa}}, L.cfg);
      MethodRunner r(*m, 96), rs(*share, 96);
      LayerCache c(6, gqa == std::string("repeat") ? 6 : 2, 16), cs(6, gqa == std::string("repeat") ? 6 : 2, 16);
      r.on_layer(L.view, c);
      rs.on_layer(L.view, cs);
      const auto kept = test::kept_positions(c), kept_share = test::kept_positions(cs);
      for (size_t h = 0; h < kept.size(); ++h) CHECK(kept[h].size() == kept_share[h].size());
      CHECK(kept != kept_share);  // another threshold and other picks choose other representatives
    }
}

TEST_CASE("anchors and picks: alternate fixed, mean order-free, random seeded, stride ends, equal prints by position",
          "[kvcrush]") {
  std::mt19937 rng(4);
  std::vector<Bits> prints(200, Bits(1, 0));
  for (auto& b : prints) b[0] = rng() & 0x1FF;  // 9 heads
  std::vector<int32_t> cand(150);
  std::iota(cand.begin(), cand.end(), 20);
  auto reversed = cand;
  std::reverse(reversed.begin(), reversed.end());
  CHECK(anchor_fingerprint("alternate", prints, cand, 9, 0, 0, 0) == Bits{0b010101010});
  CHECK(anchor_fingerprint("alternate", {}, {}, 9, 0, 0, 0) == Bits{0b010101010});
  CHECK(anchor_fingerprint("mean", prints, cand, 9, 0, 0, 0) ==
        anchor_fingerprint("mean", prints, reversed, 9, 0, 0, 0));
  CHECK(anchor_fingerprint("inv_mean", prints, cand, 9, 0, 0, 0)[0] ==
        (~anchor_fingerprint("mean", prints, cand, 9, 0, 0, 0)[0] & 0x1FF));
  CHECK(anchor_fingerprint("random", prints, cand, 9, 42, 3, 1) ==
        anchor_fingerprint("random", prints, cand, 9, 42, 3, 1));
  std::set<uint64_t> seen;
  for (int layer = 0; layer < 8; ++layer) seen.insert(anchor_fingerprint("random", prints, cand, 9, 42, layer, 0)[0]);
  CHECK(seen.size() > 4);

  const Bits a = anchor_fingerprint("alternate", prints, cand, 9, 0, 0, 0);
  const auto order = order_by_distance(prints, cand, a);
  for (size_t i = 1; i < order.size(); ++i) {
    const int d0 = hamming(prints[size_t(order[i - 1])], a), d1 = hamming(prints[size_t(order[i])], a);
    CHECK((d0 < d1 || (d0 == d1 && order[i - 1] < order[i])));
  }
  const auto picks = pick_representatives("sorted_stride", prints, order, 10);
  CHECK(std::set<int32_t>(picks.begin(), picks.end()).size() == 10);
  CHECK(picks.front() == order.front());
  CHECK(picks.back() == order.back());
  // OpenVINO's stride starts at the nearest and steps floor(C / n).
  const auto ov = pick_representatives("floor_stride", prints, order, 10);
  for (int i = 0; i < 10; ++i) CHECK(ov[size_t(i)] == order[size_t(i * 15)]);
  // All fingerprints equal: the order is by position and the picks are evenly spaced positions.
  std::vector<Bits> same(200, Bits{7});
  const auto even = pick_representatives("sorted_stride", same, order_by_distance(same, cand, a), 4);
  CHECK(even == std::vector<int32_t>{20, 70, 119, 169});  // ranks round(i x 149 / 3): 0, 50, 99, 149
  // Fewer candidates than picks: all of them.
  CHECK(pick_representatives("bucket_centroid", prints, {3, 4}, 5) == std::vector<int32_t>{3, 4});
  const auto buckets = pick_representatives("bucket_centroid", prints, order, 7);
  CHECK(std::set<int32_t>(buckets.begin(), buckets.end()).size() == 7);
}

TEST_CASE("kvcrush over snapkv: kept sets equal the independent Python reference on real prompts", "[kvcrush][model]") {
  // methods/kvcrush/reference.py recomputed SnapKV's scores, the split, fingerprints, anchors
  // and picks from the tensors kvbench dumped for NIAH prompts of 1K-8K tokens; the prompts up to 2K
  // are rerun here.
  const auto r = test::width_fixture_agreement("methods/kvcrush/fixtures/reference.json", 2000);
  if (r.runs == 0) return;
  CHECK(r.runs == 12);
  INFO(r.same << " of " << r.heads << " (prompt, layer, KV head) kept sets equal the reference");
  CHECK(r.same == r.heads);
}
