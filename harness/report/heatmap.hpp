#pragma once
// Score heatmaps: Needle-in-a-Haystack grids drawn as the reference repositories draw them
// (KVCache-Factory scripts_needle/visualize.py: depth rows from 0 at the top, context-length columns, a fixed [0, 1]
// colour scale through #F0496E, #EBB839 and #0CD79F, grey cell borders, a colour bar), and the same
// style for method x budget summaries; written as PNG and SVG with cairo.
#include <string>
#include <vector>

namespace kvb {

struct Heatmap {
  std::string title;     // e.g. "Pressure Testing SmolLM2-135M-Instruct"
  std::string subtitle;  // a second title line (may be empty)
  std::string caption;   // e.g. "SnapKV Score: 85.80"
  std::string x_label = "Token Limit", y_label = "Depth Percent";
  std::vector<std::string> cols, rows;
  std::vector<std::vector<double>> cells;  // [row][col] in [0, 1], NaN where no result
  bool annotate = false;                   // print each cell's value (x 100)
  double cell_width = 28;
};

// Writes <stem>.png, <stem>.svg and <csv_stem>.csv (the cells, rows by columns; csv_stem defaults to
// stem, and differs where a table of the same stem has its own CSV).
void write_heatmap(const Heatmap& h, const std::string& stem, const std::string& csv_stem = {});

// The colour of a score in [0, 1], as 0-255 RGB.
struct Rgb {
  double r, g, b;
};
Rgb heatmap_colour(double score);

}  // namespace kvb
