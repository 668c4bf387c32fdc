#include "methods/vector/approx_value_segment.hpp"

#include "harness/cache/device_form.hpp"

#include <cblas.h>

#include <algorithm>
#include <numeric>

#include "harness/util/error.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "kernels/cpu/vec_math.hpp"

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
void AffineValueEstimator::multiply(const float* x, int g, float* y) const {
  rows_weighted_in_order(wt_.data(), size_t(d_), d_, x, size_t(d_), g, false, y, size_t(d_));
}

void AffineValueEstimator::predict(const float* k, float* v) const {
  multiply(k, 1, v);
  if (!c_.empty())
    for (int i = 0; i < d_; ++i) v[i] += c_[i];
}

ApproxValueSegment::ApproxValueSegment(int head_dim, std::shared_ptr<const ValueEstimator> est,
                                       std::shared_ptr<const RopeTable> rope, bool charge_estimator)
    : d_(head_dim), est_(std::move(est)), rope_(std::move(rope)), charge_(charge_estimator) {}

size_t ApproxValueSegment::bytes() const {
  return size() * size_t(d_) * kv_dtype_bytes(dtype_) +
         (charge_ ? est_->bytes() / sizeof(float) * kv_dtype_bytes(dtype_) : 0);
}

void ApproxValueSegment::store_as(KvDtype t) {
  if (t == dtype_) return;
  dtype_ = t;
  for (float& x : blocks_) x = kv_round(t, x);
  for (size_t i = 0; i < size(); ++i) row_of_blocks(blocks_.data(), i, d_, pre_.data() + i * d_);
  if (size()) rope_->apply_inverse(pre_.data(), static_cast<int>(size()), 1, d_, pos_.data());
}

void MaterializedValueSegment::store_as(KvDtype t) {
  if (t == dtype_) return;
  dtype_ = t;
  for (auto* a : {&k_, &v_})
    for (float& x : *a) x = kv_round(t, x);
}

void ApproxValueSegment::append(const float* k, int32_t pos) {
  const size_t n = size();
  pre_.resize((n + 1) * d_);
  float* pre = pre_.data() + n * d_;
  for (int i = 0; i < d_; ++i) pre[i] = kv_round(dtype_, k[i]);
  append_block_row(blocks_, n, d_, pre);
  rope_->apply_inverse(pre, 1, 1, d_, &pos);
  pos_.push_back(pos);
}

void ApproxValueSegment::logits(const float* q, float* scores) const { logits_group(q, 1, d_, scores); }

// Each query's products in the order of a plain dot product: the numbers VECTOR's cells were recorded with.
void ApproxValueSegment::logits_group(const float* q, int g, int, float* scores) const {
  blocks_dot_in_order(blocks_.data(), 0, size(), d_, q, g, scores, size());
}

std::vector<size_t> ApproxValueSegment::token_cuts(int parts) const { return even_cuts(size(), parts, kOrderBlock); }

void ApproxValueSegment::logits_part(const float* q, int g, int, size_t t0, size_t t1, float* scores, size_t ld) const {
  blocks_dot_in_order(blocks_.data(), t0, t1, d_, q, g, scores, ld);
}

void ApproxValueSegment::reconstruct(std::vector<float>& k, std::vector<float>& v) const {
  k.resize(size() * d_);
  v.resize(size() * d_);
  for (size_t t = 0; t < size(); ++t) {
    row_of_blocks(blocks_.data(), t, d_, k.data() + t * d_);
    est_->predict(pre_.data() + t * d_, v.data() + t * d_);
  }
}

void ApproxValueSegment::accumulate(const float* p, float* acc) const { accumulate_group(p, 1, d_, acc); }

// Each weight vector sums the pre-RoPE keys over the tokens in order, as it would alone.
void ApproxValueSegment::accumulate_group(const float* p, int g, int, float* acc) const {
  const size_t n = size();
  if (const auto* aff = dynamic_cast<const AffineValueEstimator*>(est_.get())) {
    // sum_t p_t (W k~_t + c) = W (sum_t p_t k~_t) + c sum_t p_t, for the whole group at once
    thread_local std::vector<float> kbar, wkbar;
    kbar.resize(size_t(g) * d_);
    wkbar.resize(size_t(g) * d_);
    rows_weighted_in_order(pre_.data(), n, d_, p, n, g, true, kbar.data(), size_t(d_));
    aff->multiply(kbar.data(), g, wkbar.data());
    for (int j = 0; j < g; ++j) {
      float psum = 0;
      for (size_t t = 0; t < n; ++t)
        if (const float w = p[size_t(j) * n + t]; w != 0.0f) psum += w;
      float* aj = acc + size_t(j) * d_;
      const float* out = wkbar.data() + size_t(j) * d_;
      for (int i = 0; i < d_; ++i) aj[i] += out[i] + (aff->c().empty() ? 0.0f : aff->c()[i] * psum);
    }
    return;
  }
  std::vector<float> out(d_);
  for (size_t t = 0; t < n; ++t) {
    bool weighted = false;
    for (int j = 0; j < g; ++j) weighted = weighted || p[size_t(j) * n + t] != 0.0f;
    if (!weighted) continue;
    est_->predict(pre_.data() + t * d_, out.data());
    for (int j = 0; j < g; ++j) {
      const float w = p[size_t(j) * n + t];
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
  std::vector<float> k(size() * d_);
  for (size_t t = 0; t < size(); ++t) row_of_blocks(blocks_.data(), t, d_, k.data() + t * d_);
  d.k = up.upload(k);
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
