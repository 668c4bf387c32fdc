// PyramidKV (Cai et al. 2024): SnapKV's selection with per-layer budgets in an arithmetic progression,
// largest in the lowest layer, averaging T over the layers.
#include "harness/method/parts.hpp"

namespace kvb {
namespace {

class PyramidKV final : public Method {
 public:
  PrefillNeeds needs() const override { return {static_cast<int>(params().get_int("window")), false, false}; }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const int w = static_cast<int>(params().get_int("window"));
    const bool exact = params().get("schedule") == "exact";
    const auto caps = pyramid_budgets(b.tokens, w, static_cast<int>(params().get_int("beta")), v.n_tokens,
                                      model().n_layers, exact);
    const auto reduce = params().get("reduce") == "sum" ? WindowReduce::Sum : WindowReduce::Mean;
    HeadScores s = window_attention_scores(v, w, reduce);
    for (auto& h : s) h = pool1d(h, static_cast<int>(params().get_int("kernel")), parse_pooling(params().get("pooling")));
    s = reduce_for_gqa(s, v.n_kv_heads, gqa());
    return gather(v, gqa(), select_with_window(s, caps[v.layer] - w, v.n_tokens, w));
  }

  // The reference's floored schedule sums to a few percent over L x T; reported, not refused.
  bool may_exceed_budget() const override { return params().get("schedule") == "repro"; }
};

const bool registered = register_method(
    {"pyramidkv", "SnapKV selection with pyramidal per-layer budgets",
     {ParamSpec::integer("window", 32, 1, 4096, "observation window w (always kept)"),
      ParamSpec::integer("kernel", 7, 1, 63, "pooling kernel (odd)"),
      ParamSpec::choice("pooling", "max", {"max", "avg", "none"}, "1-D pooling of the scores"),
      ParamSpec::choice("reduce", "mean", {"mean", "sum"}, "reduction over the window queries"),
      ParamSpec::integer("beta", 20, 1, 1000, "ratio of the largest to the smallest layer budget scale"),
      ParamSpec::choice("schedule", "exact", {"exact", "repro"},
                        "exact: budgets sum to L x T; repro: the reference code's floored steps")},
     [] { return std::make_unique<PyramidKV>(); }});

}  // namespace
}  // namespace kvb
