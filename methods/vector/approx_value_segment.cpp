#include "methods/vector/approx_value_segment.hpp"

#include "harness/cache/device_form.hpp"

#include <cblas.h>

#include <algorithm>
#include <numeric>

#include "harness/util/error.hpp"

namespace kvb {

AffineValueEstimator::AffineValueEstimator(int d, std::vector<float> w, std::vector<float> c)
    : d_(d), w_(std::move(w)), c_(std::move(c)) {
  if (w_.size() != size_t(d) * d || (!c_.empty() && c_.size() != size_t(d)))
    fail("affine value estimator: W must be {}x{} and c of length {} or empty", d, d, d);
}

void AffineValueEstimator::multiply(const float* x, float* y) const {
  for (int i = 0; i < d_; ++i) {
    float s = 0;
    for (int j = 0; j < d_; ++j) s += w_[size_t(i) * d_ + j] * x[j];
    y[i] = s;
  }
}

void AffineValueEstimator::predict(const float* k, float* v) const {
  multiply(k, v);
  if (!c_.empty())
    for (int i = 0; i < d_; ++i) v[i] += c_[i];
}

ApproxValueSegment::ApproxValueSegment(int head_dim, std::shared_ptr<const ValueEstimator> est,
                                       std::shared_ptr<const RopeTable> rope, bool charge_estimator)
    : d_(head_dim), est_(std::move(est)), rope_(std::move(rope)), charge_(charge_estimator) {}

size_t ApproxValueSegment::bytes() const {
  return k_.size() * kv_dtype_bytes(dtype_) + (charge_ ? est_->bytes() / sizeof(float) * kv_dtype_bytes(dtype_) : 0);
}

void ApproxValueSegment::store_as(KvDtype t) {
  if (t == dtype_) return;
  dtype_ = t;
  for (float& x : k_) x = kv_round(t, x);
}

void MaterializedValueSegment::store_as(KvDtype t) {
  if (t == dtype_) return;
  dtype_ = t;
  for (auto* a : {&k_, &v_})
    for (float& x : *a) x = kv_round(t, x);
}

void ApproxValueSegment::append(const float* k, int32_t pos) {
  for (int i = 0; i < d_; ++i) k_.push_back(kv_round(dtype_, k[i]));
  pos_.push_back(pos);
}

void ApproxValueSegment::logits(const float* q, float* scores) const {
  for (size_t t = 0; t < size(); ++t) scores[t] = std::inner_product(q, q + d_, k_.data() + t * d_, 0.0f);
}

void ApproxValueSegment::reconstruct(std::vector<float>& k, std::vector<float>& v) const {
  k = k_;
  v.assign(k_.size(), 0.0f);
  std::vector<float> pre(d_);
  for (size_t t = 0; t < size(); ++t) {
    std::copy_n(k_.data() + t * d_, d_, pre.data());
    rope_->apply_inverse(pre.data(), 1, 1, d_, &pos_[t]);
    est_->predict(pre.data(), v.data() + t * d_);
  }
}

void ApproxValueSegment::accumulate(const float* p, float* acc) const {
  std::vector<float> pre(d_), out(d_);
  if (const auto* aff = dynamic_cast<const AffineValueEstimator*>(est_.get())) {
    // sum_t p_t (W k~_t + c) = W (sum_t p_t k~_t) + c sum_t p_t
    std::vector<float> kbar(d_, 0.0f);
    float psum = 0;
    for (size_t t = 0; t < size(); ++t) {
      if (p[t] == 0.0f) continue;
      std::copy_n(k_.data() + t * d_, d_, pre.data());
      rope_->apply_inverse(pre.data(), 1, 1, d_, &pos_[t]);
      for (int i = 0; i < d_; ++i) kbar[i] += p[t] * pre[i];
      psum += p[t];
    }
    aff->multiply(kbar.data(), out.data());
    for (int i = 0; i < d_; ++i) acc[i] += out[i] + (aff->c().empty() ? 0.0f : aff->c()[i] * psum);
    return;
  }
  for (size_t t = 0; t < size(); ++t) {
    if (p[t] == 0.0f) continue;
    std::copy_n(k_.data() + t * d_, d_, pre.data());
    rope_->apply_inverse(pre.data(), 1, 1, d_, &pos_[t]);
    est_->predict(pre.data(), out.data());
    for (int i = 0; i < d_; ++i) acc[i] += p[t] * out[i];
  }
}

void MaterializedValueSegment::append(const float* k, const float* v, int32_t pos) {
  for (int i = 0; i < d_; ++i) {
    k_.push_back(kv_round(dtype_, k[i]));
    v_.push_back(kv_round(dtype_, v[i]));
  }
  pos_.push_back(pos);
}

void MaterializedValueSegment::logits(const float* q, float* scores) const {
  if (size()) cblas_sgemv(CblasRowMajor, CblasNoTrans, int(size()), d_, 1.0f, k_.data(), d_, q, 1, 0.0f, scores, 1);
}

void MaterializedValueSegment::accumulate(const float* p, float* acc) const {
  if (size()) cblas_sgemv(CblasRowMajor, CblasTrans, int(size()), d_, 1.0f, v_.data(), d_, p, 1, 1.0f, acc, 1);
}

// Keys kept, values rebuilt from the inverse-rotated key: the affine estimator only.
bool ApproxValueSegment::device_form(DeviceUploader& up, cuda::DecodeSegment& d) const {
  const auto* aff = dynamic_cast<const AffineValueEstimator*>(est_.get());
  if (!aff) fail("CUDA decode: value estimator '{}' has no GPU form (only 'affine'); use --backend cpu", est_->name());
  up.check_rope(*rope_);
  d.kind = cuda::kApproxAffine;
  d.pos = up.upload(positions());
  d.k = up.upload(k_);
  d.w = up.upload_shared(aff->w());
  d.c = aff->c().empty() ? nullptr : up.upload_shared(aff->c());
  return true;
}

// Dense keys and values as attention reads them; never the tail (decoding appends after it).
bool MaterializedValueSegment::device_form(DeviceUploader& up, cuda::DecodeSegment& d) const {
  d.kind = cuda::kDense;
  d.pos = up.upload(positions());
  d.k = up.upload(k_);
  d.v = up.upload(v_);
  return true;
}

}  // namespace kvb
