#pragma once
// RULER's string-match scores, which the jsonl task and the Python module also offer.
#include <string>
#include <vector>

namespace kvb {

// RULER's per-sample score in [0, 1] after evaluate.py's post-processing of the prediction:
// string_match_all (share of references found, case-insensitive) or string_match_part (any found).
double ruler_string_match(const std::string& prediction, const std::vector<std::string>& references, bool part);

}  // namespace kvb
