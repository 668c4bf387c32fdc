#pragma once
// Score against KV memory, one curve per method configuration: the axis on which quantization
// (KVmix), eviction and mixed-dimension methods meet. Memory is the prompt cache's bytes as a share of
// a full fp16 cache of the prompt (T_eq / prompt tokens), on a log scale.
#include <cmath>
#include <string>
#include <vector>

namespace kvb {

struct MemoryPoint {
  double memory = 0;  // share of the full fp16 cache, > 0
  double score = 0;   // in [0, 1]
  // The score's 95% interval, drawn as an error bar; NaN for none (a single sample).
  double low = std::nan(""), high = std::nan("");
  int n = 0;  // samples behind the point
};

struct MemorySeries {
  std::string label;
  std::vector<MemoryPoint> points;  // joined in order of memory
};

struct MemoryPlot {
  std::string title;
  std::vector<MemorySeries> series;
};

// Writes <stem>.png, <stem>.svg and <stem>.csv (label, memory, score, its interval and n per point).
void write_memory_plot(const MemoryPlot& p, const std::string& stem);

}  // namespace kvb
