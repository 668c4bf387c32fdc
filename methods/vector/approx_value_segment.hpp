#pragma once
// Tokens whose keys are kept and whose values are rebuilt from the keys by a calibrated estimator
// (VECTOR, methods/vector/README.md §3-§5): keys stored post-RoPE, the estimator reads the pre-RoPE key
// (inverse rotation at the token's position). Estimators are pluggable; an affine one is folded so
// that decoding applies one D x D product per query instead of one per token.
#include <cstdint>
#include <memory>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

class ValueEstimator {
 public:
  virtual ~ValueEstimator() = default;
  virtual std::string name() const = 0;
  // v[d] from a pre-RoPE key k[d].
  virtual void predict(const float* k, float* v) const = 0;
  virtual size_t bytes() const = 0;
};

// v = W k + c with W row-major [d, d] (the OLS map of VECTOR).
class AffineValueEstimator final : public ValueEstimator {
 public:
  AffineValueEstimator(int d, std::vector<float> w, std::vector<float> c);
  std::string name() const override { return "affine"; }
  void predict(const float* k, float* v) const override;
  void multiply(const float* x, int g, float* y) const;  // W x_j for x, y [g, d]; without c
  size_t bytes() const override { return (w_.size() + c_.size()) * sizeof(float); }
  int dim() const { return d_; }
  const std::vector<float>& w() const { return w_; }
  const std::vector<float>& c() const { return c_; }

 private:
  int d_;
  std::vector<float> w_, c_;
  std::vector<float> wt_;  // W transposed [d, d], for multiply
};

class ApproxValueSegment final : public Segment {
 public:
  ApproxValueSegment(int head_dim, std::shared_ptr<const ValueEstimator> est, std::shared_ptr<const RopeTable> rope,
                     bool charge_estimator);
  std::string format() const override { return "approx_value(" + est_->name() + ")"; }
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  // Keys plus the estimator when this segment is charged for it; the values cost nothing.
  size_t bytes() const override;
  // Rounds the keys to t and charges them, and the estimator, at t. The shared estimator keeps its
  // fp32 numbers (other segments read it).
  void store_as(KvDtype t) override;
  void logits(const float* q, float* scores) const override;
  void accumulate(const float* p, float* acc) const override;
  void logits_group(const float* q, int g, int d, float* scores) const override;
  void accumulate_group(const float* p, int g, int d, float* acc) const override;
  // Logits cut at whole blocks of keys; the values are read whole (every channel of the folded sum
  // needs all of it).
  std::vector<size_t> token_cuts(int parts) const override;
  void logits_part(const float* q, int g, int d, size_t t0, size_t t1, float* scores, size_t ld) const override;
  bool device_form(DeviceUploader& up, cuda::DecodeSegment& d) const override;

  void append(const float* k_post_rope, int32_t pos);
  // Keys and estimated values at full dimension: the reference for the fast path.
  void reconstruct(std::vector<float>& k, std::vector<float>& v) const;

  // The stored form, for backends that attend over it directly.
  const ValueEstimator& estimator() const { return *est_; }
  const RopeTable& rope() const { return *rope_; }

 private:
  int d_;
  std::shared_ptr<const ValueEstimator> est_;
  std::shared_ptr<const RopeTable> rope_;
  bool charge_;
  KvDtype dtype_ = KvDtype::F32;
  // The stored keys (post-RoPE, rounded to dtype_) in blocks for the logits (kernels/cpu/kv_rows.hpp),
  // and the same keys rotated back once, at append, for the values: a step reads each form in the order
  // its product wants it instead of gathering or rotating every key again.
  std::vector<float> blocks_, pre_;
  std::vector<int32_t> pos_;
};

// VECTOR's accuracy-only shortcut (vector_materialize): the estimated values computed once at prefill
// and stored beside the keys, so that decoding reads them like dense values. Its bytes are those of
// the on-the-fly form (keys only): what the method would hold, not what this buffer holds. Also the
// only form for a map that reads other heads' keys (the full-layer map), which decoding cannot rebuild
// once those heads have evicted the token.
// With `keys_estimated` the roles swap (VECTOR's K-only ablation, Appendix E): the keys are the estimates
// (rebuilt from the values and rotated to the token's position) and the values are stored, so its bytes
// are the values'.
class MaterializedValueSegment final : public Segment {
 public:
  MaterializedValueSegment(int head_dim, std::string estimator, bool keys_estimated = false)
      : d_(head_dim), est_(std::move(estimator)), keys_estimated_(keys_estimated) {}
  std::string format() const override {
    return (keys_estimated_ ? "approx_key(" : "approx_value(") + est_ + ", materialized)";
  }
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  size_t bytes() const override { return (keys_estimated_ ? v_ : k_).size() * kv_dtype_bytes(dtype_); }
  void store_as(KvDtype t) override;
  void logits(const float* q, float* scores) const override;
  void accumulate(const float* p, float* acc) const override;
  bool device_form(DeviceUploader& up, cuda::DecodeSegment& d) const override;

  // The post-RoPE key and the value, one of them the estimate.
  void append(const float* k_post_rope, const float* v, int32_t pos);
  const std::vector<float>& keys() const { return k_; }
  const std::vector<float>& values() const { return v_; }

 private:
  int d_;
  std::string est_;
  bool keys_estimated_;
  KvDtype dtype_ = KvDtype::F32;
  std::vector<float> k_, v_;
  std::vector<int32_t> pos_;
};

}  // namespace kvb
