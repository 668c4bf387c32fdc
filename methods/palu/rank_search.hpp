#pragma once
// Palu's rank search (palu/rank_search.py), as palu.cpp runs it: exposed for the tests.
#include <vector>

namespace kvb::palu {

// rounding_search_result: max(1, round(rank / multiple)) multiples (halves to even), at most dims.
int round_rank(double rank, int multiple, int dims);

// The Fisher searches' ranks before rounding: fisher_uniform's of the modules (k_proj and v_proj of
// layer 0, then of layer 1, ...) from their mean Fisher information, before the split into groups;
// fisher's of each module's `per_module` groups in turn, of `dims` dimensions each.
std::vector<int> fisher_ranks(const std::vector<double>& fisher, int dims, double ratio, int per_module = 1);

}  // namespace kvb::palu
