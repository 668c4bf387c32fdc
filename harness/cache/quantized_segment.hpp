#pragma once
// KV tokens quantized as KVmix stores them: keys per channel (groups of k_group consecutive tokens
// of one channel), values per token (groups of v_group consecutive channels of one token), 1-4 bits,
// fp16 scale and minimum per group, codes packed into 32-bit words (3 bits: 11 per word). The key and
// value stores are separate classes, so that a cache can quantize keys and values up to different
// tokens (KVmix's independent K/V boundaries, methods/kvmix/kvmix_segment.*).
#include <cstdint>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "kernels/cpu/kv_quant.hpp"

namespace kvb {

// Keys quantized per channel along tokens, in whole groups of `group` tokens.
class QuantizedKeys {
 public:
  QuantizedKeys(int head_dim, int bits, int group);
  size_t size() const { return tokens_; }
  size_t bytes() const;
  // Quantizes n tokens k[n, head_dim] (row stride `stride` floats); n a multiple of the group.
  void append(const float* k, int n, size_t stride);
  // scores[t] = q . k^_t, fused: q is folded into each channel's scale and minimum per group; with
  // g > 1, for g queries at once (q [g, head_dim], scores [g, size]), the codes unpacked once.
  void logits(const float* q, float* scores, int g = 1) const;
  // Tokens [t0, t1) only (whole groups), into scores [g, ldo] at columns 0..t1-t0.
  void logits(const float* q, size_t t0, size_t t1, float* scores, int g, size_t ldo) const;
  void reconstruct(float* k) const;  // [size, head_dim]
  int bits() const { return bits_; }
  int group() const { return group_; }
  const std::vector<uint32_t>& words() const { return words_; }
  const std::vector<uint16_t>& scales() const { return scale_; }
  const std::vector<uint16_t>& mins() const { return min_; }
  // What the fused kernels read (kernels/cpu/kv_quant.hpp).
  QuantKeysView view() const { return {words_.data(), scale_.data(), min_.data(), tokens_, d_, bits_, group_}; }

 private:
  int d_, bits_, group_, words_per_group_;
  size_t tokens_ = 0;
  std::vector<uint32_t> words_;        // [token group][channel][words_per_group]
  std::vector<uint16_t> scale_, min_;  // [token group][channel]
};

// Values quantized per token along channels, in groups of `group` channels.
class QuantizedValues {
 public:
  QuantizedValues(int head_dim, int bits, int group);
  size_t size() const { return tokens_; }
  size_t bytes() const;
  void append(const float* v, int n, size_t stride);
  // acc[0..d) += sum_t p[t] v^_t, fused: each token's probability is folded into its scales; with
  // g > 1, for g weight vectors at once (p [g, size], acc [g, head_dim]).
  void accumulate(const float* p, float* acc, int g = 1) const;
  // Channels [c0, c1) only (whole groups), with the weights p [g, ldp].
  void accumulate(const float* p, int c0, int c1, float* acc, int g, size_t ldp) const {
    quant_values_axpy(view(), p, acc, g, c0, c1, ldp);
  }
  void reconstruct(float* v) const;  // [size, head_dim]
  int bits() const { return bits_; }
  int group() const { return group_; }
  const std::vector<uint32_t>& words() const { return words_; }
  const std::vector<uint16_t>& scales() const { return scale_; }
  const std::vector<uint16_t>& mins() const { return min_; }
  QuantValuesView view() const { return {words_.data(), scale_.data(), min_.data(), tokens_, d_, bits_, group_}; }

 private:
  int d_, bits_, group_, words_per_token_;
  size_t tokens_ = 0;
  std::vector<uint32_t> words_;        // [token][words_per_token]
  std::vector<uint16_t> scale_, min_;  // [token][channel group]
};

class QuantizedSegment final : public Segment {
 public:
  QuantizedSegment(int head_dim, int k_bits, int v_bits, int k_group = 32, int v_group = 32);

  std::string format() const override;
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  size_t bytes() const override { return keys_.bytes() + values_.bytes(); }
  void logits(const float* q, float* scores) const override { keys_.logits(q, scores); }
  void accumulate(const float* p, float* acc) const override { values_.accumulate(p, acc); }
  void logits_group(const float* q, int g, int, float* scores) const override { keys_.logits(q, scores, g); }
  void accumulate_group(const float* p, int g, int, float* acc) const override { values_.accumulate(p, acc, g); }
  bool device_form(DeviceUploader& up, cuda::DecodeSegment& d) const override;
  // Codes and fp16 scales only: nothing stored at the cache's full precision.
  void store_as(KvDtype) override {}

  // Quantizes and appends n tokens (k, v: [n, head_dim]); n must be a multiple of k_group.
  void append(const float* k, const float* v, int n, const int32_t* pos);
  // The dequantized keys and values [size, head_dim]: the reference the fast paths are tested against.
  void reconstruct(std::vector<float>& k, std::vector<float>& v) const;

  // The stored form, for backends that attend over it directly.
  int k_bits() const { return keys_.bits(); }
  int v_bits() const { return values_.bits(); }
  int k_group() const { return keys_.group(); }
  int v_group() const { return values_.group(); }
  const std::vector<uint32_t>& k_words() const { return keys_.words(); }
  const std::vector<uint16_t>& k_scales() const { return keys_.scales(); }
  const std::vector<uint16_t>& k_mins() const { return keys_.mins(); }
  const std::vector<uint32_t>& v_words() const { return values_.words(); }
  const std::vector<uint16_t>& v_scales() const { return values_.scales(); }
  const std::vector<uint16_t>& v_mins() const { return values_.mins(); }

 private:
  int d_;
  QuantizedKeys keys_;
  QuantizedValues values_;
  std::vector<int32_t> pos_;
};

}  // namespace kvb
