// PyramidKV (Cai et al. 2024): SnapKV's selection with per-layer budgets in an arithmetic progression,
// largest in the lowest layer, averaging T over the layers.
#include "harness/method/parts.hpp"

namespace kvb {
namespace {

class PyramidKV final : public Method {
 public:
  PrefillNeeds needs() const override { return {static_cast<int>(params().get_int("window")), false, false}; }

  std::optional<Selection> select(const PrefillView& v, const Budget& b) override {
    const int w = static_cast<int>(params().get_int("window"));
    const auto caps = pyramid_budgets(b.tokens, w, static_cast<int>(params().get_int("beta")), v.n_tokens,
                                      model().n_layers, params().get("schedule") == "exact");
    return select_top(pooled_window_scores(v, params()), v.n_kv_heads, gqa(),
                      std::vector<int>(stored_heads(), caps[v.layer] - w), v.n_tokens, w);
  }

  // The reference's floored schedule sums to a few percent over L x T; reported, not refused.
  bool may_exceed_budget() const override { return params().get("schedule") == "repro"; }
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
