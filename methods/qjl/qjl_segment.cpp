#include "methods/qjl/qjl_segment.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <numbers>
#include <numeric>
#include <random>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/sign_dot.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace kvb {

QjlSketch::QjlSketch(int head_dim, int sketch, int outlier_sketch, std::vector<float> matrix)
    : d(head_dim), m(sketch), m_outlier(outlier_sketch), s(std::move(matrix)) {
  if (sketch <= 0 || sketch % 8 != 0 || outlier_sketch <= 0 || outlier_sketch % 8 != 0 || outlier_sketch > sketch)
    fail(
        "qjl: the sketch sizes must be positive multiples of 8 (whole bytes of signs) with the outliers' no longer "
        "than the keys', got {} and {}",
        sketch, outlier_sketch);
  if (s.size() != size_t(d) * size_t(m))
    fail("qjl: a sketch of {} x {} needs {} numbers, got {}", d, m, size_t(d) * size_t(m), s.size());
}

QjlSketch QjlSketch::random(int head_dim, int sketch, int outlier_sketch, uint64_t seed) {
  const size_t d = size_t(head_dim), m = size_t(sketch);
  // Box-Muller on a fixed engine, so the sketch is the same with every standard library.
  std::mt19937_64 rng(seed);
  const auto uniform = [&] { return double((rng() >> 11) + 1) * 0x1.0p-53; };  // (0, 1]
  std::vector<double> g(d * m);
  for (size_t i = 0; i < g.size(); i += 2) {
    const double r = std::sqrt(-2 * std::log(uniform())), a = 2 * std::numbers::pi * uniform();
    g[i] = r * std::cos(a);
    if (i + 1 < g.size()) g[i + 1] = r * std::sin(a);
  }
  // Modified Gram-Schmidt, twice, over each block of d columns: its Q factor with a positive R diagonal.
  std::vector<float> s(d * m);
  const double scale = std::sqrt(double(d));
  for (size_t b0 = 0; b0 < m; b0 += d)
    for (size_t j = b0; j < std::min(m, b0 + d); ++j) {
      for (int pass = 0; pass < 2; ++pass)
        for (size_t i = b0; i < j; ++i) {
          double dot = 0;
          for (size_t c = 0; c < d; ++c) dot += g[c * m + i] * g[c * m + j];
          for (size_t c = 0; c < d; ++c) g[c * m + j] -= dot * g[c * m + i];
        }
      double norm = 0;
      for (size_t c = 0; c < d; ++c) norm += g[c * m + j] * g[c * m + j];
      norm = std::sqrt(norm);
      for (size_t c = 0; c < d; ++c) g[c * m + j] /= norm;
      for (size_t c = 0; c < d; ++c) s[c * m + j] = float(g[c * m + j] * scale);
    }
  return QjlSketch(head_dim, sketch, outlier_sketch, std::move(s));
}

QjlKeys::QjlKeys(std::shared_ptr<const QjlSketch> sketch, int outliers, int group)
    : sk_(std::move(sketch)),
      outliers_(outliers),
      group_(group),
      bytes_(sk_->m / 8),
      outlier_bytes_(sk_->m_outlier / 8) {
  if (outliers < 1 || outliers >= sk_->d || outliers > 255)
    fail("qjl: {} outlier channels of a head of {} (at least one, fewer than the head's, at most 255)", outliers,
         sk_->d);
  if (sk_->d > 256) fail("qjl: outlier channels are stored as bytes, so head_dim must be at most 256, got {}", sk_->d);
  if (group < 1) fail("qjl: key groups need at least one token, got {}", group);
}

size_t QjlKeys::bytes() const {
  return codes_.size() + outlier_codes_.size() + outlier_index_.size() +
         (norms_.size() + outlier_norms_.size()) * sizeof(uint16_t);
}

std::span<const uint8_t> QjlKeys::codes(size_t t) const { return {codes_.data() + t * size_t(bytes_), size_t(bytes_)}; }
std::span<const uint8_t> QjlKeys::outlier_codes(size_t t) const {
  return {outlier_codes_.data() + t * size_t(outlier_bytes_), size_t(outlier_bytes_)};
}
std::span<const uint8_t> QjlKeys::outliers(size_t g) const {
  return {outlier_index_.data() + g * size_t(outliers_), size_t(outliers_)};
}
float QjlKeys::norm(size_t t) const { return half_to_float(norms_[t]); }
float QjlKeys::outlier_norm(size_t t) const { return half_to_float(outlier_norms_[t]); }

void QjlKeys::append(const float* k, int n, size_t stride) {
  if (n % group_ != 0) fail("qjl: {} tokens is not a whole number of {}-token key groups", n, group_);
  const int d = sk_->d, m = sk_->m, mo = sk_->m_outlier;
  const float* S = sk_->s.data();
  std::vector<double> channel_norm(size_t(d), 0.0);
  std::vector<int> order(static_cast<size_t>(d));
  std::vector<uint8_t> is_outlier(static_cast<size_t>(d));
  std::vector<float> in(static_cast<size_t>(m)), out(static_cast<size_t>(mo));
  for (int g0 = 0; g0 < n; g0 += group_) {
    std::fill(channel_norm.begin(), channel_norm.end(), 0.0);
    for (int t = g0; t < g0 + group_; ++t)
      for (int c = 0; c < d; ++c)
        channel_norm[size_t(c)] += double(k[size_t(t) * stride + size_t(c)]) * k[size_t(t) * stride + size_t(c)];
    std::iota(order.begin(), order.end(), 0);
    std::stable_sort(order.begin(), order.end(),
                     [&](int a, int b) { return channel_norm[size_t(a)] > channel_norm[size_t(b)]; });
    std::fill(is_outlier.begin(), is_outlier.end(), uint8_t(0));
    for (int i = 0; i < outliers_; ++i) {
      outlier_index_.push_back(uint8_t(order[size_t(i)]));
      is_outlier[size_t(order[size_t(i)])] = 1;
    }
    for (int t = g0; t < g0 + group_; ++t) {
      const float* x = k + size_t(t) * stride;
      // Channel by channel into every projection, as QJL's kernel sums them (in float, in channel order).
      std::fill(in.begin(), in.end(), 0.0f);
      std::fill(out.begin(), out.end(), 0.0f);
      double sq = 0, sq_out = 0;
      for (int c = 0; c < d; ++c) {
        const float xc = x[c];
        const float* row = S + size_t(c) * size_t(m);
        sq += double(xc) * xc;
        if (is_outlier[size_t(c)]) {
          sq_out += double(xc) * xc;
          for (int j = 0; j < mo; ++j) out[size_t(j)] += row[j] * xc;
        } else {
          for (int j = 0; j < m; ++j) in[size_t(j)] += row[j] * xc;
        }
      }
      for (const auto& [proj, len, dst] : {std::tuple{&in, m, &codes_}, std::tuple{&out, mo, &outlier_codes_}})
        for (int b = 0; b < len / 8; ++b) {
          uint8_t byte = 0;
          for (int j = 0; j < 8; ++j) byte |= uint8_t(((*proj)[size_t(8 * b + j)] > 0.0f) << j);
          dst->push_back(byte);
        }
      norms_.push_back(float_to_half(float(std::sqrt(sq))));
      outlier_norms_.push_back(float_to_half(float(std::sqrt(sq_out))));
    }
  }
}

namespace {

// A query's sketch qs split over a key group's outlier channels: qo = sum over them (in order) of
// q[c] S[c, :], qi = qs - qo. Each element is a chain of its own, so the loops vectorise (once per vector
// width) with the scalar loop's numbers.
KVB_VECTOR_CLONES void split_sketch(const float* S, size_t M, std::span<const uint8_t> outliers, const float* q,
                                    const float* qs, float* qo, float* qi) {
  for (size_t i = 0; i < M; ++i) qo[i] = 0.0f;
  for (const uint8_t c : outliers) {
    const float qc = q[c];
    const float* row = S + size_t(c) * M;
    for (size_t i = 0; i < M; ++i) qo[i] += qc * row[i];
  }
  for (size_t i = 0; i < M; ++i) qi[i] = qs[i] - qo[i];
}

}  // namespace

void QjlKeys::logits(const float* q, int g, size_t t0, size_t t1, float* scores, size_t ldo) const {
  const int d = sk_->d, m = sk_->m, mo = sk_->m_outlier;
  const size_t M = size_t(m), T = size_t(group_);
  const float* S = sk_->s.data();
  // Per query: its sketch qs, and per group the part over the group's outlier channels (qo) and the rest
  // (qi); [query][m].
  std::vector<float> qs(size_t(g) * M, 0.0f), qo(size_t(g) * M), qi(size_t(g) * M), in(size_t(g) * T),
      out(size_t(g) * T), n_in(T), n_out(T);
  for (int j = 0; j < g; ++j)
    for (int c = 0; c < d; ++c)
      for (size_t i = 0; i < M; ++i) qs[size_t(j) * M + i] += q[size_t(j) * d + size_t(c)] * S[size_t(c) * M + i];
  const float scale = std::sqrt(std::numbers::pi_v<float> / 2) / float(m),
              scale_out = std::sqrt(std::numbers::pi_v<float> / 2) / float(mo);
  for (size_t gi = t0 / T; gi < t1 / T; ++gi) {
    // Each query's sketch split as the group's keys are: over its outlier channels and over the rest.
    for (int j = 0; j < g; ++j)
      split_sketch(S, M, outliers(gi), q + size_t(j) * d, qs.data() + size_t(j) * M, qo.data() + size_t(j) * M,
                   qi.data() + size_t(j) * M);
    const size_t first = gi * T;
    sign_dots_group(codes_.data() + first * size_t(bytes_), T, size_t(bytes_), qi.data(), M, g, m, in.data(), T);
    sign_dots_group(outlier_codes_.data() + first * size_t(outlier_bytes_), T, size_t(outlier_bytes_), qo.data(), M, g,
                    mo, out.data(), T);
    for (size_t i = 0; i < T; ++i) {
      const float n = norm(first + i), no = outlier_norm(first + i);
      // The kernel takes sqrt(|k|^2 - |k_out|^2) of the fp16 norms; clamped where fp16 rounding makes it negative.
      n_in[i] = std::sqrt(std::max(0.0f, n * n - no * no));
      n_out[i] = no;
    }
    for (int j = 0; j < g; ++j)
      for (size_t i = 0; i < T; ++i)
        scores[size_t(j) * ldo + first + i] =
            scale * n_in[i] * in[size_t(j) * T + i] + scale_out * n_out[i] * out[size_t(j) * T + i];
  }
}

QjlSegment::QjlSegment(int head_dim, std::shared_ptr<const QjlSketch> sketch, const QjlLayout& layout, KvDtype dtype)
    : d_(head_dim),
      layout_(layout),
      keys_(std::move(sketch), layout.outliers, layout.group),
      values_(head_dim, layout.value_bits, layout.group),
      kf_(head_dim, dtype),
      vf_(head_dim, dtype) {
  if (layout.buffer < layout.group || layout.buffer % layout.group != 0)
    fail(
        "qjl: the buffer of {} tokens must be a whole number of {}-token key groups (keys are sketched in whole "
        "groups)",
        layout.buffer, layout.group);
}

std::string QjlSegment::format() const {
  return fmt::format("qjl(m{},o{},v{})", keys_.sketch().m, keys_.sketch().m_outlier, layout_.value_bits);
}

size_t QjlSegment::bytes() const { return keys_.bytes() + values_.bytes() + kf_.bytes() + vf_.bytes(); }

void QjlSegment::sketch_full_buffer() {
  const size_t n = k_buffer() / size_t(layout_.buffer) * size_t(layout_.buffer);
  if (!n) return;
  // Sketched from what the buffer held (rounded to the cache's dtype), as QJL sketches its fp16 keys.
  std::vector<float> rows(n * size_t(d_));
  kf_.read(0, n, rows.data());
  keys_.append(rows.data(), int(n), size_t(d_));
  kf_.erase(0, n);
}

void QjlSegment::quantize_old_values() {
  const size_t buf = v_buffer(), keep = size_t(layout_.buffer);
  if (buf <= keep) return;
  std::vector<float> rows((buf - keep) * size_t(d_));
  vf_.read(0, buf - keep, rows.data());
  values_.append(rows.data(), int(buf - keep), size_t(d_));
  vf_.erase(0, buf - keep);
}

void QjlSegment::append(const float* k, const float* v, int n, const int32_t* pos, size_t stride) {
  kf_.append(k, size_t(n), stride);
  vf_.append(v, size_t(n), stride);
  pos_.insert(pos_.end(), pos, pos + n);
  sketch_full_buffer();
  quantize_old_values();
}

bool QjlSegment::append_token(const float* k, const float* v, int32_t pos) {
  quantize_old_values();  // the previous step's value leaves the buffer after that step's attention
  kf_.append(k, 1, size_t(d_));
  vf_.append(v, 1, size_t(d_));
  pos_.push_back(pos);
  sketch_full_buffer();
  return true;
}

std::vector<size_t> QjlSegment::token_cuts(int parts) const {
  return grouped_token_cuts(keys_.size(), size(), size_t(layout_.group), parts);
}

std::vector<size_t> QjlSegment::channel_cuts(int parts, int d) const {
  return grouped_channel_cuts(d, parts, size_t(layout_.group), vf_);
}

void QjlSegment::logits_part(const float* q, int g, int, size_t t0, size_t t1, float* scores, size_t ld) const {
  const size_t nq = keys_.size(), end = std::min(t1, nq);
  if (t0 < end) keys_.logits(q, g, t0, end, scores, ld);
  if (t1 > nq) kf_.dot(q, std::max(t0, nq) - nq, t1 - nq, scores + std::max(t0, nq), g, ld);
}

void QjlSegment::accumulate_part(const float* p, int g, int, int c0, int c1, float* acc) const {
  values_.accumulate(p, c0, c1, acc, g, size());
  vf_.axpy(p + values_.size(), c0, c1, acc, g, size());
}

}  // namespace kvb
