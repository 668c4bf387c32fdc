#include "harness/cache/kvmix_segment.hpp"

#include <fmt/format.h>

#include <cmath>
#include <numeric>

#include "harness/util/error.hpp"

namespace kvb {

namespace {

// How many of a buffer of f tokens move to the quantized store: whole groups beyond floor(r f).
size_t to_move(size_t f, double r, int group) {
  const auto keep = static_cast<size_t>(std::floor(r * static_cast<double>(f)));
  return (f - keep) / size_t(group) * size_t(group);
}

}  // namespace

KvmixSegment::KvmixSegment(int head_dim, const KvmixLayout& layout)
    : d_(head_dim),
      layout_(layout),
      keys_(head_dim, layout.k_bits, layout.k_group),
      values_(head_dim, layout.v_bits, layout.v_group) {
  if (!(layout.k_rpc >= 0 && layout.k_rpc <= 1) || !(layout.v_rpc >= 0 && layout.v_rpc <= 1))
    fail("KVmix: recent-context ratios must lie in [0, 1], got {} (keys) and {} (values)", layout.k_rpc, layout.v_rpc);
  if (layout.v_move <= 0) fail("KVmix: values move in multiples of a positive token count, got {}", layout.v_move);
}

std::string KvmixSegment::format() const { return fmt::format("kvmix(k{},v{})", layout_.k_bits, layout_.v_bits); }

size_t KvmixSegment::bytes() const {
  return keys_.bytes() + values_.bytes() + (kf_.size() + vf_.size()) * sizeof(float);
}

void KvmixSegment::append(const float* k, const float* v, int n, const int32_t* pos, size_t stride) {
  for (int t = 0; t < n; ++t) {
    kf_.insert(kf_.end(), k + size_t(t) * stride, k + size_t(t) * stride + d_);
    vf_.insert(vf_.end(), v + size_t(t) * stride, v + size_t(t) * stride + d_);
  }
  pos_.insert(pos_.end(), pos, pos + n);
  settle();
}

bool KvmixSegment::append_token(const float* k, const float* v, int32_t pos) {
  append(k, v, 1, &pos, size_t(d_));
  return true;
}

void KvmixSegment::settle() {
  const size_t mk = to_move(k_buffer(), layout_.k_rpc, layout_.k_group);
  if (mk) {
    keys_.append(kf_.data(), static_cast<int>(mk), size_t(d_));
    kf_.erase(kf_.begin(), kf_.begin() + static_cast<std::ptrdiff_t>(mk * d_));
  }
  const size_t mv = to_move(v_buffer(), layout_.v_rpc, layout_.v_move);
  if (mv) {
    values_.append(vf_.data(), static_cast<int>(mv), size_t(d_));
    vf_.erase(vf_.begin(), vf_.begin() + static_cast<std::ptrdiff_t>(mv * d_));
  }
}

void KvmixSegment::logits(const float* q, float* scores) const {
  const size_t nq = keys_.size();
  if (layout_.fused) {
    keys_.logits(q, scores);
  } else {
    std::vector<float> k(nq * d_);
    keys_.reconstruct(k.data());
    for (size_t t = 0; t < nq; ++t) scores[t] = std::inner_product(q, q + d_, k.data() + t * d_, 0.0f);
  }
  for (size_t t = 0; t < k_buffer(); ++t)
    scores[nq + t] = std::inner_product(q, q + d_, kf_.data() + t * d_, 0.0f);
}

void KvmixSegment::accumulate(const float* p, float* acc) const {
  const size_t nq = values_.size();
  if (layout_.fused) {
    values_.accumulate(p, acc);
  } else {
    std::vector<float> v(nq * d_);
    values_.reconstruct(v.data());
    for (size_t t = 0; t < nq; ++t)
      for (int c = 0; c < d_; ++c) acc[c] += p[t] * v[t * d_ + c];
  }
  for (size_t t = 0; t < v_buffer(); ++t) {
    const float pt = p[nq + t];
    if (pt == 0.0f) continue;
    const float* row = vf_.data() + t * d_;
    for (int c = 0; c < d_; ++c) acc[c] += pt * row[c];
  }
}

void KvmixSegment::reconstruct(std::vector<float>& k, std::vector<float>& v) const {
  k.assign(size() * d_, 0.0f);
  v.assign(size() * d_, 0.0f);
  keys_.reconstruct(k.data());
  values_.reconstruct(v.data());
  std::copy(kf_.begin(), kf_.end(), k.begin() + static_cast<std::ptrdiff_t>(keys_.size() * d_));
  std::copy(vf_.begin(), vf_.end(), v.begin() + static_cast<std::ptrdiff_t>(values_.size() * d_));
}

std::vector<size_t> kvmix_buffer_sizes(size_t n, int steps, double r, int group) {
  std::vector<size_t> out;
  size_t f = n;
  for (int s = 0; s <= steps; ++s) {
    if (s > 0) ++f;
    f -= to_move(f, r, group);
    out.push_back(f);
  }
  return out;
}

}  // namespace kvb
