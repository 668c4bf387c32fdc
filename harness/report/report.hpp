#pragma once
// Reports from results files: a summary table per configuration (Markdown and CSV: score as the
// benchmarks report it, mean x 100, and the KV cache kept as a share of the full cache) and, for
// Needle-in-a-Haystack, one heatmap per configuration.
#include <string>
#include <vector>

namespace kvb {

// Writes <dir>/summary.md, <dir>/summary.csv and the NIAH heatmaps; prints the Markdown table.
void write_report(const std::vector<std::string>& results_files, const std::string& dir);

}  // namespace kvb
