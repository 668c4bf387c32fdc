#include "harness/cache/lowrank_segment.hpp"

#include "harness/cache/device_form.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numeric>

#include "harness/util/error.hpp"
#include "harness/util/linalg.hpp"

namespace kvb {

LowRankSegment::LowRankSegment(std::shared_ptr<const LowRankBasis> basis, int k_rank, int v_rank, bool charge_basis,
                               std::shared_ptr<const RopeTable> rope)
    : basis_(std::move(basis)), rk_(k_rank), rv_(v_rank), charge_basis_(charge_basis), rope_(std::move(rope)) {
  if (rk_ < 0 || rv_ < 0 || rk_ > basis_->rank || rv_ > basis_->rank)
    fail("LowRankSegment: ranks k={} v={} must be within the basis rank {}", rk_, rv_, basis_->rank);
}

std::string LowRankSegment::format() const {
  return fmt::format("lowrank(k{},v{}{}{})", rk_, rv_, rope_ ? ",pre-rope" : "",
                     basis_->v_mean.empty() ? "" : ",centred");
}

size_t LowRankSegment::bytes() const {
  const size_t values =
      ck_.size() + cv_.size() + (charge_basis_ ? basis_->k.size() + basis_->v.size() + basis_->v_mean.size() : 0);
  return values * kv_dtype_bytes(dtype_);
}

void LowRankSegment::store_as(KvDtype t) {
  if (t == dtype_) return;
  dtype_ = t;
  for (auto* c : {&ck_, &cv_})
    for (float& x : *c) x = kv_round(t, x);
}

namespace {
// c[r] = x[d] P[:, :r] for a row-major [d, R] basis.
void project(const float* x, const std::vector<float>& P, int d, int R, int r, float* c) {
  for (int j = 0; j < r; ++j) c[j] = 0;
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < r; ++j) c[j] += x[i] * P[size_t(i) * R + j];
}
// x[d] (+)= c[r] P[:, :r]^T
void expand(const float* c, const std::vector<float>& P, int d, int R, int r, float* x) {
  for (int i = 0; i < d; ++i) {
    float s = 0;
    for (int j = 0; j < r; ++j) s += c[j] * P[size_t(i) * R + j];
    x[i] += s;
  }
}
}  // namespace

void LowRankSegment::append(const float* k, const float* v, int32_t pos) {
  const int d = basis_->head_dim, R = basis_->rank;
  ck_.resize(ck_.size() + rk_);
  cv_.resize(cv_.size() + rv_);
  project(k, basis_->k, d, R, rk_, ck_.data() + ck_.size() - rk_);
  if (basis_->v_mean.empty()) {
    project(v, basis_->v, d, R, rv_, cv_.data() + cv_.size() - rv_);
  } else {
    std::vector<float> centred(v, v + d);
    for (int i = 0; i < d; ++i) centred[size_t(i)] -= basis_->v_mean[size_t(i)];
    project(centred.data(), basis_->v, d, R, rv_, cv_.data() + cv_.size() - rv_);
  }
  for (auto it = ck_.end() - rk_; it != ck_.end(); ++it) *it = kv_round(dtype_, *it);
  for (auto it = cv_.end() - rv_; it != cv_.end(); ++it) *it = kv_round(dtype_, *it);
  pos_.push_back(pos);
}

void LowRankSegment::reconstruct(std::vector<float>& k, std::vector<float>& v) const {
  const int d = basis_->head_dim, R = basis_->rank;
  const size_t n = size();
  k.assign(n * d, 0.0f);
  v.assign(n * d, 0.0f);
  for (size_t t = 0; t < n; ++t) {
    expand(ck_.data() + t * rk_, basis_->k, d, R, rk_, k.data() + t * d);
    expand(cv_.data() + t * rv_, basis_->v, d, R, rv_, v.data() + t * d);
    if (!basis_->v_mean.empty())
      for (int i = 0; i < d; ++i) v[t * d + size_t(i)] += basis_->v_mean[size_t(i)];
    if (rope_) rope_->apply(k.data() + t * d, 1, 1, d, &pos_[t]);
  }
}

void LowRankSegment::logits(const float* q, float* scores) const {
  const int d = basis_->head_dim, R = basis_->rank;
  const size_t n = size();
  if (rope_) {
    // Position-dependent rotation: rebuild each key, rotate it, then dot.
    std::vector<float> k(d);
    for (size_t t = 0; t < n; ++t) {
      std::fill(k.begin(), k.end(), 0.0f);
      expand(ck_.data() + t * rk_, basis_->k, d, R, rk_, k.data());
      rope_->apply(k.data(), 1, 1, d, &pos_[t]);
      scores[t] = std::inner_product(k.begin(), k.end(), q, 0.0f);
    }
    return;
  }
  // q . (c P^T) = (q P) . c: project the query once.
  std::vector<float> qp(rk_);
  project(q, basis_->k, d, R, rk_, qp.data());
  for (size_t t = 0; t < n; ++t) scores[t] = std::inner_product(qp.begin(), qp.end(), ck_.data() + t * rk_, 0.0f);
}

void LowRankSegment::accumulate(const float* p, float* acc) const {
  const int d = basis_->head_dim, R = basis_->rank;
  std::vector<float> c(rv_, 0.0f);
  for (size_t t = 0; t < size(); ++t)
    for (int j = 0; j < rv_; ++j) c[j] += p[t] * cv_[t * rv_ + j];
  expand(c.data(), basis_->v, d, R, rv_, acc);
  if (!basis_->v_mean.empty()) {
    // Each token's value is the centre plus its projection: the centre weighs sum_t p_t.
    double mass = 0;
    for (size_t t = 0; t < size(); ++t) mass += p[t];
    for (int i = 0; i < d; ++i) acc[i] += static_cast<float>(mass) * basis_->v_mean[size_t(i)];
  }
}

namespace {

// Eigenvectors of a symmetric matrix by cyclic Jacobi rotations; columns of `vecs`, unsorted.
void jacobi_eigen(std::vector<double>& a, int n, std::vector<double>& vals, std::vector<double>& vecs) {
  vecs.assign(size_t(n) * n, 0.0);
  for (int i = 0; i < n; ++i) vecs[size_t(i) * n + i] = 1.0;
  for (int sweep = 0; sweep < 100; ++sweep) {
    double off = 0;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) off += a[size_t(p) * n + q] * a[size_t(p) * n + q];
    if (off < 1e-22) break;
    for (int p = 0; p < n; ++p)
      for (int q = p + 1; q < n; ++q) {
        const double apq = a[size_t(p) * n + q];
        if (std::abs(apq) < 1e-300) continue;
        const double theta = (a[size_t(q) * n + q] - a[size_t(p) * n + p]) / (2 * apq);
        const double t = (theta >= 0 ? 1 : -1) / (std::abs(theta) + std::sqrt(theta * theta + 1));
        const double c = 1 / std::sqrt(t * t + 1), s = t * c;
        for (int k = 0; k < n; ++k) {  // rotate columns p, q
          const double akp = a[size_t(k) * n + p], akq = a[size_t(k) * n + q];
          a[size_t(k) * n + p] = c * akp - s * akq;
          a[size_t(k) * n + q] = s * akp + c * akq;
        }
        for (int k = 0; k < n; ++k) {  // and rows p, q
          const double apk = a[size_t(p) * n + k], aqk = a[size_t(q) * n + k];
          a[size_t(p) * n + k] = c * apk - s * aqk;
          a[size_t(q) * n + k] = s * apk + c * aqk;
        }
        for (int k = 0; k < n; ++k) {
          const double vkp = vecs[size_t(k) * n + p], vkq = vecs[size_t(k) * n + q];
          vecs[size_t(k) * n + p] = c * vkp - s * vkq;
          vecs[size_t(k) * n + q] = s * vkp + c * vkq;
        }
      }
  }
  vals.resize(n);
  for (int i = 0; i < n; ++i) vals[i] = a[size_t(i) * n + i];
}

// Uncentered second moment X^T X / n of the rows of x[n, d], in double.
std::vector<double> second_moment(const float* x, int n, int d) {
  std::vector<double> xd(x, x + size_t(n) * d), c(size_t(d) * d, 0.0);
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d, n, 1.0 / n, xd.data(), d, 0.0, c.data(), d);
  for (int i = 0; i < d; ++i)
    for (int j = 0; j < i; ++j) c[size_t(i) * d + j] = c[size_t(j) * d + i];
  return c;
}

// Columns `order[0..rank)` of the row-major eigenvector matrix as a [d, rank] basis.
std::vector<float> take_columns(const std::vector<double>& vecs, int d, int rank, const std::vector<int>& order) {
  std::vector<float> P(size_t(d) * rank);
  for (int j = 0; j < rank; ++j)
    for (int i = 0; i < d; ++i) P[size_t(i) * rank + j] = static_cast<float>(vecs[size_t(i) * d + order[j]]);
  return P;
}

std::vector<int> descending(const std::vector<double>& vals) {
  std::vector<int> order(vals.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return vals[a] > vals[b]; });
  return order;
}

std::vector<float> top_eigenvectors_ref(const float* x, int n, int d, int rank) {
  std::vector<double> c(size_t(d) * d, 0.0);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < d; ++i)
      for (int j = i; j < d; ++j) c[size_t(i) * d + j] += double(x[size_t(t) * d + i]) * x[size_t(t) * d + j];
  for (int i = 0; i < d; ++i)
    for (int j = i; j < d; ++j) c[size_t(j) * d + i] = c[size_t(i) * d + j] /= n;
  std::vector<double> vals, vecs;
  jacobi_eigen(c, d, vals, vecs);
  return take_columns(vecs, d, rank, descending(vals));
}

// LAPACK's divide-and-conquer symmetric eigensolver (in OpenBLAS), as numpy.linalg.eigh uses.
std::vector<float> top_eigenvectors(const float* x, int n, int d, int rank) {
  std::vector<double> vals, vecs;
  symmetric_eigen(second_moment(x, n, d), d, vals, vecs);
  std::vector<int> order(static_cast<size_t>(d));
  std::iota(order.begin(), order.end(), 0);  // already descending
  return take_columns(vecs, d, rank, order);
}

}  // namespace

namespace {

template <typename Eigen>
LowRankBasis basis_of(const float* k, const float* v, int n, int d, int rank, Eigen top) {
  if (rank < 0 || rank > d) fail("pca_basis: rank {} outside [0, {}]", rank, d);
  if (n <= 0) fail("pca_basis: no rows");
  LowRankBasis b;
  b.head_dim = d;
  b.rank = rank;
  b.k = top(k, n, d, rank);
  b.v = top(v, n, d, rank);
  return b;
}

}  // namespace

LowRankBasis pca_basis(const float* k, const float* v, int n, int d, int rank) {
  return basis_of(k, v, n, d, rank, top_eigenvectors);
}

LowRankBasis pca_basis_ref(const float* k, const float* v, int n, int d, int rank) {
  return basis_of(k, v, n, d, rank, top_eigenvectors_ref);
}

bool LowRankSegment::device_form(DeviceUploader& up, cuda::DecodeSegment& d) const {
  if (!basis_->v_mean.empty()) return false;  // the device kernel reads uncentred values
  d.kind = rope_ ? cuda::kLowRankPreRope : cuda::kLowRank;
  if (rope_) up.check_rope(*rope_);
  d.pos = up.upload(positions());
  d.k = up.upload(ck_);
  d.v = up.upload(cv_);
  d.basis_k = up.upload_shared(basis_->k);
  d.basis_v = up.upload_shared(basis_->v);
  d.rk = rk_;
  d.rv = rv_;
  d.R = basis_->rank;
  return true;
}

}  // namespace kvb
