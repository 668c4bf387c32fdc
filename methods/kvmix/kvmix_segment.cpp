#include "methods/kvmix/kvmix_segment.hpp"

#include <fmt/format.h>

#include <algorithm>
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

KvmixSegment::KvmixSegment(int head_dim, const KvmixLayout& layout, KvDtype dtype)
    : d_(head_dim),
      layout_(layout),
      keys_(head_dim, layout.k_bits, layout.k_group),
      values_(head_dim, layout.v_bits, layout.v_group),
      kf_(head_dim, dtype),
      vf_(head_dim, dtype) {
  if (!(layout.k_rpc >= 0 && layout.k_rpc <= 1) || !(layout.v_rpc >= 0 && layout.v_rpc <= 1))
    fail("KVmix: recent-context ratios must lie in [0, 1], got {} (keys) and {} (values)", layout.k_rpc, layout.v_rpc);
  if (layout.v_move <= 0) fail("KVmix: values move in multiples of a positive token count, got {}", layout.v_move);
  if (layout.residual < 0 || layout.residual % layout.k_group != 0)
    fail("KIVI: the residual length {} must be a multiple of the key group {} (keys are quantized in whole groups)",
         layout.residual, layout.k_group);
}

std::string KvmixSegment::format() const {
  return layout_.residual ? fmt::format("kivi(k{},v{},r{})", layout_.k_bits, layout_.v_bits, layout_.residual)
                          : fmt::format("kvmix(k{},v{})", layout_.k_bits, layout_.v_bits);
}

size_t KvmixSegment::bytes() const { return keys_.bytes() + values_.bytes() + kf_.bytes() + vf_.bytes(); }

void KvmixSegment::append(const float* k, const float* v, int n, const int32_t* pos, size_t stride) {
  kf_.append(k, size_t(n), stride);
  vf_.append(v, size_t(n), stride);
  pos_.insert(pos_.end(), pos, pos + n);
  settle();
}

bool KvmixSegment::append_token(const float* k, const float* v, int32_t pos) {
  if (layout_.residual == 0) {
    append(k, v, 1, &pos, size_t(d_));
    return true;
  }
  settle();
  kf_.append(k, 1, size_t(d_));
  vf_.append(v, 1, size_t(d_));
  pos_.push_back(pos);
  return true;
}

void KvmixSegment::settle() {
  // The oldest tokens leave each buffer as they are stored there (rounded to the cache's dtype).
  std::vector<float> rows;
  const size_t R = size_t(layout_.residual);
  const size_t mk = R ? k_buffer() / R * R : to_move(k_buffer(), layout_.k_rpc, layout_.k_group);
  if (mk) {
    rows.resize(mk * d_);
    kf_.read(0, mk, rows.data());
    keys_.append(rows.data(), static_cast<int>(mk), size_t(d_));
    kf_.erase(0, mk);
  }
  const size_t mv = R ? (v_buffer() > R ? v_buffer() - R : 0) : to_move(v_buffer(), layout_.v_rpc, layout_.v_move);
  if (mv) {
    rows.resize(mv * d_);
    vf_.read(0, mv, rows.data());
    values_.append(rows.data(), static_cast<int>(mv), size_t(d_));
    vf_.erase(0, mv);
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
  kf_.dot(q, scores + nq);
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
  vf_.axpy(p + nq, acc);
}

// The store and the buffer each read once for the group, straight into the rows of scores and weights.
void KvmixSegment::logits_group(const float* q, int g, int d, float* scores) const {
  if (!layout_.fused) return Segment::logits_group(q, g, d, scores);
  logits_part(q, g, d, 0, size(), scores, size());
}

void KvmixSegment::accumulate_group(const float* p, int g, int d, float* acc) const {
  if (!layout_.fused) return Segment::accumulate_group(p, g, d, acc);
  accumulate_part(p, g, d, 0, d, acc);
}

std::vector<size_t> KvmixSegment::token_cuts(int parts) const {
  if (!layout_.fused) return {0, size()};
  return grouped_token_cuts(keys_.size(), size(), size_t(layout_.k_group), parts);
}

std::vector<size_t> KvmixSegment::channel_cuts(int parts, int d) const {
  if (!layout_.fused) return {0, size_t(d)};
  return grouped_channel_cuts(d, parts, size_t(layout_.v_group), vf_);
}

void KvmixSegment::logits_part(const float* q, int g, int d, size_t t0, size_t t1, float* scores, size_t ld) const {
  if (!layout_.fused) return Segment::logits_part(q, g, d, t0, t1, scores, ld);
  const size_t nq = keys_.size(), end = std::min(t1, nq);
  if (t0 < end) keys_.logits(q, t0, end, scores + t0, g, ld);
  if (t1 > nq) kf_.dot(q, std::max(t0, nq) - nq, t1 - nq, scores + std::max(t0, nq), g, ld);
}

void KvmixSegment::accumulate_part(const float* p, int g, int d, int c0, int c1, float* acc) const {
  if (!layout_.fused) return Segment::accumulate_part(p, g, d, c0, c1, acc);
  const size_t n = size(), nq = values_.size();
  values_.accumulate(p, c0, c1, acc, g, n);
  vf_.axpy(p + nq, c0, c1, acc, g, n);
}

void KvmixSegment::reconstruct(std::vector<float>& k, std::vector<float>& v) const {
  k.assign(size() * d_, 0.0f);
  v.assign(size() * d_, 0.0f);
  keys_.reconstruct(k.data());
  values_.reconstruct(v.data());
  kf_.read(0, k_buffer(), k.data() + keys_.size() * d_);
  vf_.read(0, v_buffer(), v.data() + values_.size() * d_);
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
