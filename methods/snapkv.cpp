// SnapKV (Li et al. 2024): score prefix tokens by the attention the last w prompt tokens (the
// observation window) give them, smooth with 1-D pooling, keep the top T - w per head plus the window.
#include "harness/method/parts.hpp"

namespace kvb {
namespace {

class SnapKV final : public Method {
 public:
  PrefillNeeds needs() const override { return {static_cast<int>(params().get_int("window")), false, false}; }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const int w = static_cast<int>(params().get_int("window"));
    const auto reduce = params().get("reduce") == "sum" ? WindowReduce::Sum : WindowReduce::Mean;
    HeadScores s = window_attention_scores(v, w, reduce);
    for (auto& h : s) h = pool1d(h, static_cast<int>(params().get_int("kernel")), parse_pooling(params().get("pooling")));
    s = reduce_for_gqa(s, v.n_kv_heads, gqa());
    return gather(v, gqa(), select_with_window(s, b.tokens - w, v.n_tokens, w));
  }
};

const bool registered = register_method(
    {"snapkv", "observation-window attention with pooling, top-k per head",
     {ParamSpec::integer("window", 32, 1, 4096, "observation window w (last prompt tokens, always kept)"),
      ParamSpec::integer("kernel", 7, 1, 63, "pooling kernel (odd)"),
      ParamSpec::choice("pooling", "max", {"max", "avg", "none"}, "1-D pooling of the scores"),
      ParamSpec::choice("reduce", "mean", {"mean", "sum"}, "reduction over the window queries")},
     [] { return std::make_unique<SnapKV>(); }});

}  // namespace
}  // namespace kvb
