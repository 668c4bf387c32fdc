// PyramidKV (Cai et al. 2024): SnapKV's selection with per-layer budgets in an arithmetic progression,
// largest in the lowest layer, averaging T over the layers.
#include "methods/pyramidkv/pyramidkv.hpp"

#include <algorithm>
#include <cmath>
#include <cstdlib>

#include "harness/method/parts.hpp"
#include "harness/method/scorer.hpp"
#include "harness/util/error.hpp"

namespace kvb {

std::vector<int> pyramid_budgets(int T, int w, int beta, int S, int L, bool exact_total) {
  if (T <= w) fail("PyramidKV: KV size {} must exceed the window {}", T, w);
  const int b = T - w;
  std::vector<int> caps(L);
  if (!exact_total && S < 2 * b) {  // the reference's short-prompt branch: uniform SnapKV budget
    std::fill(caps.begin(), caps.end(), b + w);
    return caps;
  }
  int min_num = b / beta, max_num = 2 * b - min_num;
  if (max_num >= S - w) {
    max_num = S - w;
    min_num = 2 * b - max_num;
  }
  if (!exact_total) {
    const int steps = L > 1 ? (max_num - min_num) / (L - 1) : 0;
    for (int l = 0; l < L; ++l) caps[l] = max_num - l * steps + w;
    return caps;
  }
  // Float schedule, rounded, clamped to what exists, residue spread from layer 0 upwards.
  const double steps = L > 1 ? static_cast<double>(max_num - min_num) / (L - 1) : 0.0;
  long total = 0;
  for (int l = 0; l < L; ++l) {
    caps[l] = std::clamp(static_cast<int>(std::lround(max_num - l * steps)), 0, S - w);
    total += caps[l];
  }
  long residue = long(L) * b - total;
  for (int l = 0; l < L && residue != 0; ++l) {
    const int room = residue > 0 ? (S - w) - caps[l] : caps[l];
    const int delta = static_cast<int>(std::min<long>(std::labs(residue), room));
    caps[l] += residue > 0 ? delta : -delta;
    residue += residue > 0 ? -delta : delta;
  }
  for (auto& c : caps) c += w;
  return caps;
}

namespace {

class PyramidKV final : public ScorerMethod {
 public:
  // The reference's floored schedule sums to a few percent over L x T; reported, not refused.
  bool may_exceed_budget() const override { return params().get("schedule") == "repro"; }
  void check_budget(int tokens) const override {
    if (tokens <= window()) fail("PyramidKV: KV size {} must exceed the window {}", tokens, window());
  }

 private:
  HeadScores score(const PrefillView& v) override { return pooled_window_scores(v, params()); }
  std::vector<int> caps(const PrefillView& v, const Budget& b) override {
    const int w = window();
    const auto layers = pyramid_budgets(b.tokens, w, params().integer("beta"), v.n_tokens, model().n_layers,
                                        params().get("schedule") == "exact");
    return std::vector<int>(stored_heads(), layers[v.layer] - w);
  }
};

std::vector<ParamSpec> pyramid_params() {
  auto p = window_scorer_params();
  p.push_back(ParamSpec::integer("beta", 20, 1, 1000, "ratio of the largest to the smallest layer budget scale"));
  p.push_back(ParamSpec::choice("schedule", "exact", {"exact", "repro"},
                                "exact: budgets sum to L x T; repro: the reference code's floored steps"));
  return p;
}

const bool registered = register_method({.name = "pyramidkv",
                                         .summary = "SnapKV selection with pyramidal per-layer budgets",
                                         .params = pyramid_params(),
                                         .make = [] { return std::make_unique<PyramidKV>(); },
                                         .composition = Composition::Selector});

}  // namespace
}  // namespace kvb
