#include "harness/cache/layer_cache.hpp"

#include <omp.h>
#include <algorithm>
#include <atomic>
#include <cmath>
#include <limits>
#include <numeric>

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

std::vector<size_t> even_cuts(size_t n, int parts, size_t grain) {
  std::vector<size_t> cuts{0};
  for (int k = 1; k < parts && grain > 0; ++k) {
    const size_t at = (n * size_t(k) / size_t(parts) + grain / 2) / grain * grain;
    if (at > cuts.back() && at < n) cuts.push_back(at);
  }
  cuts.push_back(n);
  return cuts;
}

std::vector<size_t> grouped_token_cuts(size_t grouped, size_t total, size_t group, int parts) {
  std::vector<size_t> cuts = even_cuts(grouped / group, parts, 1);
  for (size_t& c : cuts) c *= group;
  cuts.back() = total;
  return cuts;
}

std::vector<size_t> grouped_channel_cuts(int d, int parts, size_t channel_group, const RowStore& buffer) {
  const size_t rows = buffer.channel_grain();
  const size_t grain = buffer.rows() == 0 ? channel_group : rows == 0 ? 0 : std::lcm(channel_group, rows);
  return even_cuts(size_t(d), parts, grain);
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

namespace {

// By type, not by format(): a format's name is a string built per call, twice per head and token on
// the decode path.
bool dense(const Segment& s) { return dynamic_cast<const DenseSegment*>(&s) != nullptr; }

}  // namespace

DenseSegment& LayerCache::tail(int head) {
  auto& segs = heads_[head];
  if (segs.empty() || !dense(*segs.back())) segs.push_back(std::make_unique<DenseSegment>(d_, dtype_));
  return static_cast<DenseSegment&>(*segs.back());
}

void LayerCache::append(const float* k, const float* v, int32_t pos) {
  for (int h = 0; h < n_cache_heads(); ++h) {
    const float* kh = k + size_t(h) * d_;
    const float* vh = v + size_t(h) * d_;
    auto& segs = heads_[h];
    if (!segs.empty() && !dense(*segs.back()) && segs.back()->append_token(kh, vh, pos)) {
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

void Segment::logits_part(const float* q, int g, int d, size_t t0, size_t t1, float* scores, size_t ld) const {
  if (t0 != 0 || t1 != size() || ld != size()) fail("internal: {} segments are not cut into runs of tokens", format());
  logits_group(q, g, d, scores);
}

void Segment::accumulate_part(const float* p, int g, int d, int c0, int c1, float* acc) const {
  if (c0 != 0 || c1 != d) fail("internal: {} segments are not cut into runs of channels", format());
  accumulate_group(p, g, d, acc);
}

namespace {

// Attention when the batch's cache heads do not divide among the threads (the default model's three KV
// heads on two cores): the heads left over are cut, the logits of each segment into runs of tokens and
// the values into runs of channels (Segment::token_cuts, channel_cuts), so that all threads share them.
// Three phases: the logits of every run; each query head's softmax over its segments in order; each
// run of channels rescaled and accumulated segment by segment. Every number is computed by the same
// operations in the same order as in a head read whole (attend_batch's other path), so the outputs
// are equal bit for bit, whatever the number of threads.
void attend_spread(std::span<const LayerCache* const> caches, const float* q, float* out, int threads) {
  const LayerCache& first = *caches[0];
  const int d = first.head_dim(), heads = first.n_cache_heads(), hq = first.n_query_heads(), g = hq / heads;
  const auto units = static_cast<int>(caches.size()) * heads;  // (sequence, cache head)
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  struct Run {
    int unit, seg;
    size_t a, b;  // tokens [a, b) of the segment's logits, or channels [a, b) of a unit's values
  };
  // Per segment (numbered unit by unit, a unit's from first_segment[unit]): the offset of its scores
  // [g, n] and, from its number * g, its softmax rescaling factors [g]. The plan is kept from call to
  // call with its buffers (thirty layers a step), one per calling thread.
  static thread_local std::vector<size_t> offset, first_segment, channels;
  static thread_local std::vector<Run> logit_runs, value_runs;
  offset.clear();
  first_segment.resize(static_cast<size_t>(units));
  logit_runs.clear();
  value_runs.clear();
  size_t total = 0, segments = 0;
  // The first units - units % threads units are read whole, as many to each thread; only the rest are cut,
  // each into a part per thread.
  const int whole = units - units % threads;
  for (int u = 0; u < units; ++u) {
    const auto& segs = caches[size_t(u / heads)]->segments(u % heads);
    const int parts = u < whole ? 1 : threads;
    first_segment[size_t(u)] = segments;
    segments += segs.size();
    channels.assign({0, size_t(d)});
    for (size_t k = 0; k < segs.size(); ++k) {
      offset.push_back(total);
      total += size_t(g) * segs[k]->size();
      if (segs[k]->size() == 0) continue;
      if (parts == 1) {
        logit_runs.push_back({u, static_cast<int>(k), 0, segs[k]->size()});
        continue;
      }
      const std::vector<size_t> cuts = segs[k]->token_cuts(parts);
      for (size_t i = 0; i + 1 < cuts.size(); ++i) logit_runs.push_back({u, static_cast<int>(k), cuts[i], cuts[i + 1]});
      // Channels are cut only where every segment of the head cuts them alike (each channel's segments in order).
      const std::vector<size_t> c = segs[k]->channel_cuts(parts, d);
      if (k == 0 || c == channels)
        channels = c;
      else
        channels.assign({0, size_t(d)});
    }
    for (size_t i = 0; i + 1 < channels.size(); ++i) value_runs.push_back({u, -1, channels[i], channels[i + 1]});
  }
  static thread_local std::vector<float> scores_kept, rescale_kept, sums_kept;
  scores_kept.resize(std::max(scores_kept.size(), total));
  rescale_kept.resize(std::max(rescale_kept.size(), segments * size_t(g)));
  sums_kept.resize(std::max(sums_kept.size(), size_t(units) * g));
  // The region's threads reach the caller's thread_local objects through these pointers (a thread_local
  // named in the region is the executing thread's own).
  float *const scores = scores_kept.data(), *const rescale = rescale_kept.data(), *const sums = sums_kept.data();
  const size_t* const seg_offset = offset.data();
  const size_t* const seg_first = first_segment.data();
  const Run* const logit_list = logit_runs.data();
  const Run* const value_list = value_runs.data();
  const size_t logit_count = logit_runs.size(), value_count = value_runs.size();
#pragma omp parallel num_threads(threads)
  {
#pragma omp for schedule(dynamic, 1)
    for (size_t r = 0; r < logit_count; ++r) {
      const Run& run = logit_list[r];
      const LayerCache& cache = *caches[size_t(run.unit / heads)];
      const Segment& seg = *cache.segments(run.unit % heads)[size_t(run.seg)];
      const float* qh = q + size_t(run.unit / heads) * size_t(hq) * d + size_t(run.unit % heads) * g * d;
      seg.logits_part(qh, g, d, run.a, run.b, scores + seg_offset[seg_first[size_t(run.unit)] + size_t(run.seg)],
                      seg.size());
    }
#pragma omp for schedule(static)
    for (int row = 0; row < units * g; ++row) {
      const int u = row / g, j = row % g;
      const auto& segs = caches[size_t(u / heads)]->segments(u % heads);
      float m = -std::numeric_limits<float>::infinity(), l = 0.0f;
      for (size_t k = 0; k < segs.size(); ++k) {
        const size_t n = segs[k]->size();
        if (n == 0) continue;
        float* sj = scores + seg_offset[seg_first[size_t(u)] + k] + size_t(j) * n;
        const float m_new = std::max(m, max_of(sj, static_cast<int>(n)) * scale);  // see attend_batch
        const float r = std::exp(m - m_new);
        l = l * r + exp_shifted(sj, static_cast<int>(n), m_new, scale);
        rescale[(seg_first[size_t(u)] + k) * g + size_t(j)] = r;
        m = m_new;
      }
      sums[size_t(row)] = l;
    }
    static thread_local std::vector<float> acc_kept;
    acc_kept.resize(std::max(acc_kept.size(), size_t(g) * d));
    float* const acc = acc_kept.data();
    // nowait: the region's end is the barrier.
#pragma omp for schedule(dynamic, 1) nowait
    for (size_t r = 0; r < value_count; ++r) {
      const Run& run = value_list[r];
      const int u = run.unit, c0 = static_cast<int>(run.a), c1 = static_cast<int>(run.b);
      const auto& segs = caches[size_t(u / heads)]->segments(u % heads);
      for (int j = 0; j < g; ++j) std::fill(acc + j * d + c0, acc + j * d + c1, 0.0f);
      for (size_t k = 0; k < segs.size(); ++k) {
        if (segs[k]->size() == 0) continue;
        for (int j = 0; j < g; ++j) {
          const float rj = rescale[(seg_first[size_t(u)] + k) * g + size_t(j)];
          for (int c = c0; c < c1; ++c) acc[size_t(j) * d + c] *= rj;
        }
        segs[k]->accumulate_part(scores + seg_offset[seg_first[size_t(u)] + k], g, d, c0, c1, acc);
      }
      for (int j = 0; j < g; ++j) {
        const float l = sums[size_t(u) * g + size_t(j)];
        float* oh = out + size_t(u / heads) * size_t(hq) * d + (size_t(u % heads) * g + j) * d;
        for (int c = c0; c < c1; ++c) oh[c] = l == 0.0f ? 0.0f : acc[size_t(j) * d + c] / l;  // NaN stays NaN
      }
    }
  }
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
  bool same_shape = true;
  for (const LayerCache* c : caches) {
    if (c->n_query_heads() != hq || c->head_dim() != d) fail("attend_batch: the batch's sequences differ in shape");
    same_shape = same_shape && c->n_cache_heads() == heads;
  }
  // A batch mixing stored heads (one per query head beside one per KV head: gqa=repeat and native cells
  // of one sweep) attends one sequence at a time, each as a batch of one does.
  if (!same_shape) {
    for (size_t i = 0; i < caches.size(); ++i) {
      const size_t row = i * size_t(hq) * d;
      attend_batch({&caches[i], 1}, q + row, out + row);
    }
    return;
  }
  const int group = hq / heads;
  const auto batch = static_cast<int>(caches.size());
  const int threads = omp_get_max_threads();
  if (threads > 1 && batch * heads % threads != 0) return attend_spread(caches, q, out, threads);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  // One task per (sequence, cache head): its whole query group reads the head's segments once. Tasks are
  // independent (every sequence's heads in one region, so that a batch's threads share the work evenly);
  // BLAS calls inside the region run on the calling thread.
#pragma omp parallel
  {
    std::vector<float> scores, acc, m, l;
#pragma omp for schedule(static)
    for (int task = 0; task < batch * heads; ++task) {
      const LayerCache& cache = *caches[size_t(task / heads)];
      const size_t row = size_t(task / heads) * size_t(hq) * d;
      const int head = task % heads, h0 = head * group, g = group;
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
          // Scaled as they are exponentiated: rounding is monotonic, so the largest scaled logit is the
          // largest logit scaled (the same bits as scaling them all first).
          const float m_new = std::max(m[j], max_of(sj, static_cast<int>(n)) * scale);
          // Rescale what was accumulated under the old maximum, then add this segment's terms.
          const float r = std::exp(m[j] - m_new);
          l[j] = l[j] * r + exp_shifted(sj, static_cast<int>(n), m_new, scale);
          for (int c = 0; c < d; ++c) acc[size_t(j) * d + c] *= r;
          m[j] = m_new;
        }
        seg->accumulate_group(scores.data(), g, d, acc.data());
      }
      for (int j = 0; j < g; ++j) {
        float* oh = out + row + size_t(h0 + j) * d;
        for (int c = 0; c < d; ++c) oh[c] = l[j] == 0.0f ? 0.0f : acc[size_t(j) * d + c] / l[j];  // NaN stays NaN
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
