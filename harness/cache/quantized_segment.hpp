#pragma once
// KV tokens quantized as KVmix stores them: keys per channel (groups of k_group consecutive tokens
// of one channel), values per token (groups of v_group consecutive channels of one token), 1-4 bits,
// fp16 scale and minimum per group, codes packed into 32-bit words (3 bits: 11 per word).
#include <cstdint>
#include <vector>

#include "harness/cache/layer_cache.hpp"

namespace kvb {

class QuantizedSegment final : public Segment {
 public:
  QuantizedSegment(int head_dim, int k_bits, int v_bits, int k_group = 32, int v_group = 32);

  std::string format() const override;
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  size_t bytes() const override;
  void logits(const float* q, float* scores) const override;
  void accumulate(const float* p, float* acc) const override;

  // Quantizes and appends n tokens (k, v: [n, head_dim]); n must be a multiple of k_group.
  void append(const float* k, const float* v, int n, const int32_t* pos);
  // The dequantized keys and values [size, head_dim]: the reference the fast paths are tested against.
  void reconstruct(std::vector<float>& k, std::vector<float>& v) const;

  // The stored form, for backends that attend over it directly.
  int k_bits() const { return kb_; }
  int v_bits() const { return vb_; }
  int k_group() const { return kg_; }
  int v_group() const { return vg_; }
  const std::vector<uint32_t>& k_words() const { return k_words_; }
  const std::vector<uint16_t>& k_scales() const { return k_scale_; }
  const std::vector<uint16_t>& k_mins() const { return k_min_; }
  const std::vector<uint32_t>& v_words() const { return v_words_; }
  const std::vector<uint16_t>& v_scales() const { return v_scale_; }
  const std::vector<uint16_t>& v_mins() const { return v_min_; }

 private:
  int d_, kb_, vb_, kg_, vg_;
  int k_words_per_group_;  // per channel per token group
  int v_words_per_token_;
  std::vector<uint32_t> k_words_;          // [token group][channel][k_words_per_group]
  std::vector<uint16_t> k_scale_, k_min_;  // [token group][channel]
  std::vector<uint32_t> v_words_;          // [token][v_words_per_token]
  std::vector<uint16_t> v_scale_, v_min_;  // [token][channel group]
  std::vector<int32_t> pos_;
};

}  // namespace kvb
