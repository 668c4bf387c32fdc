#include "methods/kvquant/quantizer.hpp"

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"

namespace kvb {
namespace {

// The reference's round_to_nearest_pole_sim: the first signpost at the least float32 distance. A
// non-finite input lands on the first, as torch's argmin over NaN distances does.
int nearest(std::span<const float> cb, float s) {
  if (!std::isfinite(s)) return 0;
  int best = 0;
  float dist = std::abs(s - cb[0]);
  for (size_t i = 1; i < cb.size(); ++i) {
    const float d = std::abs(s - cb[i]);
    if (d < dist) {
      dist = d;
      best = int(i);
    }
  }
  return best;
}

// quant_fn_nuq_recon for one channel after the outlier test: returns the value before the final fp16.
float reconstruct(std::span<const float> cb, int code, bool outlier, float centred, float offset, float range) {
  const float kept = outlier ? centred : 0.0f;  // outliers = inp * outlier_mask
  float r = cb[size_t(code)] * range;
  if (outlier) r = 0.0f;
  r = (r + kept) + offset;
  return std::isfinite(r) ? r : 0.0f;  // torch.nan_to_num(nan=0, posinf=0, neginf=0)
}

int quantize_channel(std::span<const float> cb, float x, bool outlier, float offset, float range, float& out) {
  const float centred = x - offset;
  const float inp = centred - (outlier ? centred : 0.0f);
  const int code = nearest(cb, inp / range);
  out = kvquant_fp16(reconstruct(cb, code, outlier, centred, offset, range));
  return code;
}

// The keys' fp16 offset and range: the reference adds and halves its fp16 thresholds in fp16.
void key_scale(const KvquantLayer& q, int c, float& offset, float& range) {
  const float u = half_to_float(q.k_upper[size_t(c)]), l = half_to_float(q.k_lower[size_t(c)]);
  offset = kvquant_fp16(kvquant_fp16(u + l) / 2.0f);
  range = kvquant_fp16(kvquant_fp16(u - l) / 2.0f);
}

void check_layer(const KvquantLayer& q, int channels) {
  if (q.k_upper.size() != size_t(channels) || q.k_lower.size() != size_t(channels))
    fail("kvquant: the layer's key thresholds cover {} channels, the row has {}", q.k_upper.size(), channels);
}

void start_row(KvquantRow* row, int channels) {
  if (!row) return;
  row->codes.assign(size_t(channels), 0);
  row->outliers.clear();
}

}  // namespace

float kvquant_fp16(float x) { return half_to_float(float_to_half(x)); }

double kvquant_upper_fraction(double share) { return 1.0 - (1.0 - (1.0 - share)) / 2.0; }

void kvquant_keys(const KvquantLayer& q, const float* x, int channels, float* out, KvquantRow* row) {
  check_layer(q, channels);
  start_row(row, channels);
  for (int c = 0; c < channels; ++c) {
    float offset, range;
    key_scale(q, c, offset, range);
    const bool outlier = x[c] < half_to_float(q.k_lower[size_t(c)]) || x[c] > half_to_float(q.k_upper[size_t(c)]);
    const int code = quantize_channel(q.k_codebook, x[c], outlier, offset, range, out[c]);
    if (!row) continue;
    row->codes[size_t(c)] = uint8_t(code);
    if (outlier) row->outliers.push_back({c, float_to_half(out[c])});
  }
}

void kvquant_values(const KvquantLayer& q, double share, const float* x, int channels, float* out, KvquantRow* row) {
  start_row(row, channels);
  std::vector<float> sorted(x, x + channels);
  std::sort(sorted.begin(), sorted.end());
  const double t = kvquant_upper_fraction(share);
  const float upper = torch_quantile_sorted(sorted, float(t)), lower = torch_quantile_sorted(sorted, float(1.0 - t));
  const float median = sorted[size_t(channels - 1) / 2];  // torch.median: the lower middle
  // The row's range without its outliers: each replaced by the median.
  float hi = -std::numeric_limits<float>::infinity(), lo = std::numeric_limits<float>::infinity();
  for (int c = 0; c < channels; ++c) {
    const bool outlier = x[c] <= lower || x[c] >= upper;
    const float v = outlier ? (x[c] - x[c]) + median : x[c];
    hi = std::max(hi, v);
    lo = std::min(lo, v);
  }
  const float offset = (hi + lo) / 2.0f, range = (hi - lo) / 2.0f;
  if (row) {
    row->offset = offset;
    row->range = range;
  }
  for (int c = 0; c < channels; ++c) {
    const bool outlier = x[c] <= lower || x[c] >= upper;
    const int code = quantize_channel(q.v_codebook, x[c], outlier, offset, range, out[c]);
    if (!row) continue;
    row->codes[size_t(c)] = uint8_t(code);
    if (outlier) row->outliers.push_back({c, float_to_half(out[c])});
  }
}

namespace {

void decode(std::span<const float> cb, const KvquantRow& row, int c0, int n, float* out,
            const std::function<void(int, float&, float&)>& scale) {
  for (int c = c0; c < c0 + n; ++c) {
    float offset, range;
    scale(c, offset, range);
    out[c - c0] = kvquant_fp16(reconstruct(cb, row.codes[size_t(c)], false, 0.0f, offset, range));
  }
  for (const KvquantOutlier& o : row.outliers)
    if (o.channel >= c0 && o.channel < c0 + n) out[o.channel - c0] = half_to_float(o.value);
}

}  // namespace

void kvquant_decode_keys(const KvquantLayer& q, const KvquantRow& row, int c0, int n, float* out) {
  decode(q.k_codebook, row, c0, n, out, [&](int c, float& offset, float& range) { key_scale(q, c, offset, range); });
}

void kvquant_decode_values(const KvquantLayer& q, const KvquantRow& row, int c0, int n, float* out) {
  decode(q.v_codebook, row, c0, n, out, [&](int, float& offset, float& range) {
    offset = row.offset;
    range = row.range;
  });
}

float percentile_sorted(std::span<const float> sorted, double p) {
  if (sorted.empty()) fail("kvquant: percentile of no values");
  // numpy's linear method for a scalar fraction: the virtual index n p + (1 - p) - 1 in double, then in
  // float32 a + (b - a) g, or b - (b - a)(1 - g) from g = 0.5.
  const double n = double(sorted.size());
  const double at = std::clamp(n * p + (1.0 + p * -1.0) - 1.0, 0.0, n - 1.0);
  const size_t below = size_t(std::floor(at)), above = std::min(below + 1, sorted.size() - 1);
  const double g = at - double(below);
  const float a = sorted[below], b = sorted[above], diff = b - a;
  return g >= 0.5 ? b - diff * float(1.0 - g) : a + diff * float(g);
}

float torch_quantile_sorted(std::span<const float> sorted, float q) {
  if (sorted.empty()) fail("kvquant: quantile of no values");
  const float rank = q * float(sorted.size() - 1);
  const auto below = size_t(rank), above = size_t(std::ceil(rank));
  const float w = rank - float(below), a = sorted[below], b = sorted[std::min(above, sorted.size() - 1)];
  return w < 0.5f ? a + w * (b - a) : b - (b - a) * (1.0f - w);
}

void WeightedHistogram::add(double x, double w) {
  const double bins = double(w_.size());
  const auto b = size_t(std::clamp(std::floor((x + 1.0) * 0.5 * bins), 0.0, bins - 1.0));
  w_[b] += w;
  s_[b] += w * x;
}

void WeightedHistogram::merge(const WeightedHistogram& o) {
  for (size_t i = 0; i < w_.size(); ++i) {
    w_[i] += o.w_[i];
    s_[i] += o.s_[i];
  }
}

double WeightedHistogram::total_weight() const { return std::accumulate(w_.begin(), w_.end(), 0.0); }

void WeightedHistogram::points(std::vector<double>& x, std::vector<double>& w) const {
  x.clear();
  w.clear();
  for (size_t i = 0; i < w_.size(); ++i)
    if (w_[i] > 0) {
      x.push_back(s_[i] / w_[i]);
      w.push_back(w_[i]);
    }
}

namespace {

// Index of the nearest of ascending centres for ascending points, by one sweep.
void assign(std::span<const double> x, std::span<const double> centres, std::vector<int>& label) {
  label.resize(x.size());
  size_t j = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    while (j + 1 < centres.size() && std::abs(x[i] - centres[j + 1]) <= std::abs(x[i] - centres[j])) ++j;
    label[i] = int(j);
  }
}

}  // namespace

double kmeans_inertia(std::span<const double> x, std::span<const double> w, std::span<const double> centres) {
  double sum = 0;
  for (size_t i = 0; i < x.size(); ++i) {
    double best = std::numeric_limits<double>::infinity();
    for (double c : centres) best = std::min(best, (x[i] - c) * (x[i] - c));
    sum += w[i] * best;
  }
  return sum;
}

std::vector<double> weighted_kmeans_1d(std::span<const double> x, std::span<const double> w, int k, uint64_t seed,
                                       int max_iter, double tol) {
  if (x.size() != w.size()) fail("kvquant k-means: {} points, {} weights", x.size(), w.size());
  if (!std::is_sorted(x.begin(), x.end())) fail("kvquant k-means: the points must be ascending");
  const double total = std::accumulate(w.begin(), w.end(), 0.0);
  if (x.size() < size_t(k) || !(total > 0))
    fail("kvquant k-means: {} points of total weight {} cannot make {} clusters", x.size(), total, k);
  std::mt19937_64 rng(seed);
  std::uniform_real_distribution<double> uniform(0.0, 1.0);
  // Index of the point where the cumulative sum of weights reaches r (numpy's searchsorted).
  const auto pick = [&](const std::vector<double>& mass, double r) {
    double acc = 0;
    for (size_t i = 0; i < mass.size(); ++i) {
      acc += mass[i];
      if (acc >= r) return i;
    }
    return mass.size() - 1;
  };
  // k-means++ as scikit-learn's: the first centre by weight, then greedily the best of a few candidates
  // drawn by weight x squared distance.
  std::vector<double> centres{x[pick(std::vector<double>(w.begin(), w.end()), uniform(rng) * total)]};
  std::vector<double> closest(x.size()), mass(x.size()), trial(x.size()), best_closest;
  for (size_t i = 0; i < x.size(); ++i) closest[i] = (x[i] - centres[0]) * (x[i] - centres[0]);
  const int trials = 2 + int(std::log(double(k)));
  while (int(centres.size()) < k) {
    double pot = 0;
    for (size_t i = 0; i < x.size(); ++i) pot += (mass[i] = w[i] * closest[i]);
    double best_pot = std::numeric_limits<double>::infinity(), best = 0;
    for (int t = 0; t < trials; ++t) {
      const double c = x[pick(mass, uniform(rng) * pot)];
      double p = 0;
      for (size_t i = 0; i < x.size(); ++i) p += w[i] * (trial[i] = std::min(closest[i], (x[i] - c) * (x[i] - c)));
      if (p < best_pot) {
        best_pot = p;
        best = c;
        best_closest = trial;
      }
    }
    centres.push_back(best);
    closest = best_closest;
  }
  std::sort(centres.begin(), centres.end());
  // Lloyd iterations; the tolerance scales with the points' weighted variance as scikit-learn's does.
  const double mean = std::inner_product(x.begin(), x.end(), w.begin(), 0.0) / total;
  double var = 0;
  for (size_t i = 0; i < x.size(); ++i) var += w[i] * (x[i] - mean) * (x[i] - mean);
  const double limit = tol * var / total;
  std::vector<int> label, previous;
  for (int it = 0; it < max_iter; ++it) {
    assign(x, centres, label);
    std::vector<double> sw(size_t(k), 0.0), sx(size_t(k), 0.0);
    for (size_t i = 0; i < x.size(); ++i) {
      sw[size_t(label[i])] += w[i];
      sx[size_t(label[i])] += w[i] * x[i];
    }
    double shift = 0;
    for (size_t j = 0; j < size_t(k); ++j) {
      if (!(sw[j] > 0)) continue;  // an empty cluster keeps its centre
      const double c = sx[j] / sw[j];
      shift += (c - centres[j]) * (c - centres[j]);
      centres[j] = c;
    }
    std::sort(centres.begin(), centres.end());
    if (label == previous || shift <= limit) break;
    previous = label;
  }
  return centres;
}

}  // namespace kvb
