#include "harness/method/head_scores.hpp"

#include <fmt/format.h>

#include <cmath>
#include <regex>

#include "harness/method/artifact.hpp"
#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"

namespace kvb {

HeadScoreKind parse_head_score_kind(const std::string& s) {
  if (s == "r2") return HeadScoreKind::RetrievalReasoning;
  if (s == "r") return HeadScoreKind::Retrieval;
  fail("head scores '{}' are not one of r2 (retrieval-reasoning), r (retrieval)", s);
}

std::string artifact_kind(HeadScoreKind k) { return k == HeadScoreKind::RetrievalReasoning ? "headkv_r2" : "headkv_r"; }

HeadImportance load_head_importance(HeadScoreKind kind, const std::string& path, const ModelConfig& m) {
  HeadImportance imp;
  const int L = m.n_layers, H = m.n_heads;
  if (path == "uniform") {
    imp.score.assign(L, std::vector<double>(H, 1.0));
    imp.source = "uniform";
    return imp;
  }
  const std::string make =
      fmt::format("kvbench calibrate headkv MODEL -o heads={}", kind == HeadScoreKind::RetrievalReasoning ? "r2" : "r");
  const LoadedArtifact a = load_artifact(artifact_kind(kind), path, m, make);
  imp.source = a.path;
  imp.digest = a.digest;
  imp.score.assign(L, std::vector<double>(H, std::nan("")));
  // Numbers as Python writes them: "00-0" would name head 0-0 a second time, the later one silently winning.
  static const std::regex key_re(R"((0|[1-9]\d{0,5})-(0|[1-9]\d{0,5}))");
  for (const auto& [key, value] : a.body.items()) {
    if (key == "header") continue;
    std::smatch mt;
    if (!std::regex_match(key, mt, key_re))
      fail("{}: key '{}' is not a 'layer-head' pair such as \"0-0\"", a.path, key);
    const int l = std::stoi(mt[1]), h = std::stoi(mt[2]);
    if (l >= L || h >= H)
      fail("{}: key '{}' is outside this model's {} layers x {} query heads (a score file for another model?)", a.path,
           key, L, H);
    // The repository's files hold one score per successful test; a single number is accepted too.
    std::vector<double> xs;
    if (value.is_array()) {
      for (const auto& x : value) {
        if (!x.is_number()) fail("{}: field '{}': expected numbers, found {}", a.path, key, x.dump());
        xs.push_back(x.get<double>());
      }
    } else if (value.is_number()) {
      xs.push_back(value.get<double>());
    } else {
      fail("{}: field '{}': expected a list of scores, found {}", a.path, key, value.dump());
    }
    if (xs.empty()) fail("{}: field '{}' is empty (no profiling test succeeded for it)", a.path, key);
    double sum = 0;
    for (double x : xs) {
      if (!std::isfinite(x) || x < 0) fail("{}: field '{}' holds {}, expected finite scores >= 0", a.path, key, x);
      sum += x;
    }
    imp.score[l][h] = sum / static_cast<double>(xs.size());
  }
  int missing = 0;
  std::string first;
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h)
      if (std::isnan(imp.score[l][h]) && missing++ == 0) first = fmt::format("{}-{}", l, h);
  if (missing)
    fail("{}: {} of the {} heads have no score (first missing: '{}'); expected keys \"0-0\" to \"{}-{}\"", a.path,
         missing, L * H, first, L - 1, H - 1);
  return imp;
}

std::vector<std::vector<double>> head_scores_for_gqa(const HeadImportance& imp, int n_kv_heads, GqaMode mode) {
  if (mode == GqaMode::Repeat) return imp.score;
  std::vector<std::vector<double>> out;
  for (const auto& layer : imp.score) {
    const size_t G = layer.size() / static_cast<size_t>(n_kv_heads);
    auto& row = out.emplace_back(n_kv_heads, 0.0);
    for (size_t h = 0; h < layer.size(); ++h) row[h / G] += layer[h];
  }
  return out;
}

std::vector<ParamSpec> head_budget_params() {
  return {ParamSpec::choice("heads", "r2", {"r2", "r"}, "head scores: retrieval-reasoning (r2) or retrieval (r)"),
          ParamSpec::text("scores", "", "head-score file (default: this model's artifact; 'uniform': all heads alike)"),
          ParamSpec::real("beta", 1.1, 1.0, 1000.0, "each head is guaranteed b - b//beta of b = T - w"),
          ParamSpec::real("temp", 1.0, 0.0, 100.0, "temperature on the normalised head scores"),
          ParamSpec::choice("caps", "exact", {"exact", "repro"},
                            "exact: capacities sum to L x heads x (T - w); repro: per-head torch.round as HeadKV")};
}

HeadImportance load_head_importance(const Params& p, const ModelConfig& model) {
  return load_head_importance(parse_head_score_kind(p.get("heads")), p.get("scores"), model);
}

std::vector<std::vector<int>> head_capacities(const HeadImportance& imp, const Params& p, int n_kv_heads, GqaMode mode,
                                              int T, int w) {
  return per_head_budgets(head_scores_for_gqa(imp, n_kv_heads, mode), T, w, p.get_float("beta"), p.get_float("temp"),
                          p.get("caps") == "exact" ? CapRounding::ExactTotal : CapRounding::Nearest);
}

}  // namespace kvb
