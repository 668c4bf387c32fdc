// Palu on the default model: its calibration writes the basis where the method looks, full rank is
// the model itself, and the cache holds the kept share of the dimensions.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>
#include <tuple>
#include <vector>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;

// The registry-wide tests' random models have layers of 32 K dimensions, which Palu's multiples of 32
// would keep whole.
const bool test_params_registered = test::register_method_test_params("palu", {{"rank_multiple", "8"}});

TEST_CASE("palu: calibrated basis, full rank is the model, the cache keeps the rank's share", "[palu][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path || !test::setup_data("python-docs")) return;
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine engine(*model);
  const test::TempDir dir("palu");
  const auto basis = (dir / "basis.json").string();

  // No basis yet: the error says how to make one.
  test::require_error(
      [&] {
        MethodRegistry::get().create("palu", {{"basis", basis}}, engine.config());
      },
      {"no such palu basis", "kvbench calibrate palu"});

  const OfflineStep step = MethodRegistry::get().offline_step("calibrate", "palu");
  Params options(step.options, {{"tokens", "4096"}, {"seq_len", "512"}}, "kvbench calibrate palu");
  CalibrationContext ctx{*model, *tok, engine, std::move(options), basis, default_data_dir(), false};
  step.run(ctx);

  const auto ids = build_prompt(*model, *tok, "The capital of France is Paris. The capital of Italy is", false);
  GenerateOptions opt;
  opt.max_new_tokens = 8;
  opt.stop_at_eog = false;
  const auto full = generate(engine, *tok, ids, opt);
  const size_t full_bytes = engine.full_kv_bytes(ids.size());
  // The default model's layers hold 192 dimensions (3 KV heads of 64): 40% is 76.8, which Palu's rank
  // search rounds to 64 (two multiples of 32) and the exact share to 77.
  const std::vector<std::tuple<std::string, std::string, double>> cases = {
      {"1.0", "32", 1.0}, {"0.5", "32", 0.5}, {"0.4", "32", 64.0 / 192}, {"0.4", "1", 77.0 / 192}};
  for (const auto& [rate, multiple, kept] : cases) {
    INFO("rank_ratio " << rate << ", rank_multiple " << multiple);
    auto m = MethodRegistry::get().create("palu", {{"basis", basis}, {"rank_ratio", rate}, {"rank_multiple", multiple}},
                                          engine.config());
    MethodRunner runner(*m, KvBudget{});
    const auto g = generate(engine, *tok, ids, opt, &runner);
    const double share = static_cast<double>(runner.prefill_kv_bytes()) / static_cast<double>(full_bytes);
    if (rate == "1.0") CHECK(g.tokens == full.tokens);  // the full basis projects nothing away
    CHECK(share == Approx(kept).margin(0.003));
    CHECK(m->artifacts()["pca"]["file"] == basis);
  }
  // Results recorded before the rounding (the share's nearest integer) keep their keys.
  auto exact = MethodRegistry::get().create("palu", {{"basis", basis}, {"rank_multiple", "1"}}, engine.config());
  CHECK(!exact->params().keyed_values().count("rank_multiple"));
  auto rounded = MethodRegistry::get().create("palu", {{"basis", basis}}, engine.config());
  CHECK(rounded->params().keyed_values().at("rank_multiple") == "32");
}

namespace {

// The largest |kvbench - reference| over a position's top 8 and sampled logits, and whether the top token
// agrees where the reference's top two are apart by more than the tolerance.
struct LogitGap {
  double max_abs = 0;
  bool top_agrees = true;
};
LogitGap logit_gap(const std::vector<float>& got, const nlohmann::json& ref, const std::vector<int>& sample_ids,
                   double tol) {
  LogitGap g;
  for (const auto& e : ref["top8"])
    g.max_abs = std::max(g.max_abs, std::abs(got.at(e[0].get<size_t>()) - e[1].get<double>()));
  for (size_t i = 0; i < sample_ids.size(); ++i)
    g.max_abs = std::max(g.max_abs, std::abs(got.at(size_t(sample_ids[i])) - ref["samples"][i].get<double>()));
  const auto top = std::max_element(got.begin(), got.end()) - got.begin();
  const bool clear = ref["top8"][0][1].get<double>() - ref["top8"][1][1].get<double>() > tol;
  g.top_agrees = !clear || top == ref["top8"][0][0].get<long>();
  return g;
}

}  // namespace

// methods/palu/reference.py: Palu's own pipeline (its calibration windows, the whitened SVD of k_proj
// and v_proj, its rank rounding) in float64 with transformers. kvbench calibrates on the same windows
// (--ids) and must give the reference's second-moment spectrum and, at rank 64, its logits over a prefill
// and 16 forced decode steps, far closer than Palu is to the unmodified model.
TEST_CASE("palu: matches Palu's whitened decomposition (reference.py, float64)", "[palu][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  std::ifstream in(test::source_path("methods/palu/fixtures/palu_r64_f64.json"));
  REQUIRE(in);
  const auto ref = nlohmann::json::parse(in);
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine engine(*model);
  const test::TempDir dir("palu_ref");
  const auto basis = (dir / "basis.json").string();
  const OfflineStep step = MethodRegistry::get().offline_step("calibrate", "palu");
  Params options(step.options, {{"ids", test::source_path(ref["settings"]["calib_ids"].get<std::string>())}},
                 "kvbench calibrate palu");
  CalibrationContext ctx{*model, *tok, engine, std::move(options), basis, default_data_dir(), false};
  step.run(ctx);

  std::ifstream bin(basis);
  const auto body = nlohmann::json::parse(bin);
  CHECK(body["header"]["calibration"]["tokens"] == ref["calibration_tokens"]);
  double worst_eigen = 0;
  for (const auto& [layer, kinds] : ref["eigenvalues"].items())
    for (const auto& [kind, values] : kinds.items()) {
      const auto& got = body["layers"][size_t(std::stoi(layer))][kind]["eigenvalues"];
      for (size_t i = 0; i < values.size(); ++i)
        worst_eigen = std::max(worst_eigen, std::abs(got[i].get<double>() / values[i].get<double>() - 1));
    }
  INFO("largest relative eigenvalue difference " << worst_eigen);
  CHECK(worst_eigen < 1e-5);

  const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  const std::vector<int> sample_ids = ref["sample_ids"].get<std::vector<int>>();
  const size_t prefill = ref["prefill"].get<size_t>();
  constexpr double kTol = 1e-3;
  double full_worst = 0;
  {
    std::vector<float> l = engine.prefill(std::span(ids).first(prefill));
    for (size_t p = 0; p < ref["full"].size(); ++p) {
      full_worst = std::max(full_worst, logit_gap(l, ref["full"][p], sample_ids, kTol).max_abs);
      if (prefill + p < ids.size()) l = engine.decode(ids[prefill + p]);
    }
  }
  INFO("unmodified model: largest logit difference " << full_worst);
  CHECK(full_worst < kTol);
  auto m = MethodRegistry::get().create("palu", {{"basis", basis}, {"rank_ratio", "0.4"}}, engine.config());
  MethodRunner runner(*m, KvBudget{});
  double worst = 0, palu_to_full = 0;
  std::vector<float> logits = engine.prefill(std::span(ids).first(prefill), &runner);
  for (size_t p = 0; p < ref["palu"].size(); ++p) {
    INFO("position " << prefill - 1 + p);
    const LogitGap g = logit_gap(logits, ref["palu"][p], sample_ids, kTol);
    CHECK(g.top_agrees);
    worst = std::max(worst, g.max_abs);
    palu_to_full = std::max(palu_to_full, logit_gap(logits, ref["full"][p], sample_ids, kTol).max_abs);
    if (prefill + p < ids.size()) logits = engine.decode(ids[prefill + p]);
  }
  INFO("largest logit difference to Palu " << worst << ", to the unmodified model " << palu_to_full);
  CHECK(worst < kTol);
  CHECK(palu_to_full > 1000 * kTol);  // the test tells Palu's projection from none
}
