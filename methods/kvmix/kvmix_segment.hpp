#pragma once
// KVmix's cache of one KV head (README.md §2-§5): keys quantized per channel along tokens and
// values per token along channels, each behind its own full-precision buffer of the most recent
// tokens (the "recent pivotal context"), so that keys and values are quantized up to different
// tokens. Every append, at prefill and at each decode step, applies the same rule to each buffer F:
// keep floor(r |F|) tokens, move the oldest floor((|F| - keep) / G) * G into the quantized store.
#include <cstdint>
#include <vector>

#include "harness/cache/quantized_segment.hpp"

namespace kvb {

struct KvmixLayout {
  int k_bits = 2, v_bits = 2;
  int k_group = 32;                 // tokens per key group (11 for 3-bit keys)
  int v_group = 32;                 // channels per value group
  double k_rpc = 0.1, v_rpc = 0.1;  // r: the share of the buffer kept at full precision after each update
  int v_move = 32;                  // values leave the buffer in multiples of this many tokens (the reference's rule)
  // > 0: KIVI's residual rule instead (jy-yuan/KIVI, models/llama_kivi.py): keys leave the buffer in whole
  // blocks of `residual` tokens, values keep the `residual` most recent; a decode step attends with its
  // token at full precision and the rule applies before the next token is appended, as KIVI quantizes
  // after attention.
  int residual = 0;
  // Attention reads the codes directly (fused dequantize-dot); false dequantizes the store first and
  // then multiplies, the baseline the fused path is benchmarked against.
  bool fused = true;
};

class KvmixSegment final : public Segment {
 public:
  // The buffers hold `dtype` from the start, so that tokens are quantized from what the buffer held.
  KvmixSegment(int head_dim, const KvmixLayout& layout, KvDtype dtype = KvDtype::F32);
  std::string format() const override;
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  // Codes, fp16 scales and minimums, and the full-precision buffers at the cache's dtype.
  size_t bytes() const override;
  void store_as(KvDtype t) override {
    kf_.store_as(t);
    vf_.store_as(t);
  }
  void logits(const float* q, float* scores) const override;
  void accumulate(const float* p, float* acc) const override;
  void logits_group(const float* q, int g, int d, float* scores) const override;
  void accumulate_group(const float* p, int g, int d, float* acc) const override;
  // Logits cut at whole key groups (the buffer goes with the last run), values at whole value groups.
  std::vector<size_t> token_cuts(int parts) const override;
  std::vector<size_t> channel_cuts(int parts, int d) const override;
  void logits_part(const float* q, int g, int d, size_t t0, size_t t1, float* scores, size_t ld) const override;
  void accumulate_part(const float* p, int g, int d, int c0, int c1, float* acc) const override;
  bool append_token(const float* k, const float* v, int32_t pos) override;

  // Appends n tokens (rows of k and v `stride` floats apart), then applies the update rule once.
  void append(const float* k, const float* v, int n, const int32_t* pos, size_t stride);
  size_t k_buffer() const { return size() - keys_.size(); }    // keys at full precision
  size_t v_buffer() const { return size() - values_.size(); }  // values at full precision
  const KvmixLayout& layout() const { return layout_; }
  // Keys and values as attention reads them [size, head_dim]: the reference of the fused paths.
  void reconstruct(std::vector<float>& k, std::vector<float>& v) const;
  // Applies the update rule now. Under KIVI's rule a decode step leaves it pending (KIVI applies it after
  // the step's attention) until the next token arrives; this settles the state as KIVI holds it then.
  void settle();

 private:
  int d_;
  KvmixLayout layout_;
  QuantizedKeys keys_;
  QuantizedValues values_;
  RowStore kf_, vf_;  // the buffers, oldest first [tokens, head_dim]
  std::vector<int32_t> pos_;
};

// The buffer's length after each update of the rule for a prompt of n tokens followed by `steps`
// decoded tokens: what KvmixSegment does, in closed form, for tests and for planning.
std::vector<size_t> kvmix_buffer_sizes(size_t n, int steps, double r, int group);

}  // namespace kvb
