#pragma once
// Decode throughput against batch size, one curve per cache configuration (the full cache, a method at
// a KV size): KVmix's Figure 8 for `kvbench bench --batch`.
#include <string>
#include <vector>

namespace kvb {

struct ThroughputPoint {
  int batch = 1;
  double tokens_per_s = 0;  // summed over the batch
};

struct ThroughputSeries {
  std::string label;
  std::vector<ThroughputPoint> points;
};

struct ThroughputPlot {
  std::string title;
  std::vector<ThroughputSeries> series;
};

// Writes <stem>.png, <stem>.svg and <stem>.csv (label, batch, tokens/s per point).
void write_throughput_plot(const ThroughputPlot& p, const std::string& stem);

}  // namespace kvb
