#pragma once
// Confidence intervals for the scores in the tables: a cell's mean over its samples with a 95%
// interval, so that a reader can tell a difference between methods from sampling noise.
#include <cmath>
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvb {

struct MeanInterval {
  double mean = 0;
  int n = 0;
  // NaN when the samples cannot give one (fewer than 2): a table then shows n and no interval.
  double low = 0, high = 0;
  // The bootstrap's two-sided p-value for a mean of 0 (the smallest 1 - level whose percentile interval
  // reaches 0, from the same resamples, with the +1 of a Monte Carlo p-value); NaN without resamples.
  double p_zero = std::nan("");
  const char* method = "none";  // "wilson", "bootstrap", "none"
  bool has_interval() const { return method[0] != 'n'; }
};

inline constexpr double kZ95 = 1.959963984540054;  // the standard normal's 97.5% quantile

// Wilson's score interval for a proportion of `successes` in n (z = 1.96 for 95%).
MeanInterval wilson_interval(double successes, int n, double z = kZ95);
// What a cell's score averages: every sample alike (the summary table), or the strata's means alike
// (a table's Avg. over RULER tasks or LongBench datasets).
enum class Average { Samples, Strata };

// The percentile bootstrap of the mean: each stratum (a RULER task, a LongBench dataset) is resampled
// within itself, `resamples` times, from a fixed seed; a single stratum is the plain bootstrap over
// samples. [low, high] are the (1-level)/2 and (1+level)/2 quantiles (numpy's linear interpolation);
// none where no stratum varies (or for no resamples).
MeanInterval percentile_bootstrap(const std::vector<std::vector<double>>& strata, Average average = Average::Samples,
                                  double level = 0.95, int resamples = 10000, uint64_t seed = 20261127);
// One score of a table's cell: the sample it was scored on (its record's id) and its variant (a RULER
// task, a LongBench dataset, a GSM8K metric).
struct SampleScore {
  std::string variant, id;
  double score = 0;
};
// A cell's scores as the bootstrap's strata. A sample scored under several variants (GSM8K's strict and
// flexible metrics of one generation: the same report::sample_unit) is one unit, the mean of its scores,
// as its scores are not independent; units stratify by the variants they were scored under (a RULER
// task, a LongBench dataset). A score without an id is a unit of its own.
std::vector<std::vector<double>> sample_strata(const std::vector<SampleScore>& scores);
// Whether any stratum holds two different values (beyond rounding) (else every resample gives the mean).
bool any_spread(const std::vector<std::vector<double>>& strata);
// The floors below which the bootstrap's 95% covers far less than 95%: fewer samples in all, or a
// stratum of fewer where the cell averages the strata's means, give no interval.
inline constexpr size_t kMinSamples = 10, kMinStratum = 5;
// A table's bootstrap interval: percentile_bootstrap's, none below the floors; averaging samples,
// strata smaller than kMinStratum are resampled as one (a design that ignores them: wider).
MeanInterval bootstrap_interval(const std::vector<std::vector<double>>& strata, Average average = Average::Samples);
// A cell's interval: Wilson's when the scores are 0/1 (NIAH's exact match, RULER's single-needle
// tasks) and pooled over samples, otherwise the stratified bootstrap; none (n shown alone) for one
// sample, where every stratum holds one value and the bootstrap has nothing to resample, or where it
// has too few samples (bootstrap_interval).
MeanInterval score_interval(const std::vector<std::vector<double>>& strata, Average average = Average::Samples);

// Holm's step-down adjustment of m p-values (family-wise error): the i-th smallest becomes the largest
// min(1, (m - j) p_(j)) over j <= i (0-based), in the input's order.
std::vector<double> holm_adjust(std::span<const double> p);

// How a task's scores print: x 100 (a metric in [0, 1]), or, where they are mean negative
// log-likelihoods (a perplexity task, TaskLayout::perplexity), as the perplexity exp(mean); an
// interval maps through the same increasing function.
enum class Scale { Percent, Perplexity };
double scaled(double v, Scale s);  // NaN stays NaN
// "43.00 [36.90, 49.10]", or "43.00" without an interval.
std::string interval_text(const MeanInterval& m, Scale s = Scale::Percent);

}  // namespace kvb
