// Palu on the default model: its calibration writes the basis where the method looks, full rank is
// the model itself, and the cache holds the kept share of the dimensions.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>
#include <span>
#include <tuple>
#include <vector>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "methods/palu/rank_search.hpp"
#include "reference_logits.hpp"
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
  // Palu's step runs DynaKV's PCA step; the errors of that step name the command the user typed.
  Params both(step.options, {{"text", basis}, {"ids", basis}}, "kvbench calibrate palu");
  CalibrationContext twice{*model, *tok, engine, std::move(both), (dir / "b.json").string(), default_data_dir(), false};
  test::require_error([&] { step.run(twice); }, {"kvbench calibrate palu: give --text or -o ids=FILE, not both"});

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
  // The parameters added since keep the keys of results recorded before them.
  std::set<std::string> keys;
  for (const auto& [k, v] : exact->params().keyed_values()) keys.insert(k);
  CHECK(keys == std::set<std::string>{"basis", "gqa", "rank_ratio"});
  auto rounded = MethodRegistry::get().create("palu", {{"basis", basis}}, engine.config());
  CHECK(rounded->params().keyed_values().at("rank_multiple") == "32");
}

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
  const auto body =
      test::calibrate("palu", engine, *model, *tok,
                      {{"ids", test::source_path(ref["settings"]["calib_ids"].get<std::string>())}}, basis);
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

  constexpr double kTol = 1e-3;
  const double full_worst = test::forced_gaps(engine, nullptr, ref, "palu", kTol).to_full;
  INFO("unmodified model: largest logit difference " << full_worst);
  CHECK(full_worst < kTol);
  auto m = MethodRegistry::get().create("palu", {{"basis", basis}, {"rank_ratio", "0.4"}}, engine.config());
  const test::ForcedGaps g = test::forced_gaps(engine, m.get(), ref, "palu", kTol);
  INFO("largest logit difference to Palu " << g.to_method << ", to the unmodified model " << g.to_full);
  CHECK(g.to_method < kTol);
  CHECK(g.to_full > 1000 * kTol);  // the test tells Palu's projection from none

  // reference.py --quant: Palu's latent quantizer on the same factors (rank 64: 3 bits asymmetric with
  // and without the Hadamard rotation, 4 bits symmetric in groups of 32, rotated; rank 96, whose
  // rotation takes Palu's order-12 factor: 3 bits, rotated). Layer 0's values, where
  // both sides quantize nearly exact inputs, must agree value for value. Deeper, a rounding boundary
  // crossed by float32's error moves a value by a whole step (a float64 latent perturbed by 1e-6
  // moves Palu's own logits by up to 0.8), so the logits must only be nearer the setting's own than
  // any other setting's, unquantized included.
  std::ifstream qin(test::source_path("methods/palu/fixtures/palu_quant_f64.json"));
  REQUIRE(qin);
  nlohmann::json quant = nlohmann::json::parse(qin);
  REQUIRE(quant["ids"] == ref["ids"]);
  quant["unquantized"] = ref["palu"];
  for (const auto& setting : quant["quantized"]) quant[setting["name"].get<std::string>()] = setting["logits"];
  for (const auto& setting : quant["quantized"]) {
    const std::string name = setting["name"];
    INFO(name);
    auto q = MethodRegistry::get().create("palu",
                                          {{"basis", basis},
                                           {"rank_ratio", setting["rank_ratio"].dump()},
                                           {"latent_bits", setting["bits"].dump()},
                                           {"latent_group_size", setting["group_size"].dump()},
                                           {"latent_sym", setting["sym"].dump()},
                                           {"latent_hadamard", setting["hadamard"].dump()}},
                                          engine.config());
    // Layer 0's values of the first tokens, read back through the cache (a one-hot weight per token):
    // there both sides quantize nearly exact inputs, so every value must agree.
    const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
    MethodRunner runner(*q, KvBudget{});
    engine.prefill(std::span(ids).first(ref["prefill"].get<size_t>()), &runner);
    const LayerCache& layer0 = engine.caches()[0];
    const auto want = setting["layer0_values"].get<std::vector<std::vector<double>>>();
    const size_t n = layer0.segments(0)[0]->size();
    double worst_value = 0;
    for (size_t t = 0; t < want.size(); ++t) {
      std::vector<float> p(n, 0.0f);
      p[t] = 1.0f;
      for (int h = 0; h < 3; ++h) {
        std::vector<float> v(64, 0.0f);
        layer0.segments(h)[0]->accumulate(p.data(), v.data());
        for (size_t c = 0; c < 64; ++c)
          worst_value = std::max(worst_value, std::abs(v[c] - want[t][size_t(h) * 64 + c]));
      }
    }
    INFO("layer 0: largest value difference " << worst_value);
    CHECK(worst_value < 1e-5);
    const double own = test::forced_gaps(engine, q.get(), quant, name, kTol, false).to_method;
    INFO("largest logit difference to Palu's quantized " << own);
    for (const auto& other : quant["quantized"])
      if (other["name"] != name) {
        INFO("to " << other["name"]);
        CHECK(own < test::forced_gaps(engine, q.get(), quant, other["name"], kTol, false).to_method);
      }
    CHECK(own < test::forced_gaps(engine, q.get(), quant, "unquantized", kTol, false).to_method);
  }
}

// methods/palu/reference.py --fisher: Palu's Fisher information (its loss predicting two tokens ahead),
// its fisher_uniform rank search and G-LRD with every KV head apart, in float64. The rank search on the
// reference's Fisher values must give its ranks exactly; kvbench's own Fisher values (fp32 gradients)
// must be close to the reference's and give the same ranks; the grouped basis must have the groups'
// spectra; and Palu's per-layer, per-head projection must give the reference's logits.
TEST_CASE("palu: Fisher rank search and grouped heads match Palu's (reference.py --fisher)", "[palu][model]") {
  std::ifstream in(test::source_path("methods/palu/fixtures/palu_fisher_g1_f64.json"));
  REQUIRE(in);
  const auto ref = nlohmann::json::parse(in);
  const int H = 3, d = 192;
  auto group_ranks = [](const std::vector<int>& module, int groups) {
    std::vector<std::vector<int>> out;
    for (int r : module) out.emplace_back(size_t(groups), palu::round_rank(r / groups, 32, d / groups));
    return out;
  };
  const auto fisher_ref = ref["fisher_modules"].get<std::vector<double>>();
  for (const auto& [key, a] : ref["allocations"].items()) {
    INFO(key);
    const auto module = palu::fisher_ranks(fisher_ref, d, a["rank_ratio"].get<double>());
    CHECK(module == a["module_ranks"].get<std::vector<int>>());
    CHECK(group_ranks(module, H / a["group_size"].get<int>()) == a["group_ranks"].get<std::vector<std::vector<int>>>());
  }
  // The fisher search: the same loop over each group's Fisher information, each group's rank rounded.
  auto rounded = [](const std::vector<int>& flat, int groups) {
    std::vector<std::vector<int>> out;
    for (size_t i = 0; i < flat.size(); i += size_t(groups)) {
      out.emplace_back();
      for (int g = 0; g < groups; ++g) out.back().push_back(palu::round_rank(flat[i + size_t(g)], 32, d / groups));
    }
    return out;
  };
  for (const auto& [key, a] : ref["allocations_fisher"].items()) {
    INFO("fisher " << key);
    const int groups = H / a["group_size"].get<int>();
    const auto means = ref["fisher_group_means"][a["group_size"].dump()].get<std::vector<double>>();
    CHECK(rounded(palu::fisher_ranks(means, d / groups, a["rank_ratio"].get<double>(), groups), groups) ==
          a["group_ranks"].get<std::vector<std::vector<int>>>());
  }
  // The loop's float test: a target that is not whole gives every module one more in its first pass.
  CHECK(palu::fisher_ranks({1.0, 1.0, 2.0}, 10, 0.55) == std::vector<int>{5, 5, 9});
  CHECK(palu::fisher_ranks({1.0, 3.0}, 10, 0.5) == std::vector<int>{3, 7});
  CHECK(palu::fisher_ranks({1.0, 1.0}, 4, 1.0) == std::vector<int>{4, 4});

  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine engine(*model);
  const test::TempDir dir("palu_fisher");
  // Fisher on the reference's first windows.
  std::ifstream cin(test::source_path(ref["settings"]["calib_ids"].get<std::string>()));
  auto windows = nlohmann::json::parse(cin)["sequences"];
  windows.erase(windows.begin() + ref["settings"]["fisher_windows"].get<long>(), windows.end());
  const auto ids_file = (dir / "fisher_ids.json").string();
  std::ofstream(ids_file) << windows.dump();
  const auto fisher_file = (dir / "fisher.json").string();
  const auto fisher = test::calibrate("palu-fisher", engine, *model, *tok, {{"ids", ids_file}}, fisher_file);
  double worst = 0;
  std::vector<double> modules;
  for (size_t l = 0; l < ref["fisher_heads"].size(); ++l)
    for (const char* kind : {"K", "V"}) {
      double mean = 0;
      for (int h = 0; h < H; ++h) {
        const double got = fisher["layers"][l][kind][size_t(h)].get<double>();
        worst = std::max(worst, std::abs(got / ref["fisher_heads"][l][kind][size_t(h)].get<double>() - 1));
        mean += got / H;
      }
      modules.push_back(mean);
    }
  INFO("largest relative Fisher difference " << worst);
  CHECK(worst < 2e-3);
  CHECK(group_ranks(palu::fisher_ranks(modules, d, 0.5), H) == ref["group_ranks"].get<std::vector<std::vector<int>>>());
  std::vector<double> heads;  // one head per group: the fisher search's groups
  for (size_t l = 0; l < ref["fisher_heads"].size(); ++l)
    for (const char* kind : {"K", "V"})
      for (int h = 0; h < H; ++h) heads.push_back(fisher["layers"][l][kind][size_t(h)].get<double>());
  CHECK(rounded(palu::fisher_ranks(heads, d / H, 0.5, H), H) ==
        ref["group_ranks_fisher"].get<std::vector<std::vector<int>>>());

  // G-LRD, one head per group: each group's moment solved apart, the basis interleaving the groups.
  const auto basis_file = (dir / "basis_g1.json").string();
  const auto basis = test::calibrate(
      "palu", engine, *model, *tok,
      {{"ids", test::source_path(ref["settings"]["calib_ids"].get<std::string>())}, {"group_size", "1"}}, basis_file);
  CHECK(basis["header"]["calibration"]["group_size"] == 1);
  double worst_eigen = 0;
  for (const auto& [layer, kinds] : ref["group_eigenvalues"].items())
    for (const auto& [kind, groups] : kinds.items()) {
      const auto& got = basis["layers"][size_t(std::stoi(layer))][kind]["eigenvalues"];
      for (size_t g = 0; g < groups.size(); ++g)
        for (size_t i = 0; i < groups[g].size(); ++i)
          worst_eigen = std::max(worst_eigen, std::abs(got[i * H + g].get<double>() / groups[g][i].get<double>() - 1));
    }
  INFO("largest relative group eigenvalue difference " << worst_eigen);
  CHECK(worst_eigen < 1e-5);

  // A grouped basis serves Palu only; fisher= without Fisher ranks is a mistake.
  test::require_error(
      [&] {
        MethodRegistry::get().create("dynakv", {{"fixed_rate", "0.5"}, {"pca", basis_file}}, engine.config());
      },
      {"basis_g1.json", "serves palu's fixed_ranks only"});
  test::require_error(
      [&] {
        MethodRegistry::get().create("palu", {{"basis", basis_file}, {"group_size", "1"}, {"fisher", fisher_file}},
                                     engine.config());
      },
      {"fisher= is read by the Fisher rank searches only"});
  // A basis of other groups is refused, naming the calibration that fits.
  test::require_error(
      [&] {
        MethodRegistry::get().create("palu", {{"basis", basis_file}}, engine.config());
      },
      {"method palu (group_size 3, basis", "groups of 1 KV heads", "-o group_size=0"});
  constexpr double kTol = 1e-3;
  for (const auto& [allocation, key] : {std::pair{"fisher_uniform", "palu"}, std::pair{"fisher", "palu_fisher"}}) {
    INFO(allocation);
    auto m = MethodRegistry::get().create("palu",
                                          {{"basis", basis_file},
                                           {"fisher", fisher_file},
                                           {"group_size", "1"},
                                           {"allocation", allocation},
                                           {"rank_ratio", ref["settings"]["rank_ratio"].dump()}},
                                          engine.config());
    const test::ForcedGaps g = test::forced_gaps(engine, m.get(), ref, key, kTol);
    INFO("largest logit difference to Palu " << g.to_method << ", to the unmodified model " << g.to_full);
    CHECK(g.to_method < kTol);
    CHECK(g.to_full > 1000 * kTol);
    CHECK(m->artifacts()["fisher"]["file"] == fisher_file);
  }
  // Quantized on the grouped basis, each head's latent (of its own rank) takes its own scale and zero
  // point: per token and module, the groups' codes and 32 bits per group.
  auto q = MethodRegistry::get().create("palu",
                                        {{"basis", basis_file},
                                         {"fisher", fisher_file},
                                         {"group_size", "1"},
                                         {"allocation", "fisher"},
                                         {"latent_bits", "3"},
                                         {"rank_ratio", ref["settings"]["rank_ratio"].dump()}},
                                        engine.config());
  MethodRunner runner(*q, KvBudget{});
  const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  engine.prefill(ids, &runner);
  const auto ranks = ref["group_ranks_fisher"].get<std::vector<std::vector<int>>>();
  size_t want = 0;
  for (size_t l = 0; l < ranks.size() / 2; ++l) {
    size_t bits = 0;
    for (size_t z = 0; z < 2; ++z)
      for (int r : ranks[2 * l + z]) bits += size_t(r) * 3 + 32;
    want += (ids.size() * bits + 7) / 8 + 4 * ids.size();
  }
  CHECK(runner.prefill_kv_bytes() == want);
}
