#pragma once
// Comparisons with a method's reference fixture (methods/<name>/reference.py): logits at the reference's
// positions, a prefill and forced decode steps through a method, and a method's offline step run into a file.
#include <algorithm>
#include <cmath>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness/engine/engine.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/params.hpp"
#include "test_util.hpp"

namespace kvb::test {

// The largest |kvbench - reference| over a position's top 8 and sampled logits, and whether the top token
// agrees where the reference's top two are apart by more than the tolerance.
struct LogitGap {
  double max_abs = 0;
  bool top_agrees = true;
};
inline LogitGap logit_gap(const std::vector<float>& got, const nlohmann::json& ref, const std::vector<int>& sample_ids,
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

struct ForcedGaps {
  double to_method = 0, to_full = 0;
};
// The reference's ids as a prefill of its `prefill` ids and forced decode steps, through `m` (nullptr:
// the unmodified model); the largest logit gaps to the reference's positions under `key` (the method's
// setting) and to its unmodified ones.
inline ForcedGaps forced_gaps(Engine& engine, Method* m, const nlohmann::json& ref, const std::string& key, double tol,
                              bool check_top = true) {
  const std::vector<int32_t> ids = ref["ids"].get<std::vector<int32_t>>();
  const std::vector<int> sample_ids = ref["sample_ids"].get<std::vector<int>>();
  const size_t prefill = ref["prefill"].get<size_t>();
  std::optional<MethodRunner> runner;
  if (m) runner.emplace(*m, KvBudget{});
  ForcedGaps out;
  std::vector<float> logits = engine.prefill(std::span(ids).first(prefill), runner ? &*runner : nullptr);
  for (size_t p = 0; p < ref["full"].size(); ++p) {
    INFO("position " << prefill - 1 + p);
    const LogitGap full = logit_gap(logits, ref["full"][p], sample_ids, tol);
    out.to_full = std::max(out.to_full, full.max_abs);
    if (m) {
      const LogitGap g = logit_gap(logits, ref[key][p], sample_ids, tol);
      if (check_top) CHECK(g.top_agrees);
      out.to_method = std::max(out.to_method, g.max_abs);
    }
    if (prefill + p < ids.size()) logits = engine.decode(ids[prefill + p]);
  }
  return out;
}

// Runs the offline step `name` with `options` into `out`; returns the artifact's JSON.
inline nlohmann::json calibrate(const std::string& name, Engine& engine, const ModelFile& model, const Tokenizer& tok,
                                const std::map<std::string, std::string>& options, const std::string& out) {
  const OfflineStep step = MethodRegistry::get().offline_step("calibrate", name);
  CalibrationContext ctx{
      model, tok, engine, Params(step.options, options, "kvbench calibrate " + name), out, default_data_dir(), false};
  step.run(ctx);
  std::ifstream in(out);
  return nlohmann::json::parse(in);
}

}  // namespace kvb::test
