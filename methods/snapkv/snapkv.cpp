// SnapKV (Li et al. 2024): score prefix tokens by the attention the last w prompt tokens (the
// observation window) give them, smooth with 1-D pooling, keep the top T - w per head plus the window.
#include "harness/method/parts.hpp"
#include "harness/method/scorer.hpp"

namespace kvb {
namespace {

class SnapKV final : public ScorerMethod {
  HeadScores score(const PrefillView& v) override { return pooled_window_scores(v, params()); }
};

const bool registered = register_method({.name = "snapkv",
                                         .summary = "observation-window attention with pooling, top-k per head",
                                         .params = window_scorer_params(),
                                         .make = [] { return std::make_unique<SnapKV>(); },
                                         .composition = Composition::Selector});

}  // namespace
}  // namespace kvb
