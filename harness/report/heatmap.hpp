#pragma once
// Needle-in-a-Haystack heatmaps drawn as the reference repositories draw them (spec/benchmarks.md
// 3.6): depth rows from 0 at the top, context-length columns, a fixed [0, 1] colour scale through
// #F0496E, #EBB839 and #0CD79F, grey cell borders, a colour bar; written as PNG and SVG with cairo.
#include <string>
#include <vector>

namespace kvb {

struct Heatmap {
  std::string title;     // e.g. "Pressure Testing SmolLM2-135M-Instruct"
  std::string caption;   // e.g. "SnapKV Score: 85.80"
  std::vector<int> lengths, depths;
  std::vector<std::vector<double>> cells;  // [depth][length], NaN where no result
};

// Writes <stem>.png, <stem>.svg and <stem>.csv (rows = depths, columns = lengths).
void write_heatmap(const Heatmap& h, const std::string& stem);

// The colour of a score in [0, 1], as 0-255 RGB.
struct Rgb {
  double r, g, b;
};
Rgb heatmap_colour(double score);

}  // namespace kvb
