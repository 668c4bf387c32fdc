// Palu on the default model: its calibration writes the basis where the method looks, full rank is
// the model itself, and the cache holds the kept share of the dimensions.
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
