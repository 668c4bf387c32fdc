#pragma once
// Palu's rank search (palu/rank_search.py), as palu.cpp runs it: exposed for the tests.
#include <vector>

namespace kvb::palu {

// rounding_search_result: max(1, round(rank / multiple)) multiples (halves to even), at most dims.
int round_rank(double rank, int multiple, int dims);

// fisher_uniform's ranks of the modules (k_proj and v_proj of layer 0, then of layer 1, ...) from
// their mean Fisher information, before the split into groups and the rounding.
std::vector<int> fisher_ranks(const std::vector<double>& fisher, int dims, double ratio);

}  // namespace kvb::palu
