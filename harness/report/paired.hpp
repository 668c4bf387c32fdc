#pragma once
// Paired comparisons: each method's score minus a baseline's on the same samples, with a paired
// bootstrap interval, so that a table says which differences the data supports.
#include <set>
#include <string>
#include <vector>

namespace kvb {

// `baseline` is METHOD or METHOD:key=value,... (the parameters that pick one of the method's recorded
// settings). Writes <dir>/<task>-vs-<baseline>.{md,csv,tex}: per method and KV size, the mean
// difference x 100 over the samples both ran, its 95% interval (percentile bootstrap of the mean
// difference, resampled within each RULER task or LongBench dataset; a sample scored several ways, as
// GSM8K's two metrics, is one unit) and `*` where Holm's adjusted p < 0.05. A FullKV baseline pairs
// with every KV size. Error listing the recorded methods when the baseline names none of them, and the
// settings when it names several; error naming the line of a record without an id.
void write_paired_comparison(const std::vector<std::string>& results, const std::string& baseline,
                             const std::string& dir, const std::set<std::string>& formats);
// The same errors as write_paired_comparison's about `baseline`, before anything is written.
void check_baseline(const std::vector<std::string>& results, const std::string& baseline);

}  // namespace kvb
