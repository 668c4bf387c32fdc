#include "harness/method/scorer.hpp"

#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"

namespace kvb {

std::optional<Selection> ScorerMethod::select(const PrefillView& view, const Budget& budget) {
  return select_top(score(view), view.n_kv_heads, gqa(), caps(view, budget), view.n_tokens, window());
}

void ScorerMethod::check_budget(int tokens) const {
  if (tokens < window())
    fail("a KV size of {} tokens leaves no room beyond the {}-token window; use a larger budget or window", tokens,
         window());
}

std::vector<int> ScorerMethod::caps(const PrefillView&, const Budget& budget) {
  return std::vector<int>(stored_heads(), budget.tokens - window());
}

}  // namespace kvb
