// Kept token sets of SnapKV, PyramidKV and H2O on real prompts against an independent Python
// re-implementation on Hugging Face transformers (tools/reference/kv_selection.py).
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/engine/engine.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

// Runs several methods on the same prefill and records what each keeps per layer and stored head.
class Capture final : public PrefillObserver {
 public:
  std::vector<std::unique_ptr<Method>> methods;
  std::vector<std::vector<std::vector<std::vector<int32_t>>>> kept;  // [method][layer][head]

  PrefillNeeds needs() const override {
    PrefillNeeds n;
    for (const auto& m : methods) {
      n.window = std::max(n.window, m->needs().window);
      n.attn_colsum |= m->needs().attn_colsum;
    }
    return n;
  }
  void on_layer(const PrefillView& view, LayerCache&) override {
    kept.resize(methods.size());
    for (size_t i = 0; i < methods.size(); ++i) {
      MethodRunner runner(*methods[i], budget);
      LayerCache c(view.n_heads, view.n_kv_heads, view.head_dim);
      runner.on_layer(view, c);
      std::vector<std::vector<int32_t>> heads;
      for (int h = 0; h < c.n_cache_heads(); ++h) {
        std::vector<int32_t> p;
        for (const auto& s : c.segments(h)) p.insert(p.end(), s->positions().begin(), s->positions().end());
        heads.push_back(std::move(p));
      }
      kept[i].push_back(std::move(heads));
    }
  }
  int budget = 0;
};

}  // namespace

TEST_CASE("kept token sets match the Hugging Face reference re-implementation", "[methods][model][reference]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  std::ifstream in(test::fixture("methods/selection.json"));
  REQUIRE(in.good());
  const auto ref = nlohmann::json::parse(in);
  auto model = ModelFile::open(*path);
  Engine engine(*model);
  const std::string w = std::to_string(ref["window"].get<int>());
  const std::vector<std::pair<std::string, std::map<std::string, std::string>>> configs = {
      {"snapkv_repeat", {{"window", w}, {"reduce", "sum"}, {"gqa", "repeat"}}},
      {"snapkv_native", {{"window", w}, {"reduce", "sum"}, {"gqa", "native"}}},
      {"pyramidkv_repeat", {{"window", w}, {"reduce", "sum"}, {"gqa", "repeat"}, {"schedule", "repro"}}},
      {"h2o_repeat", {{"window", w}, {"gqa", "repeat"}}},
  };
  const char* method_of[] = {"snapkv", "snapkv", "pyramidkv", "h2o"};
  std::vector<size_t> same(configs.size(), 0), total(configs.size(), 0);
  std::vector<double> inter(configs.size(), 0), kept_ref(configs.size(), 0);
  for (const auto& p : ref["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    Capture cap;
    cap.budget = ref["budget"].get<int>();
    for (size_t i = 0; i < configs.size(); ++i)
      cap.methods.push_back(MethodRegistry::get().create(method_of[i], configs[i].second, engine.config()));
    engine.prefill(ids, &cap);
    for (size_t i = 0; i < configs.size(); ++i) {
      const auto& r = p["configs"][configs[i].first];
      for (size_t l = 0; l < cap.kept[i].size(); ++l)
        for (size_t h = 0; h < cap.kept[i][l].size(); ++h) {
          ++total[i];
          same[i] += test::positions_hash(cap.kept[i][l][h]) == r["hash"][l][h].get<std::string>();
        }
      for (const auto& [layer, heads] : r["full"].items())
        for (size_t h = 0; h < heads.size(); ++h) {
          const auto want = heads[h].get<std::vector<int32_t>>();
          const auto& got = cap.kept[i][std::stoul(layer)][h];
          std::vector<int32_t> both;
          std::set_intersection(got.begin(), got.end(), want.begin(), want.end(), std::back_inserter(both));
          inter[i] += static_cast<double>(both.size());
          kept_ref[i] += static_cast<double>(want.size());
        }
    }
  }
  for (size_t i = 0; i < configs.size(); ++i) {
    const double overlap = inter[i] / kept_ref[i];
    WARN(configs[i].first << ": identical sets on " << same[i] << "/" << total[i]
                          << " (layer, head) pairs; token overlap on the listed layers " << overlap);
    // Observed: every set identical except one H2O head where two scores tie within float rounding.
    CHECK(overlap >= 0.999);
    CHECK(static_cast<double>(same[i]) >= 0.99 * static_cast<double>(total[i]));
  }
}
