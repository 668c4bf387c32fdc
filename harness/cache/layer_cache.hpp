#pragma once
// The KV cache of one layer, as the design's segments: for each cache head a list of segments, each a
// block of tokens stored in one format. Attention over a LayerCache takes the softmax over all
// segments together (online softmax), so formats can be mixed freely. Only the Dense format exists so
// far; compressed formats are further Segment subclasses.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kvb {

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
  // A segment that keeps taking decoded tokens (the dense tail; KVmix's store, which quantizes as its
  // full-precision buffer fills) appends one here and returns true; others return false.
  virtual bool append_token(const float* /*k*/, const float* /*v*/, int32_t /*pos*/) { return false; }
};

// Keys and values at full head dimension, fp32, token-major.
class DenseSegment final : public Segment {
 public:
  explicit DenseSegment(int head_dim) : d_(head_dim) {}
  std::string format() const override { return "dense"; }
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  size_t bytes() const override { return (k_.size() + v_.size()) * sizeof(float); }
  void logits(const float* q, float* scores) const override;
  void accumulate(const float* p, float* acc) const override;

  void append(const float* k, const float* v, int32_t pos);
  bool append_token(const float* k, const float* v, int32_t pos) override {
    append(k, v, pos);
    return true;
  }
  void reserve(size_t tokens);
  void erase(size_t index);  // removes one token (decode-time eviction)
  const float* k() const { return k_.data(); }
  const float* v() const { return v_.data(); }
  int head_dim() const { return d_; }

 private:
  int d_;
  std::vector<float> k_, v_;
  std::vector<int32_t> pos_;
};

class LayerCache {
 public:
  // `n_cache_heads` is the number of K/V heads stored: the model's KV heads, or its query heads when
  // a method keeps a separate copy per query head. Query head h reads cache head h / group.
  LayerCache(int n_query_heads, int n_cache_heads, int head_dim);

  int n_query_heads() const { return n_q_; }
  int n_cache_heads() const { return static_cast<int>(heads_.size()); }
  int head_dim() const { return d_; }
  int cache_head_of(int query_head) const { return query_head / (n_q_ / n_cache_heads()); }

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
  uint64_t epoch_ = 0;
  std::vector<std::vector<std::unique_ptr<Segment>>> heads_;
};

// Attention of one token's queries q[n_query_heads, d] over a cache: out[n_query_heads, d]. Online
// softmax across segments with scale 1/sqrt(d).
void attend(const LayerCache& cache, const float* q, float* out);
// Plain reference: gathers every segment's logits first, one softmax, then the weighted sum.
void attend_ref(const LayerCache& cache, const float* q, float* out);

}  // namespace kvb
