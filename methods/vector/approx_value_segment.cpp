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
  wt_.resize(w_.size());
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < d; ++j) wt_[size_t(j) * d + i] = w_[size_t(i) * d + j];
}

// Column by column over W's transpose, so that the rows' sums advance side by side in vector lanes,
// each in the order j = 0, 1, ... of its own dot product.
void AffineValueEstimator::multiply(const float* x, float* y) const {
  std::fill(y, y + d_, 0.0f);
  for (int j = 0; j < d_; ++j) {
    const float* col = wt_.data() + size_t(j) * d_;
    for (int i = 0; i < d_; ++i) y[i] += col[i] * x[j];
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

void ApproxValueSegment::logits(const float* q, float* scores) const { logits_group(q, 1, d_, scores); }

// Each query's products in the order of a plain dot product: the numbers VECTOR's cells were recorded with.
void ApproxValueSegment::logits_group(const float* q, int g, int, float* scores) const {
  rows_dot_in_order(k_.data(), size(), d_, q, g, scores);
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

void ApproxValueSegment::accumulate(const float* p, float* acc) const { accumulate_group(p, 1, d_, acc); }

// Each weighted token's key rotated back to its pre-RoPE form once for the whole group, in one call; then
// each weight vector sums over the tokens in order, as it would alone.
void ApproxValueSegment::accumulate_group(const float* p, int g, int, float* acc) const {
  const size_t n = size();
  // Reused across calls: a decode step makes one call per layer and cache head.
  thread_local std::vector<float> pre, out;
  thread_local std::vector<int32_t> pos;
  thread_local std::vector<size_t> token;
  token.clear();
  pos.clear();
  for (size_t t = 0; t < n; ++t)
    for (int j = 0; j < g; ++j)
      if (p[size_t(j) * n + t] != 0.0f) {
        token.push_back(t);
        pos.push_back(pos_[t]);
        break;
      }
  const size_t m = token.size();
  pre.resize(m * d_);
  for (size_t r = 0; r < m; ++r) std::copy_n(k_.data() + token[r] * d_, d_, pre.data() + r * d_);
  rope_->apply_inverse(pre.data(), static_cast<int>(m), 1, d_, pos.data());
  out.resize(d_);
  if (const auto* aff = dynamic_cast<const AffineValueEstimator*>(est_.get())) {
    // sum_t p_t (W k~_t + c) = W (sum_t p_t k~_t) + c sum_t p_t
    std::vector<float> kbar(d_);
    for (int j = 0; j < g; ++j) {
      const float* pj = p + size_t(j) * n;
      std::fill(kbar.begin(), kbar.end(), 0.0f);
      float psum = 0;
      for (size_t r = 0; r < m; ++r) {
        const float w = pj[token[r]];
        if (w == 0.0f) continue;
        const float* k = pre.data() + r * d_;
        for (int i = 0; i < d_; ++i) kbar[i] += w * k[i];
        psum += w;
      }
      aff->multiply(kbar.data(), out.data());
      float* aj = acc + size_t(j) * d_;
      for (int i = 0; i < d_; ++i) aj[i] += out[i] + (aff->c().empty() ? 0.0f : aff->c()[i] * psum);
    }
    return;
  }
  for (size_t r = 0; r < m; ++r) {
    est_->predict(pre.data() + r * d_, out.data());
    for (int j = 0; j < g; ++j) {
      const float w = p[size_t(j) * n + token[r]];
      if (w == 0.0f) continue;
      float* aj = acc + size_t(j) * d_;
      for (int i = 0; i < d_; ++i) aj[i] += w * out[i];
    }
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
