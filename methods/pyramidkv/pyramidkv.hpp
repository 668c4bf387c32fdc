#pragma once
// PyramidKV's per-layer budgets, public for its tests.
#include <vector>

namespace kvb {

// Arithmetic from bottom to top with ratio beta. `exact_total` rounds a float schedule and spreads the
// residue from layer 0 upwards (each layer within [0, S - w]) so the budgets sum to L x T; otherwise
// the floored integer schedule of the reference code (which can sum to a few percent more).
std::vector<int> pyramid_budgets(int T, int w, int beta, int S, int L, bool exact_total);

}  // namespace kvb
