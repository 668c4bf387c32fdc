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
