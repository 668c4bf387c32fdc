#include "harness/engine/cuda/device_caches.hpp"

#include <algorithm>
#include <cstring>

#include "harness/cache/device_form.hpp"
#include "harness/cache/layer_cache.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb::cuda {

// What a segment's device_form uploads through: arrays kept by its mirror, shared data (bases,
// estimator matrices) once per rebuild, by host address.
class DeviceCaches::Uploader final : public DeviceUploader {
 public:
  Uploader(const DeviceCaches& owner, CacheMirror& m, SegmentMirror& sm) : owner_(owner), m_(m), sm_(sm) {}
  const float* upload(std::span<const float> x) override { return put(x); }
  const int32_t* upload(std::span<const int32_t> x) override { return put(x); }
  const uint32_t* upload(std::span<const uint32_t> x) override { return put(x); }
  const uint16_t* upload(std::span<const uint16_t> x) override { return put(x); }
  const float* upload_shared(std::span<const float> x) override {
    auto it = m_.shared.find(x.data());
    if (it == m_.shared.end()) it = m_.shared.emplace(x.data(), to_device(x, owner_.stream_)).first;
    return it->second.as<float>();
  }
  void check_rope(const RopeTable& r) override { owner_.check_rope(r); }

 private:
  template <typename T>
  const T* put(std::span<const T> x) {
    sm_.arrays.push_back(to_device(x, owner_.stream_));
    return sm_.arrays.back().template as<T>();
  }
  const DeviceCaches& owner_;
  CacheMirror& m_;
  SegmentMirror& sm_;
};

void DeviceCaches::set_rope(std::vector<float> inv_freq, const float* device_inv_freq, bool interleaved) {
  inv_freq_host_ = std::move(inv_freq);
  inv_freq_ = device_inv_freq;
  interleaved_ = interleaved;
}

void DeviceCaches::check_rope(const RopeTable& r) const {
  if (std::vector<float>(r.inv_freq().begin(), r.inv_freq().end()) != inv_freq_host_ ||
      (r.style() == RopeStyle::Interleaved) != interleaved_)
    fail("CUDA decode: a segment's RoPE table differs from the model's");
}

bool DeviceCaches::append(const LayerCache& cache, const float* k, const float* v, int n_kv_heads) {
  auto it = mirrors_.find(&cache);
  if (it == mirrors_.end()) return false;
  CacheMirror& m = it->second;
  m.pending = false;
  const int hc = cache.n_cache_heads(), d = cache.head_dim();
  if (m.epoch != cache.epoch() || static_cast<int>(m.heads.size()) != hc) return false;
  for (int h = 0; h < hc; ++h) {
    const auto& segs = cache.segments(h);
    const auto& mh = m.heads[h];
    if (segs.empty() || segs.size() != mh.size() || mh.back().desc.kind != kDense) return false;
    for (size_t i = 0; i < segs.size(); ++i)
      if (mh[i].seg != segs[i].get() || segs[i]->size() != mh[i].uploaded) return false;
  }
  // Row pointers for one scatter launch: k rows then v rows; cache head h reads KV head h / rep.
  const int rep = hc / n_kv_heads;
  auto* ptrs = static_cast<const float**>(m.scatter_host.prepare(4 * size_t(hc) * sizeof(float*)));
  for (int h = 0; h < hc; ++h) {
    SegmentMirror& tail = m.heads[h].back();
    if (tail.uploaded + 1 > tail.capacity) grow_dense(tail, tail.uploaded + 1);
    ptrs[h] = k + size_t(h / rep) * d;
    ptrs[hc + h] = v + size_t(h / rep) * d;
    ptrs[2 * hc + h] = tail.desc.k + tail.uploaded * d;
    ptrs[3 * hc + h] = tail.desc.v + tail.uploaded * d;
    ++tail.uploaded;
  }
  m.scatter.ensure(4 * size_t(hc) * sizeof(float*));
  check(cudaMemcpyAsync(m.scatter.as<void>(), ptrs, 4 * size_t(hc) * sizeof(float*), cudaMemcpyHostToDevice, stream_),
        "scatter pointers");
  m.scatter_host.mark(stream_);
  copy_rows(m.scatter.as<const float*>(), m.scatter.as<float*>() + 2 * hc, 2 * hc, d, stream_);
  m.pending = true;
  return true;
}

// The device form of one segment, built from scratch.
SegmentMirror DeviceCaches::mirror_of(CacheMirror& m, const Segment& s) {
  SegmentMirror sm;
  sm.seg = &s;
  sm.uploaded = s.size();
  auto& d = sm.desc;
  if (const auto* ds = dynamic_cast<const DenseSegment*>(&s)) {
    // Room to grow: decoding appends to the dense tail.
    d.kind = kDense;
    sm.capacity = std::max<size_t>(s.size(), 16);
    const size_t row = size_t(ds->head_dim()) * sizeof(float);
    sm.arrays.emplace_back(sm.capacity * row);
    sm.arrays.emplace_back(sm.capacity * row);
    upload_dense_rows(*ds, 0, s.size(), sm.arrays[0].as<char>(), sm.arrays[1].as<char>());
    d.k = sm.arrays[0].as<float>();
    d.v = sm.arrays[1].as<float>();
    return sm;
  }
  Uploader up(*this, m, sm);
  if (!s.device_form(up, d)) fail("CUDA decode: segment format '{}' has no GPU form; use --backend cpu", s.format());
  return sm;
}

// Rows t0 .. t0+n of a dense segment's K and V to device fp32 rows. 16-bit rows are widened on the
// host: the device copy holds the same (rounded) numbers the CPU path reads, at fp32 width.
void DeviceCaches::upload_dense_rows(const DenseSegment& ds, size_t t0, size_t n, char* k_dst, char* v_dst) {
  if (n == 0) return;
  const size_t count = n * size_t(ds.head_dim()), bytes = count * sizeof(float);
  if (ds.dtype() == KvDtype::F32) {
    check(cudaMemcpyAsync(k_dst, ds.k() + t0 * ds.head_dim(), bytes, cudaMemcpyHostToDevice, stream_), "k rows");
    check(cudaMemcpyAsync(v_dst, ds.v() + t0 * ds.head_dim(), bytes, cudaMemcpyHostToDevice, stream_), "v rows");
    return;
  }
  std::vector<float> k(count), v(count);
  ds.read(t0, n, k.data(), v.data());
  // Pageable sources: the copies are staged before these calls return, so the vectors may go.
  check(cudaMemcpyAsync(k_dst, k.data(), bytes, cudaMemcpyHostToDevice, stream_), "k rows");
  check(cudaMemcpyAsync(v_dst, v.data(), bytes, cudaMemcpyHostToDevice, stream_), "v rows");
}

// Makes room for `n` tokens in a dense segment's device copy (doubling).
void DeviceCaches::grow_dense(SegmentMirror& sm, size_t n) {
  if (n <= sm.capacity) return;
  const size_t row = size_t(static_cast<const DenseSegment&>(*sm.seg).head_dim()) * sizeof(float);
  const size_t cap = std::max(n, sm.capacity * 2);
  for (int i : {0, 1}) {
    DeviceArray grown(cap * row);
    check(cudaMemcpyAsync(grown.as<void>(), sm.arrays[i].as<void>(), sm.uploaded * row, cudaMemcpyDeviceToDevice,
                          stream_),
          "grow");
    sm.arrays[i] = std::move(grown);
  }
  sm.capacity = cap;
  sm.desc.k = sm.arrays[0].as<float>();
  sm.desc.v = sm.arrays[1].as<float>();
}

// Appends a dense segment's new host tokens to its device copy.
void DeviceCaches::extend_dense(SegmentMirror& sm) {
  const auto& ds = static_cast<const DenseSegment&>(*sm.seg);
  const size_t n = ds.size(), row = size_t(ds.head_dim()) * sizeof(float);
  grow_dense(sm, n);
  upload_dense_rows(ds, sm.uploaded, n - sm.uploaded, sm.arrays[0].as<char>() + sm.uploaded * row,
                    sm.arrays[1].as<char>() + sm.uploaded * row);
  sm.uploaded = n;
}

CacheMirror& DeviceCaches::sync(const LayerCache& cache) {
  CacheMirror& m = mirrors_[&cache];
  if (m.pending && m.epoch == cache.epoch()) return m;
  const int hc = cache.n_cache_heads();
  bool rebuild = m.epoch != cache.epoch() || int(m.heads.size()) != hc;
  for (int h = 0; h < hc && !rebuild; ++h) {
    const auto& segs = cache.segments(h);
    auto& mh = m.heads[h];
    if (segs.size() < mh.size()) rebuild = true;
    for (size_t i = 0; i < mh.size() && !rebuild; ++i)
      if (mh[i].seg != segs[i].get() || segs[i]->size() < mh[i].uploaded ||
          (segs[i]->size() != mh[i].uploaded && mh[i].desc.kind != kDense))
        rebuild = true;
  }
  if (rebuild) {
    m.heads.clear();
    m.heads.resize(hc);
    m.shared.clear();
    m.epoch = cache.epoch();
  }
  for (int h = 0; h < hc; ++h) {
    const auto& segs = cache.segments(h);
    auto& mh = m.heads[h];
    for (size_t i = 0; i < segs.size(); ++i) {
      if (i == mh.size()) {
        mh.push_back(mirror_of(m, *segs[i]));
      } else if (segs[i]->size() != mh[i].uploaded) {
        extend_dense(mh[i]);
      }
    }
  }
  return m;
}

DecodeLayout DeviceCaches::layout(const LayerCache& cache) {
  CacheMirror& m = sync(cache);
  const int hc = cache.n_cache_heads(), d = cache.head_dim(), group = cache.n_query_heads() / hc;
  std::vector<DecodeSegment> segs;
  std::vector<int32_t> head_tokens(hc), head_parts(hc + 1, 0);
  int max_chunks = 0, parts = 0, stride = 0;
  for (int h = 0; h < hc; ++h) {
    int offset = 0;
    head_parts[h] = parts;
    for (auto& sm : m.heads[h]) {
      DecodeSegment s = sm.desc;
      s.cache_head = h;
      s.n = static_cast<int32_t>(sm.uploaded);
      s.offset = offset;
      s.part = parts;
      const int chunks = (s.n + kDecodeChunk - 1) / kDecodeChunk;
      offset += s.n;
      parts += chunks;
      max_chunks = std::max(max_chunks, chunks);
      if (s.n) segs.push_back(s);
    }
    head_tokens[h] = offset;
    stride = std::max(stride, offset);
  }
  head_parts[hc] = parts;
  // One upload for all the layer's metadata.
  const size_t seg_bytes = segs.size() * sizeof(DecodeSegment);
  const size_t meta_bytes = seg_bytes + (head_tokens.size() + head_parts.size()) * sizeof(int32_t);
  auto* meta = static_cast<unsigned char*>(m.meta_host.prepare(meta_bytes));
  std::memcpy(meta, segs.data(), seg_bytes);
  std::memcpy(meta + seg_bytes, head_tokens.data(), head_tokens.size() * sizeof(int32_t));
  std::memcpy(meta + seg_bytes + head_tokens.size() * sizeof(int32_t), head_parts.data(),
              head_parts.size() * sizeof(int32_t));
  m.meta.ensure(meta_bytes);
  check(cudaMemcpyAsync(m.meta.as<void>(), meta, meta_bytes, cudaMemcpyHostToDevice, stream_), "meta");
  m.meta_host.mark(stream_);
  m.scores.ensure(size_t(cache.n_query_heads()) * std::max(stride, 1) * sizeof(float));
  m.partials.ensure(size_t(std::max(parts, 1)) * group * d * sizeof(float));

  DecodeLayout L;
  L.hq = cache.n_query_heads();
  L.n_cache_heads = hc;
  L.d = d;
  L.n_segments = static_cast<int>(segs.size());
  L.max_chunks = max_chunks;
  L.n_parts = parts;
  L.score_stride = std::max(stride, 1);
  L.segments = m.meta.as<DecodeSegment>();
  L.head_tokens = reinterpret_cast<const int32_t*>(m.meta.as<unsigned char>() + seg_bytes);
  L.head_part_begin = L.head_tokens + hc;
  L.inv_freq = inv_freq_;
  L.interleaved = interleaved_;
  L.scores = m.scores.as<float>();
  L.partials = m.partials.as<float>();
  return L;
}

}  // namespace kvb::cuda
