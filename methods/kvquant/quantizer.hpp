#pragma once
// KVQuant's dense-and-sparse non-uniform quantizer (Hooper et al. 2024; SqueezeAILab/KVQuant,
// quant/kvquant/simquant_module_quantizer.py, `quant_fn_nuq_recon` with its outlier rules), one token's
// row of a layer at a time, and the pieces of its calibration (percentile thresholds, Fisher-weighted
// 1-D k-means). The arithmetic follows the reference step by step, including where it rounds to fp16,
// so that the dequantized rows equal the reference's on the same input.
#include <cstdint>
#include <random>
#include <span>
#include <vector>

namespace kvb {

// One layer's quantizers, as calibration leaves them. Keys: static per-channel thresholds (the
// reference keeps them as fp16) over the layer's whole pre-RoPE key row [n_kv_heads x head_dim];
// values: thresholds computed per token at run time. Each kind has one codebook of 2^bits signposts in
// the units where the thresholds map to [-1, 1], ascending, in float32 as scikit-learn fits them on
// the reference's float32 activations.
struct KvquantLayer {
  std::vector<uint16_t> k_upper, k_lower;  // fp16, [channels]
  std::vector<float> k_codebook, v_codebook;
};

// A value kept at full precision: its channel in the layer's row and the dequantized value (fp16).
struct KvquantOutlier {
  int32_t channel = 0;
  uint16_t value = 0;
};

// One row quantized: a code per channel (the signpost index; outliers' codes are unused), the outliers,
// and, for values, the row's offset and range (fp32, as the reference computes them per token).
struct KvquantRow {
  std::vector<uint8_t> codes;
  std::vector<KvquantOutlier> outliers;
  float offset = 0, range = 0;
};

// The row as attention reads it (fp16 numbers, widened), written to `out`; `row` (optional) gets the codes.
// share: the outlier share the thresholds stand for (the paper's 1%: 0.01).
void kvquant_keys(const KvquantLayer& q, const float* x, int channels, float* out, KvquantRow* row = nullptr);
void kvquant_values(const KvquantLayer& q, double share, const float* x, int channels, float* out,
                    KvquantRow* row = nullptr);
// The dequantized channels [c0, c0 + n) of a quantized row, from its codes alone: keys with the layer's
// thresholds, values with the row's offset and range. Equal to what kvquant_keys/values wrote.
void kvquant_decode_keys(const KvquantLayer& q, const KvquantRow& row, int c0, int n, float* out);
void kvquant_decode_values(const KvquantLayer& q, const KvquantRow& row, int c0, int n, float* out);

// x rounded to fp16 and widened back: where the reference's fp16 model or casts hold a number.
float kvquant_fp16(float x);

// numpy's default (linear) percentile of sorted float32 values at fraction p in [0, 1], as
// np.percentile computes it for a scalar percentage (float32 arithmetic).
float percentile_sorted(std::span<const float> sorted, double p);
// torch.quantile (linear) of sorted float32 values at fraction q, with torch's float32 rank and lerp.
float torch_quantile_sorted(std::span<const float> sorted, float q);
// The reference's upper fraction t = 1 - (1 - threshold) / 2 for an outlier share (0.01 -> 0.995).
double kvquant_upper_fraction(double share);

// A weighted histogram of normalised values in [-1, 1]: per bin the weight and the weighted sum, so
// that k-means over the bins' weighted means is the weighted k-means of the values up to values that
// share a bin with a cluster boundary (bins 2 / 65536 wide).
class WeightedHistogram {
 public:
  explicit WeightedHistogram(int bins = 1 << 16) : w_(size_t(bins), 0.0), s_(size_t(bins), 0.0) {}
  void add(double x, double w);
  void merge(const WeightedHistogram& o);
  double total_weight() const;
  // The non-empty bins as points (weighted mean) and weights.
  void points(std::vector<double>& x, std::vector<double>& w) const;

 private:
  std::vector<double> w_, s_;
};

// Weighted 1-D k-means as the reference calls scikit-learn's KMeans (k-means++ seeding with
// 2 + floor(ln k) local trials, one initialisation, Lloyd iterations up to max_iter or until the
// squared centre shift falls below tol x the points' variance). Returns k ascending centres.
std::vector<double> weighted_kmeans_1d(std::span<const double> x, std::span<const double> w, int k, uint64_t seed,
                                       int max_iter = 50, double tol = 1e-4);
// Sum over points of w (x - nearest centre)^2.
double kmeans_inertia(std::span<const double> x, std::span<const double> w, std::span<const double> centres);

}  // namespace kvb
