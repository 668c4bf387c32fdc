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
    const HeadScores s = pooled_window_scores(v, params(), gqa());
    return gather(v, gqa(), select_with_window(s, b.tokens - w, v.n_tokens, w));
  }
};

const bool registered = register_method({"snapkv", "observation-window attention with pooling, top-k per head",
                                         window_scorer_params(), [] { return std::make_unique<SnapKV>(); }});

}  // namespace
}  // namespace kvb
