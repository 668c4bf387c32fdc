// Palu on the default model: its calibration writes the basis where the method looks, full rank is
// the model itself, and the cache holds the kept share of the dimensions.
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;

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
  for (const char* rate : {"1.0", "0.5"}) {
    INFO("rank_ratio " << rate);
    auto m = MethodRegistry::get().create("palu", {{"basis", basis}, {"rank_ratio", rate}}, engine.config());
    MethodRunner runner(*m, KvBudget{});
    const auto g = generate(engine, *tok, ids, opt, &runner);
    const double share = static_cast<double>(runner.prefill_kv_bytes()) / static_cast<double>(full_bytes);
    if (std::string(rate) == "1.0") {
      CHECK(g.tokens == full.tokens);  // the full basis projects nothing away
      CHECK(share == Approx(1.0).margin(0.01));
    } else {
      CHECK(share == Approx(0.5).margin(0.01));
    }
    CHECK(m->artifacts()["pca"]["file"] == basis);
  }
}
