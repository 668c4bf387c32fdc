// SnapKV (Li et al. 2024): score prefix tokens by the attention the last w prompt tokens (the
// observation window) give them, smooth with 1-D pooling, keep the top T - w per head plus the window.
#include "harness/method/parts.hpp"

namespace kvb {
namespace {

class SnapKV final : public Method {
 public:
  PrefillNeeds needs() const override { return {static_cast<int>(params().get_int("window")), false, false}; }

  std::optional<Selection> select(const PrefillView& v, const Budget& b) override {
    const int w = static_cast<int>(params().get_int("window"));
    return select_top(pooled_window_scores(v, params()), v.n_kv_heads, gqa(),
                      std::vector<int>(stored_heads(), b.tokens - w), v.n_tokens, w);
  }
};

const bool registered = register_method({.name = "snapkv",
                                         .summary = "observation-window attention with pooling, top-k per head",
                                         .params = window_scorer_params(),
                                         .make = [] { return std::make_unique<SnapKV>(); },
                                         .composition = Composition::Selector});

}  // namespace
}  // namespace kvb
