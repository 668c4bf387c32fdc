// HeadKV: the capacities and their reduction to SnapKV (README.md §3), the profiling probe (§7), the
// score-file loader's errors, and the needle prompts on the default model's tokenizer.
#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "harness/method/artifact.hpp"
#include "harness/method/head_scores.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "methods/headkv/profile_prompts.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"

using namespace kvb;

// The registry tests run HeadKV on synthetic layers, which have no profile: every head scores alike.
const bool test_params_registered = test::register_method_test_params("headkv", {{"scores", "uniform"}});
using kvb::test::kept_positions;
using kvb::test::SyntheticLayer;

namespace {

std::vector<std::vector<double>> random_scores(int L, int H, uint32_t seed) {
  std::mt19937 rng(seed);
  std::exponential_distribution<double> e(3.0);
  std::vector<std::vector<double>> s(L, std::vector<double>(H));
  for (auto& l : s)
    for (auto& x : l) x = e(rng);
  s[1][2] = 0;  // released files have heads that never scored
  return s;
}

std::string write_temp(const test::TempDir& dir, const std::string& name, const std::string& text) {
  const auto p = dir / name;
  std::ofstream(p) << text;
  return p.string();
}

ModelConfig shape(int L, int H, int Hkv) {
  ModelConfig c;
  c.n_layers = L;
  c.n_heads = H;
  c.n_kv_heads = Hkv;
  c.head_dim = 16;
  c.fingerprint = "123-abc";
  return c;
}

}  // namespace

TEST_CASE("headkv: capacities sum to L x H x (T - w) up to rounding, never below the guarantee", "[headkv]") {
  const auto s = random_scores(32, 32, 4);
  for (double beta : {1.005, 1.01, 1.1, 1.2, 1.5, 2.0}) {
    for (int T : {64, 128, 1024}) {
      INFO("beta " << beta << " T " << T);
      const int b = T - 8;
      const auto near = per_head_budgets(s, T, 8, beta, 1.0, CapRounding::Nearest);
      const auto exact = per_head_budgets(s, T, 8, beta, 1.0, CapRounding::ExactTotal);
      long sn = 0, se = 0;
      for (int l = 0; l < 32; ++l)
        for (int h = 0; h < 32; ++h) {
          sn += near[l][h];
          se += exact[l][h];
          REQUIRE(near[l][h] >= b - int(std::floor(b / beta)));
          REQUIRE(std::abs(exact[l][h] - near[l][h]) <= 1);
        }
      CHECK(std::labs(sn - 32L * 32 * b) <= 32 * 32 / 2);
      CHECK(se == 32L * 32 * b);
    }
  }
  // torch.round is half to even: raw capacities 16.5 and 27.5 give 16 and 28.
  CHECK(per_head_budgets({{1, 3}}, 30, 8, 2.0, 1.0, CapRounding::Nearest) == std::vector<std::vector<int>>{{16, 28}});
  CHECK(per_head_budgets({{1, 1}}, 30, 8, 1.0, 1.0) == std::vector<std::vector<int>>{{22, 22}});
}

TEST_CASE("headkv: uniform scores reduce to SnapKV with mean reduction, sum and mean pick the same", "[headkv]") {
  SyntheticLayer L(300, 6, 2, 16, 8, 31);
  auto& reg = MethodRegistry::get();
  for (const char* gqa : {"native", "repeat"})
    for (int T : {40, 96}) {
      auto hk = reg.create("headkv", {{"scores", "uniform"}, {"gqa", gqa}}, L.cfg);
      auto hs = reg.create("headkv", {{"scores", "uniform"}, {"gqa", gqa}, {"reduce", "sum"}}, L.cfg);
      auto sn = reg.create("snapkv", {{"window", "8"}, {"reduce", "mean"}, {"gqa", gqa}}, L.cfg);
      MethodRunner a(*hk, T), b(*sn, T), c(*hs, T);
      LayerCache ca(6, 2, 16), cb(6, 2, 16), cc(6, 2, 16);
      a.on_layer(L.view, ca);
      b.on_layer(L.view, cb);
      c.on_layer(L.view, cc);
      CHECK(kept_positions(ca) == kept_positions(cb));
      CHECK(kept_positions(ca) == kept_positions(cc));
    }
}

TEST_CASE("headkv: ragged per-head caches follow the capacities, bytes within budget", "[headkv]") {
  SyntheticLayer L(500, 6, 2, 16, 8, 37);
  L.cfg.n_layers = 3;
  L.cfg.fingerprint = "synthetic";
  // A score file in the reference layout (no header): one layer's heads far apart.
  std::string text = "{";
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < 6; ++h) text += fmt::format("{}\"{}-{}\": [{}, {}]", l + h ? ", " : "", l, h, 0.1 + h * h, 0.2);
  text += "}";
  const test::TempDir dir("headkv_scores");
  const std::string path = write_temp(dir, "kvbench_headkv_scores.json", text);
  auto& reg = MethodRegistry::get();
  auto m = reg.create("headkv", {{"scores", path}, {"gqa", "repeat"}}, L.cfg);
  // Every head's kept count, layer by layer.
  auto head_sizes = [&](MethodRunner& runner) {
    std::vector<size_t> out;
    for (int l = 0; l < 3; ++l) {
      L.view.layer = l;
      LayerCache c(6, 6, 16);
      runner.on_layer(L.view, c);
      for (int h = 0; h < 6; ++h) out.push_back(c.tokens(h));
    }
    return out;
  };
  MethodRunner r(*m, 64);
  const std::vector<size_t> sizes = head_sizes(r);
  const auto imp = load_head_importance(HeadScoreKind::RetrievalReasoning, path, L.cfg);
  const auto caps = per_head_budgets(imp.score, 64, 8, 1.1, 1.0, CapRounding::ExactTotal);
  for (int l = 0; l < 3; ++l)
    for (int h = 0; h < 6; ++h) CHECK(sizes[l * 6 + h] == size_t(caps[l][h] + 8));
  CHECK(r.prefill_kv_bytes() == 3 * r.budget().bytes_per_layer);
  const auto prof = r.cache_profile();
  CHECK(prof["tokens_per_head"]["max"].get<size_t>() > prof["tokens_per_head"]["min"].get<size_t>());
  // A prompt of exactly T tokens is compressed as the authors' code does (their heads' budgets are
  // uneven, some under T); one token more of budget keeps it whole. Found by an independent check.
  auto distinct = [&](int budget) {
    MethodRunner at(*m, budget);
    const std::vector<size_t> s = head_sizes(at);
    return std::set<size_t>(s.begin(), s.end());
  };
  CHECK(distinct(500).size() > 1);
  CHECK(*distinct(500).begin() < 500);
  CHECK(distinct(501) == std::set<size_t>{500});
  // Native mode sums the group's query-head scores.
  const auto g = head_scores_for_gqa(imp, 2, GqaMode::Native);
  CHECK(g[0][0] == Approx(imp.score[0][0] + imp.score[0][1] + imp.score[0][2]));
}

TEST_CASE("headkv: the profiling probe scores attention on the answer span", "[headkv]") {
  // One KV head read by two query heads; keys 10..14 are the span. Query head 0 attends uniformly to
  // the span, query head 1 to position 3 only.
  const int d = 16, N = 20;
  LayerCache cache(2, 1, d);
  auto seg = std::make_unique<DenseSegment>(d);
  std::vector<float> zero(d, 0.0f);
  for (int t = 0; t < N; ++t) {
    std::vector<float> k(d, 0.0f);
    if (t >= 10 && t < 15) k[0] = 100.0f;
    if (t == 3) k[1] = 100.0f;
    seg->append(k.data(), zero.data(), t);
  }
  cache.segments(0).push_back(std::move(seg));
  std::vector<float> q(size_t(2) * d, 0.0f);
  q[0] = 4.0f;      // head 0: e^100 on each span key
  q[d + 1] = 4.0f;  // head 1
  RetrievalProbe probe(1, 2, 10, 15, ProbeRule::AttentionMass);
  probe.on_decode(0, cache, q.data(), N);
  CHECK(probe.score[0][0] == Approx(1.0 / 5));
  CHECK(probe.score[0][1] == Approx(0.0).margin(1e-12));
  probe.on_decode(0, cache, q.data(), N);
  CHECK(probe.score[0][0] == Approx(2.0 / 5));

  // The copy rule (HeadKV-R): head 0's top-1 is the first span key (ties to the lowest position),
  // position 10, which holds token 7; a step scores 1/5 only when it generates that token.
  std::vector<int32_t> prompt(N, 1);
  prompt[10] = 7;
  RetrievalProbe copy(1, 2, 10, 15, ProbeRule::Copy, prompt);
  copy.on_decode(0, cache, q.data(), N);
  copy.generated(7);
  CHECK(copy.score[0][0] == Approx(1.0 / 5));
  CHECK(copy.score[0][1] == 0.0);  // its top-1, position 3, is outside the span
  copy.on_decode(0, cache, q.data(), N);
  copy.generated(8);  // not a copy
  CHECK(copy.score[0][0] == Approx(1.0 / 5));
  // No span found: nothing scores.
  RetrievalProbe none(1, 2, -1, -1, ProbeRule::Copy, prompt);
  none.on_decode(0, cache, q.data(), N);
  none.generated(7);
  CHECK(none.score[0][0] == 0.0);
}

TEST_CASE("headkv: score files and artifacts: clear errors", "[headkv]") {
  const ModelConfig m = shape(2, 2, 1);
  const test::TempDir dir("headkv_errors");
  auto load = [&](const std::string& text) {
    return load_head_importance(HeadScoreKind::RetrievalReasoning, write_temp(dir, "kvbench_bad_scores.json", text), m);
  };
  CHECK(load(R"({"0-0": [1, 3], "0-1": [0], "1-0": 2, "1-1": [0.5]})").score ==
        std::vector<std::vector<double>>{{2, 0}, {2, 0.5}});
  test::require_error([&] { load(R"({"0-0": [1], "0-1": [1], "1-0": [1]})"); },
                      {"kvbench_bad_scores.json", "1 of the 4 heads", "'1-1'"});
  test::require_error([&] { load(R"({"0-0": [1], "0-1": [1], "1-0": [1], "1-1": [1], "2-0": [1]})"); },
                      {"'2-0'", "2 layers x 2 query heads"});
  test::require_error([&] { load(R"({"0-0": [NaN], "0-1": [1], "1-0": [1], "1-1": [1]})"); },
                      {"kvbench_bad_scores.json", "holds NaN", "finite"});
  test::require_error([&] { load(R"({"0-0": [-1], "0-1": [1], "1-0": [1], "1-1": [1]})"); }, {"'0-0'", "-1"});
  test::require_error([&] { load(R"({"0-0": [], "0-1": [1], "1-0": [1], "1-1": [1]})"); }, {"'0-0' is empty"});
  test::require_error([&] { load(R"({"a-b": [1]})"); }, {"'a-b'", "layer-head"});
  // Found by an audit: "00-0" named head 0-0 again (the later key won) and "99999999999-0" aborted.
  test::require_error([&] { load(R"({"0-0": [1], "00-0": [5], "0-1": [1], "1-0": [1], "1-1": [1]})"); },
                      {"'00-0'", "layer-head"});
  test::require_error([&] { load(R"({"99999999999-0": [1]})"); }, {"'99999999999-0'", "layer-head"});
  // A header whose fingerprint is no string is an error, not an abort.
  test::require_error([&] { load(R"({"header": {"kind": "headkv_r2", "model": {"fingerprint": 5}}})"); },
                      {"kvbench_bad_scores.json", "'model.fingerprint' (a string)"});
  // Artifacts carry the model's fingerprint; another model's is refused, a missing one names the command.
  nlohmann::json body = {{"header", artifact_header("headkv_r2", shape(2, 2, 1), "other.gguf")}};
  body["header"]["model"]["fingerprint"] = "999-fff";
  for (auto k : {"0-0", "0-1", "1-0", "1-1"}) body[k] = {1.0};
  const std::string other = (dir / "kvbench_other.json").string();
  write_artifact(other, body);
  // Found by an audit: a directory as the path, or a path under a file, aborted after the whole calibration.
  test::require_error([&] { check_artifact_destination(dir.path().string()); }, {"is a directory"});
  test::require_error([&] { write_artifact(other + "/sub/x.json", body); }, {"kvbench_other.json is a file"});
  test::require_error([&] { load_head_importance(HeadScoreKind::RetrievalReasoning, other, m); },
                      {"kvbench_other.json", "999-fff", "123-abc", "kvbench calibrate headkv"});
  // An empty artifacts directory: nothing another test or run left there can answer the lookup.
  const test::TempDir artifacts("headkv_artifacts");
  setenv("KVBENCH_ARTIFACTS", artifacts.path().c_str(), 1);
  test::require_error([&] { MethodRegistry::get().create("headkv", {}, m); },
                      {"no headkv_r2 artifact", "123-abc", "kvbench calibrate headkv MODEL -o heads=r2"});
  unsetenv("KVBENCH_ARTIFACTS");
}

TEST_CASE("headkv: needle prompts and the answer span on the default model's tokenizer", "[headkv][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  const NeedlePrompts np(*tok);
  const Needle n = builtin_reasoning_needles()[0];
  std::string hay;
  for (int i = 0; i < 400; ++i) hay += "The quick brown fox jumps over the lazy dog. ";
  const std::string ctx = np.trimmed(hay, 1000);
  CHECK(tok->encode_prompt(ctx).size() == 1000);
  for (int depth : {0, 44, 100}) {
    const auto ids = tok->encode_prompt(np.prompt_text(ctx, n, 1000, depth));
    const auto [s, e] = np.span(ids, n.real_needle);
    const auto want = tok->encode(n.real_needle);
    REQUIRE(e - s == int(want.size()));
    CHECK(tok->decode(std::span(ids).subspan(size_t(s), size_t(e - s))) == n.real_needle);
    CHECK(int(ids.size()) <= 1000 - 200 + 40);
  }
}

TEST_CASE("headkv: retrieval needles, the first-window span rule and the needle file layouts", "[headkv][model]") {
  // The reference's retrieval needle file has no answer field; the reasoning one needs it.
  const test::TempDir dir("headkv_needles");
  const std::string plain = write_temp(dir, "kvbench_needles_r.jsonl",
                                       R"({"needle": "A b c.", "question": "What?", "real_needle": "b c."})"
                                       "\n");
  CHECK(load_needles(plain, false).size() == 1);
  test::require_error([&] { load_needles(plain, true); }, {"kvbench_needles_r.jsonl:1", "'answer'"});
  for (const Needle& n : builtin_retrieval_needles()) CHECK(n.needle.find(n.real_needle) != std::string::npos);

  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  const NeedlePrompts np(*tok);
  std::string hay;
  for (int i = 0; i < 400; ++i) hay += "The quick brown fox jumps over the lazy dog. ";
  const std::string ctx = np.trimmed(hay, 1000);
  for (const Needle& n : builtin_retrieval_needles()) {
    const auto ids = tok->encode_prompt(np.prompt_text(ctx, n, 1000, 50));
    const auto [s, e] = np.first_span(ids, n.real_needle, 0.9);
    REQUIRE(s >= 0);
    CHECK(e - s == int(tok->encode(n.real_needle).size()));
    // The first window over 90% starts at most one token before the answer text (its leading space
    // may tokenize apart) and covers it.
    const std::string got = tok->decode(std::span(ids).subspan(size_t(s), size_t(e - s)));
    CHECK(got.find(n.real_needle.substr(0, n.real_needle.size() - 1)) != std::string::npos);
  }
  CHECK(np.first_span(tok->encode_prompt("nothing here at all"), builtin_retrieval_needles()[0].real_needle, 0.9) ==
        std::pair{-1, -1});
}
