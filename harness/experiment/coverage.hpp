#pragma once
// Which printed cells of the papers' tables kvbench can regenerate: every row of each paper folder's
// published.csv (experiments/papers/<paper>/) is checked against the registries and the folder's
// specs. A row is regenerable when its method, parameters and task are kvbench's, its model's
// architecture is one the model loader runs, and the spec named by its table runs its configuration
// and column; otherwise each unmet condition is a blocker.
#include <map>
#include <string>
#include <vector>

namespace kvb {

struct TableCoverage {
  std::string paper, table;
  size_t cells = 0, regenerable = 0;
  std::map<std::string, size_t> blockers;  // blocker -> cells it holds (a row may have several)
  // Rows whose printed average differs from the mean of their printed cells by more than rounding:
  // "row: printed X, cells give Y".
  std::vector<std::string> average_mismatches;
};

// Per paper folder (sorted) and table (in the CSV's order).
std::vector<TableCoverage> paper_coverage(const std::string& papers_dir);
// The report: a Markdown table per paper, the totals, the blockers by cells, the averages that differ.
std::string coverage_markdown(const std::vector<TableCoverage>& tables);

}  // namespace kvb
