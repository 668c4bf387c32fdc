#pragma once
// The KV cache of one layer, as the design's segments: for each cache head a list of segments, each a
// block of tokens stored in one format. Attention over a LayerCache takes the softmax over all
// segments together (online softmax), so formats can be mixed freely.
//
// Every cache has a stored dtype (fp32, bf16, fp16) for the full-precision numbers it keeps. Methods
// build their segments in fp32; the runner then stores them at the run's dtype (store_as), which
// scales every budgeted format alike, so that a budget in tokens means the same at any dtype.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/cpu/kv_rows.hpp"
#include "kernels/decode_segment.hpp"

namespace kvb {

class DeviceUploader;

class Segment {
 public:
  virtual ~Segment() = default;
  virtual std::string format() const = 0;
  virtual size_t size() const = 0;  // tokens
  virtual std::span<const int32_t> positions() const = 0;
  // Exact bytes held, overheads (bases, scales, positions excluded) included.
  virtual size_t bytes() const = 0;
  // scores[t] = q . k_t (unscaled) for the segment's tokens.
  virtual void logits(const float* q, float* scores) const = 0;
  // acc[0..d) += sum_t p[t] v_t.
  virtual void accumulate(const float* p, float* acc) const = 0;
  // The same for the g query heads of a GQA group that read this head (q and acc [g, d], scores and p
  // [g, size()]), each head's numbers as it gets them alone. A format whose reading costs more than its
  // arithmetic (16-bit rows widened, codes unpacked) overrides them to read itself once for the group.
  virtual void logits_group(const float* q, int g, int d, float* scores) const;
  virtual void accumulate_group(const float* p, int g, int d, float* acc) const;
  // One head's attention spread over threads (attend_batch): where the segment's logits may be cut, into
  // at most `parts` runs of tokens (0 = t_0 < ... < t_k = size()), and where its values may, into runs of
  // channels (0 = c_0 < ... < c_k = d); each run computed alone (logits_part, accumulate_part: scores
  // [g, ld] filled at columns t0..t1, acc [g, d] at channels c0..c1) gives the numbers the whole gives
  // it. By default a segment is read whole: one run each.
  virtual std::vector<size_t> token_cuts(int /*parts*/) const { return {0, size()}; }
  virtual std::vector<size_t> channel_cuts(int /*parts*/, int d) const { return {0, size_t(d)}; }
  virtual void logits_part(const float* q, int g, int d, size_t t0, size_t t1, float* scores, size_t ld) const;
  virtual void accumulate_part(const float* p, int g, int d, int c0, int c1, float* acc) const;
  // A segment that keeps taking decoded tokens (the dense tail; KVmix's store, which quantizes as its
  // full-precision buffer fills) appends one here and returns true; others return false.
  virtual bool append_token(const float* /*k*/, const float* /*v*/, int32_t /*pos*/) { return false; }
  // Keeps the segment's full-precision numbers (dense rows, buffers, coefficients) at dtype t from now
  // on, rounding what it holds, and charges them at that width. Codes and their fp16 scales are
  // unchanged. Every format must say what it stores, so there is no default.
  virtual void store_as(KvDtype t) = 0;
  // The dimensions each of its keys keeps, of `head_dim` (fewer in a reduced-dimension format).
  virtual int key_dims(int head_dim) const { return head_dim; }
  // Its GPU form (harness/cache/device_form.hpp): fills `d` (kind and arrays; the backend sets the
  // placement) with what it uploads and returns true; false for a format with none.
  virtual bool device_form(DeviceUploader& /*up*/, cuda::DecodeSegment& /*d*/) const { return false; }
};

// [0, n) cut into at most `parts` runs of about equal length, each a multiple of `grain` but the last:
// the cuts 0 = t_0 < ... < t_k = n (Segment::token_cuts, channel_cuts); grain 0: not cut.
std::vector<size_t> even_cuts(size_t n, int parts, size_t grain);

// Rows of head_dim numbers stored at a dtype: the dense K or V of a segment, or a full-precision buffer.
class RowStore {
 public:
  RowStore(int head_dim, KvDtype dtype) : d_(head_dim), dtype_(dtype) {}
  size_t rows() const { return data_.size() / row_bytes(); }
  size_t bytes() const { return data_.size(); }
  KvDtype dtype() const { return dtype_; }
  const void* data() const { return data_.data(); }
  // Appends n rows, `stride` floats apart.
  void append(const float* x, size_t n = 1, size_t stride = 0);
  void erase(size_t first, size_t n);
  void reserve(size_t rows) { data_.reserve(rows * row_bytes()); }
  // Rows t0 .. t0+n as fp32.
  void read(size_t t0, size_t n, float* out) const;
  // out[t] = q . row_t and acc += sum_t p[t] row_t over all rows.
  // With g > 1, for g queries or weight vectors at once (kv_rows_dot, kv_rows_axpy).
  void dot(const float* q, float* out, int g = 1) const { kv_rows_dot(dtype_, data_.data(), rows(), d_, q, out, g); }
  void axpy(const float* p, float* acc, int g = 1) const { kv_rows_axpy(dtype_, data_.data(), rows(), d_, p, acc, g); }
  // Rows [t0, t1) only (out [g, ldo] at columns 0..t1-t0), and channels [c0, c1) only (acc [g, head_dim];
  // p [g, ldp], ldp = rows() when 0).
  void dot(const float* q, size_t t0, size_t t1, float* out, int g, size_t ldo) const {
    kv_rows_dot(dtype_, data_.data() + t0 * row_bytes(), t1 - t0, d_, q, out, g, ldo);
  }
  void axpy(const float* p, int c0, int c1, float* acc, int g, size_t ldp = 0) const {
    kv_rows_axpy(dtype_, data_.data() + size_t(c0) * kv_dtype_bytes(dtype_), rows(), c1 - c0, p, acc + c0, g,
                 size_t(d_), ldp);
  }
  // Runs the row kernels keep exact (Segment::token_cuts, channel_cuts): rows in multiples of 64
  // (kv_rows_dot's sums depend on a row's position modulo 4), channels in multiples of 16, none in fp32
  // (BLAS orders the sums its own way).
  static constexpr size_t kRowGrain = 64;
  size_t channel_grain() const { return dtype_ == KvDtype::F32 ? 0 : 16; }
  void store_as(KvDtype t);

 private:
  size_t row_bytes() const { return size_t(d_) * kv_dtype_bytes(dtype_); }
  int d_;
  KvDtype dtype_;
  std::vector<unsigned char> data_;  // [rows, head_dim] at dtype_
};

// The cuts of a store quantized in groups behind a full-precision buffer (KVmix's, QJL's): its logits at
// whole groups of `group` tokens over the `grouped` first (the buffer's `total - grouped` with the last
// run), its values at whole groups of `channel_group` channels that also keep the buffer's rows exact
// when it holds any.
std::vector<size_t> grouped_token_cuts(size_t grouped, size_t total, size_t group, int parts);
std::vector<size_t> grouped_channel_cuts(int d, int parts, size_t channel_group, const RowStore& buffer);

// Attention over keys and values held as rows (RowStore): the reads of a dense segment, and of a format
// that keeps its tokens decoded for attention (KVQuant's simulated quantization). A GQA group's queries read
// the rows once; logits may be cut at multiples of 64 rows and values at the rows' channel grain.
class RowSegment : public Segment {
 public:
  RowSegment(int head_dim, KvDtype dtype) : k_(head_dim, dtype), v_(head_dim, dtype) {}
  void logits(const float* q, float* scores) const override { k_.dot(q, scores); }
  void accumulate(const float* p, float* acc) const override { v_.axpy(p, acc); }
  void logits_group(const float* q, int g, int, float* scores) const override { k_.dot(q, scores, g); }
  void accumulate_group(const float* p, int g, int, float* acc) const override { v_.axpy(p, acc, g); }
  std::vector<size_t> token_cuts(int parts) const override { return even_cuts(size(), parts, RowStore::kRowGrain); }
  std::vector<size_t> channel_cuts(int parts, int d) const override {
    return even_cuts(size_t(d), parts, v_.channel_grain());
  }
  void logits_part(const float* q, int g, int, size_t t0, size_t t1, float* scores, size_t ld) const override {
    k_.dot(q, t0, t1, scores + t0, g, ld);
  }
  void accumulate_part(const float* p, int g, int, int c0, int c1, float* acc) const override {
    v_.axpy(p, c0, c1, acc, g);
  }

 protected:
  RowStore k_, v_;
};

// Keys and values at full head dimension, token-major, stored at the segment's dtype.
class DenseSegment final : public RowSegment {
 public:
  explicit DenseSegment(int head_dim, KvDtype dtype = KvDtype::F32) : RowSegment(head_dim, dtype), d_(head_dim) {}
  std::string format() const override { return "dense"; }
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  size_t bytes() const override { return k_.bytes() + v_.bytes(); }
  void store_as(KvDtype t) override {
    k_.store_as(t);
    v_.store_as(t);
  }

  void append(const float* k, const float* v, int32_t pos);
  // n tokens whose rows lie `stride` floats apart (one head of a [n, heads, d] prefill output).
  void append_rows(const float* k, const float* v, size_t n, size_t stride, const int32_t* pos);
  bool append_token(const float* k, const float* v, int32_t pos) override {
    append(k, v, pos);
    return true;
  }
  void reserve(size_t tokens);
  void erase(size_t index);  // removes one token (decode-time eviction)
  KvDtype dtype() const { return k_.dtype(); }
  // Rows t0 .. t0+n as fp32 (either pointer may be null).
  void read(size_t t0, size_t n, float* k, float* v) const;
  // The rows in place, fp32 storage only (an error otherwise).
  const float* k() const;
  const float* v() const;
  int head_dim() const { return d_; }

 private:
  int d_;
  std::vector<int32_t> pos_;
};

class LayerCache {
 public:
  // `n_cache_heads` is the number of K/V heads stored: the model's KV heads, or its query heads when
  // a method keeps a separate copy per query head. Query head h reads cache head h / group.
  LayerCache(int n_query_heads, int n_cache_heads, int head_dim, KvDtype dtype = KvDtype::F32);

  int n_query_heads() const { return n_q_; }
  int n_cache_heads() const { return static_cast<int>(heads_.size()); }
  int head_dim() const { return d_; }
  int cache_head_of(int query_head) const { return query_head / (n_q_ / n_cache_heads()); }
  KvDtype dtype() const { return dtype_; }
  // Stores every segment, and the dense tails decoding appends, at dtype t (Segment::store_as).
  void store_as(KvDtype t);

  // Mutable access marks the cache as restructured (a new epoch); append() alone does not, so that a
  // device copy of the cache can tell "tokens appended to dense tails" from "anything else changed".
  std::vector<std::unique_ptr<Segment>>& segments(int head) {
    touch();
    return heads_[head];
  }
  const std::vector<std::unique_ptr<Segment>>& segments(int head) const { return heads_[head]; }

  // Appends one token to every head: k and v are [n_cache_heads, d]. Goes to the head's last segment
  // if it takes tokens (Segment::append_token), else to a new Dense segment (the recent window of
  // compressed caches).
  void append(const float* k, const float* v, int32_t pos);
  // Appends n tokens: k and v are [n, n_cache_heads, d] with positions pos[n].
  void append_many(const float* k, const float* v, int n, const int32_t* pos);

  size_t tokens(int head) const;
  size_t bytes() const;
  void clear();
  // Changes whenever the cache is restructured (unique across all caches of the process).
  uint64_t epoch() const { return epoch_; }

 private:
  DenseSegment& tail(int head);
  void touch();
  int n_q_, d_;
  KvDtype dtype_;
  uint64_t epoch_ = 0;
  std::vector<std::vector<std::unique_ptr<Segment>>> heads_;
};

// Attention of one token's queries q[n_query_heads, d] over a cache: out[n_query_heads, d]. Online
// softmax across segments with scale 1/sqrt(d).
void attend(const LayerCache& cache, const float* q, float* out);
// The same for a batch of sequences, one token each: q and out hold row b for caches[b]. Every
// sequence's heads share one parallel region; each row is what attend gives it alone.
void attend_batch(std::span<const LayerCache* const> caches, const float* q, float* out);
// Plain reference: gathers every segment's logits first, one softmax, then the weighted sum.
void attend_ref(const LayerCache& cache, const float* q, float* out);

// The key dimensions each cache head keeps each prompt position at: 0 when evicted, else the
// holding segment's key_dims. [cache head][position], for positions [0, n_tokens).
std::vector<std::vector<int>> stored_key_dims(const LayerCache& cache, int n_tokens);

}  // namespace kvb
