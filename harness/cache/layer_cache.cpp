#include "harness/cache/layer_cache.hpp"

#include <omp.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>

#include "harness/util/error.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/vec_math.hpp"

namespace kvb {

void RowStore::append(const float* x, size_t n, size_t stride) {
  const size_t at = data_.size();
  data_.resize(at + n * row_bytes());
  for (size_t t = 0; t < n; ++t) kv_encode(dtype_, x + t * stride, size_t(d_), data_.data() + at + t * row_bytes());
}

void RowStore::erase(size_t first, size_t n) {
  if (first + n > rows()) fail("internal: erasing rows {}..{} of {}", first, first + n, rows());
  const auto a = data_.begin() + static_cast<std::ptrdiff_t>(first * row_bytes());
  data_.erase(a, a + static_cast<std::ptrdiff_t>(n * row_bytes()));
}

void RowStore::read(size_t t0, size_t n, float* out) const {
  if (t0 + n > rows()) fail("internal: reading rows {}..{} of {}", t0, t0 + n, rows());
  kv_decode(dtype_, data_.data() + t0 * row_bytes(), n * size_t(d_), out);
}

void RowStore::store_as(KvDtype t) {
  if (t == dtype_) return;
  std::vector<float> x(rows() * size_t(d_));
  read(0, rows(), x.data());
  dtype_ = t;
  data_.assign(x.size() * kv_dtype_bytes(t), 0);
  kv_encode(t, x.data(), x.size(), data_.data());
}

void DenseSegment::append(const float* k, const float* v, int32_t pos) {
  k_.append(k);
  v_.append(v);
  pos_.push_back(pos);
}

void DenseSegment::append_rows(const float* k, const float* v, size_t n, size_t stride, const int32_t* pos) {
  k_.append(k, n, stride);
  v_.append(v, n, stride);
  pos_.insert(pos_.end(), pos, pos + n);
}

void DenseSegment::erase(size_t index) {
  if (index >= pos_.size()) fail("DenseSegment::erase: index {} of {} tokens", index, pos_.size());
  k_.erase(index, 1);
  v_.erase(index, 1);
  pos_.erase(pos_.begin() + static_cast<std::ptrdiff_t>(index));
}

void DenseSegment::reserve(size_t tokens) {
  k_.reserve(tokens);
  v_.reserve(tokens);
  pos_.reserve(tokens);
}

void DenseSegment::read(size_t t0, size_t n, float* k, float* v) const {
  if (k) k_.read(t0, n, k);
  if (v) v_.read(t0, n, v);
}

const float* DenseSegment::k() const {
  if (dtype() != KvDtype::F32) fail("internal: DenseSegment::k() on {} rows; use read()", kv_dtype_name(dtype()));
  return static_cast<const float*>(k_.data());
}

const float* DenseSegment::v() const {
  if (dtype() != KvDtype::F32) fail("internal: DenseSegment::v() on {} rows; use read()", kv_dtype_name(dtype()));
  return static_cast<const float*>(v_.data());
}

void LayerCache::touch() {
  static std::atomic<uint64_t> counter{0};
  epoch_ = ++counter;
}

LayerCache::LayerCache(int n_query_heads, int n_cache_heads, int head_dim, KvDtype dtype)
    : n_q_(n_query_heads), d_(head_dim), dtype_(dtype), heads_(n_cache_heads) {
  touch();
  if (n_cache_heads <= 0 || n_query_heads % n_cache_heads != 0)
    fail("LayerCache: {} query heads cannot share {} cache heads", n_query_heads, n_cache_heads);
}

DenseSegment& LayerCache::tail(int head) {
  auto& segs = heads_[head];
  if (segs.empty() || segs.back()->format() != "dense") segs.push_back(std::make_unique<DenseSegment>(d_, dtype_));
  return static_cast<DenseSegment&>(*segs.back());
}

void LayerCache::append(const float* k, const float* v, int32_t pos) {
  for (int h = 0; h < n_cache_heads(); ++h) {
    const float* kh = k + size_t(h) * d_;
    const float* vh = v + size_t(h) * d_;
    auto& segs = heads_[h];
    if (!segs.empty() && segs.back()->format() != "dense" && segs.back()->append_token(kh, vh, pos)) {
      touch();  // a store that restructures itself as it takes tokens, not a dense tail
      continue;
    }
    tail(h).append(kh, vh, pos);
  }
}

void LayerCache::append_many(const float* k, const float* v, int n, const int32_t* pos) {
  touch();
  const int hc = n_cache_heads();
  // A long prompt's cache is hundreds of MB per layer on the host: heads are filled in parallel
  // (each touches only its own segments).
#pragma omp parallel for schedule(static) if (size_t(n) * hc * d_ > (size_t(1) << 20))
  for (int h = 0; h < hc; ++h)
    tail(h).append_rows(k + size_t(h) * d_, v + size_t(h) * d_, size_t(n), size_t(hc) * d_, pos);
}

void LayerCache::store_as(KvDtype t) {
  touch();
  dtype_ = t;
  for (auto& segs : heads_)
    for (auto& s : segs) s->store_as(t);
}

size_t LayerCache::tokens(int head) const {
  size_t n = 0;
  for (const auto& s : heads_[head]) n += s->size();
  return n;
}

size_t LayerCache::bytes() const {
  size_t b = 0;
  for (const auto& segs : heads_)
    for (const auto& s : segs) b += s->bytes();
  return b;
}

void LayerCache::clear() {
  touch();
  for (auto& segs : heads_) segs.clear();
}

void Segment::logits_group(const float* q, int g, int d, float* scores) const {
  for (int j = 0; j < g; ++j) logits(q + size_t(j) * d, scores + size_t(j) * size());
}

void Segment::accumulate_group(const float* p, int g, int d, float* acc) const {
  for (int j = 0; j < g; ++j) accumulate(p + size_t(j) * size(), acc + size_t(j) * d);
}

namespace {

// How many parts each cache head's group of query heads is attended in: a whole group reads the head's
// segments once, so groups are cut only as far as it takes to give every thread a task. Measured on the
// default model (3 KV heads of 3 query heads, 2 threads, 8K tokens): whole groups, though one thread
// gets two, decode KVmix's codes 1.15x faster than halves, at 0.92x for the fp16 full cache.
int parts_per_head(int cache_heads, int group, int threads) {
  int s = 1;
  while (s < group && cache_heads * s < threads) ++s;
  return s;
}

}  // namespace

void attend(const LayerCache& cache, const float* q, float* out) {
  const LayerCache* one = &cache;
  attend_batch({&one, 1}, q, out);
}

void attend_batch(std::span<const LayerCache* const> caches, const float* q, float* out) {
  if (caches.empty()) return;
  const LayerCache& first = *caches[0];
  const int d = first.head_dim(), heads = first.n_cache_heads(), hq = first.n_query_heads();
  for (const LayerCache* c : caches)
    if (c->head_dim() != d || c->n_cache_heads() != heads || c->n_query_heads() != hq)
      fail("attend_batch: the batch's caches differ in shape");
  const int group = hq / heads;
  const auto batch = static_cast<int>(caches.size());
  const int parts = parts_per_head(batch * heads, group, omp_get_max_threads());
  const int tasks_per_seq = heads * parts;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // Tasks are independent (every sequence's heads in one region, so that a batch's threads share the
  // work evenly); BLAS calls inside the region run on the calling thread.
#pragma omp parallel
  {
    std::vector<float> scores, acc, m, l;
#pragma omp for schedule(static)
    for (int task = 0; task < batch * tasks_per_seq; ++task) {
      const LayerCache& cache = *caches[size_t(task / tasks_per_seq)];
      const size_t row = size_t(task / tasks_per_seq) * size_t(hq) * d;
      const int head = task % tasks_per_seq / parts, part = task % parts;
      // Query heads [h0, h1) of this cache head's group.
      const int h0 = head * group + part * group / parts, h1 = head * group + (part + 1) * group / parts;
      const int g = h1 - h0;
      m.assign(size_t(g), -std::numeric_limits<float>::infinity());
      l.assign(size_t(g), 0.0f);
      acc.assign(size_t(g) * d, 0.0f);
      for (const auto& seg : cache.segments(head)) {
        const size_t n = seg->size();
        if (n == 0) continue;
        scores.resize(size_t(g) * n);
        seg->logits_group(q + row + size_t(h0) * d, g, d, scores.data());
        for (int j = 0; j < g; ++j) {
          float* sj = scores.data() + size_t(j) * n;
          for (size_t t = 0; t < n; ++t) sj[t] *= scale;
          const float m_new = std::max(m[j], max_of(sj, static_cast<int>(n)));
          // Rescale what was accumulated under the old maximum, then add this segment's terms.
          const float r = std::exp(m[j] - m_new);
          l[j] = l[j] * r + exp_shifted(sj, static_cast<int>(n), m_new);
          for (int c = 0; c < d; ++c) acc[size_t(j) * d + c] *= r;
          m[j] = m_new;
        }
        seg->accumulate_group(scores.data(), g, d, acc.data());
      }
      for (int j = 0; j < g; ++j) {
        float* oh = out + row + size_t(h0 + j) * d;
        for (int c = 0; c < d; ++c) oh[c] = l[j] > 0 ? acc[size_t(j) * d + c] / l[j] : 0.0f;
      }
    }
  }
}

void attend_ref(const LayerCache& cache, const float* q, float* out) {
  const int d = cache.head_dim();
  const double scale = 1.0 / std::sqrt(static_cast<double>(d));
  for (int h = 0; h < cache.n_query_heads(); ++h) {
    const float* qh = q + size_t(h) * d;
    std::vector<double> s;
    std::vector<std::pair<const Segment*, size_t>> where;
    for (const auto& seg : cache.segments(cache.cache_head_of(h))) {
      std::vector<float> part(seg->size());
      seg->logits(qh, part.data());
      for (size_t t = 0; t < part.size(); ++t) {
        s.push_back(part[t] * scale);
        where.emplace_back(seg.get(), t);
      }
    }
    double m = -std::numeric_limits<double>::infinity(), sum = 0;
    for (double x : s) m = std::max(m, x);
    for (double& x : s) sum += (x = std::exp(x - m));
    float* oh = out + size_t(h) * d;
    std::fill(oh, oh + d, 0.0f);
    // Each segment reconstructs its own values through accumulate with a one-hot weight vector.
    std::vector<float> acc(d), onehot;
    std::vector<double> total(d, 0.0);
    for (size_t i = 0; i < s.size(); ++i) {
      const auto [seg, t] = where[i];
      onehot.assign(seg->size(), 0.0f);
      onehot[t] = 1.0f;
      std::fill(acc.begin(), acc.end(), 0.0f);
      seg->accumulate(onehot.data(), acc.data());
      for (int c = 0; c < d; ++c) total[c] += s[i] / sum * acc[c];
    }
    for (int c = 0; c < d; ++c) oh[c] = static_cast<float>(total[c]);
  }
}

std::vector<std::vector<int>> stored_key_dims(const LayerCache& cache, int n_tokens) {
  std::vector<std::vector<int>> out(cache.n_cache_heads(), std::vector<int>(n_tokens, 0));
  for (int h = 0; h < cache.n_cache_heads(); ++h)
    for (const auto& seg : cache.segments(h)) {
      const int dims = seg->key_dims(cache.head_dim());
      for (int32_t p : seg->positions())
        if (p >= 0 && p < n_tokens) out[h][p] = dims;
    }
  return out;
}

}  // namespace kvb
