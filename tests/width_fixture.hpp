#pragma once
// Compares a method's kept widths on real NIAH prompts of the default model with a golden fixture of
// an independent Python reference (methods/<name>/reference.py): per (prompt, layer, head), an
// FNV-1a hash of the widths the reference computed from tensors kvbench dumped.
#include <fmt/format.h>

#include <fstream>
#include <map>
#include <set>
#include <string>
#include <tuple>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/hash.hpp"
#include "test_util.hpp"

namespace kvb::test {

class WidthRecorder final : public PrefillObserver {
 public:
  WidthRecorder(MethodRunner& r, std::set<int> layers) : runner_(r), layers_(std::move(layers)) {}
  PrefillNeeds needs() const override { return runner_.needs(); }
  void on_layer(const PrefillView& v, LayerCache& cache) override {
    runner_.on_layer(v, cache);
    if (layers_.count(v.layer)) widths[v.layer] = stored_key_dims(cache, v.n_tokens);
  }
  std::map<int, std::vector<std::vector<int>>> widths;

 private:
  MethodRunner& runner_;
  std::set<int> layers_;
};

inline std::string widths_hash(const std::vector<int>& row) {
  std::string s;
  for (size_t i = 0; i < row.size(); ++i) s += (i ? "," : "") + std::to_string(row[i]);
  return fmt::format("{:016x}", fnv1a(s));
}

struct FixtureAgreement {
  size_t runs = 0, heads = 0, same = 0;
};

// Reruns the fixture's records for prompts up to `max_length` tokens (the longer ones stay out of CI's
// time; the script's own counts cover all). A record names its length, method, budget, layer and
// optionally its parameters; `extra` adds parameters (e.g. a score file). Returns zero runs when the
// model or the essays are absent (after the helpers' warnings).
inline FixtureAgreement width_fixture_agreement(
    const std::string& fixture_file, int max_length,
    const std::map<std::string, std::map<std::string, std::string>>& extra = {}) {
  FixtureAgreement out;
  auto path = model_file(kDefaultModel);
  if (!path || !setup_data("PaulGrahamEssays")) return out;
  const auto fx = nlohmann::json::parse(std::ifstream(source_path(fixture_file)));
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine engine(*model);
  std::map<std::tuple<int, std::string, int, std::string>, std::vector<nlohmann::json>> runs;
  for (const auto& r : fx["records"])
    if (r["length"].get<int>() <= max_length)
      runs[{r["length"], r["method"], r["budget"], r.value("params", nlohmann::json::object()).dump()}].push_back(r);
  for (const auto& [key, recs] : runs) {
    const auto& [length, method, budget, params_json] = key;
    TaskContext ctx;
    ctx.tokenizer = tok.get();
    ctx.data_dir = default_data_dir();
    ctx.options = {
        {"s_len", std::to_string(length)}, {"e_len", std::to_string(length)}, {"depths", "3"}, {"chat", "true"}};
    const Sample s = TaskRegistry::get().create("niah", ctx)->sample(1);
    const auto ids = build_prompt(*model, *tok, s.prompt, s.chat);
    auto params = nlohmann::json::parse(params_json).get<std::map<std::string, std::string>>();
    if (auto e = extra.find(method); e != extra.end()) params.insert(e->second.begin(), e->second.end());
    auto m = MethodRegistry::get().create(method, params, engine.config());
    MethodRunner runner(*m, budget);
    std::set<int> layers;
    for (const auto& r : recs) layers.insert(r["layer"].get<int>());
    WidthRecorder rec(runner, layers);
    engine.prefill(ids, &rec);
    ++out.runs;
    for (const auto& r : recs) {
      REQUIRE(r["n_tokens"].get<size_t>() == ids.size());
      const auto& got = rec.widths.at(r["layer"].get<int>());
      for (size_t h = 0; h < got.size(); ++h) {
        ++out.heads;
        out.same += widths_hash(got[h]) == r["heads"][h].get<std::string>();
      }
    }
  }
  return out;
}

}  // namespace kvb::test
