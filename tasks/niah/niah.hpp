#pragma once
// Needle-in-a-Haystack's metric, for predictions made anywhere.
#include <string>

namespace kvb {

// Share of the needle's answer words in the prediction (the heatmap score of the benchmark's
// visualize.py), in [0, 1].
double niah_score(const std::string& prediction);

}  // namespace kvb
