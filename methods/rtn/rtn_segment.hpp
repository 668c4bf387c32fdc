#pragma once
// The cache of one KV head under symmetric per-token round-to-nearest (rtn.cpp): per token, keys and values
// as signed b-bit codes packed into bytes, with one fp16 step (1 / (s + 1e-6)) per group of channels.
#include <cstdint>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "kernels/cpu/token_codes.hpp"

namespace kvb {

class RtnSegment final : public Segment {
 public:
  RtnSegment(int head_dim, int bits, int group);
  std::string format() const override;
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  // Packed codes and fp16 steps of keys and values: nothing at full precision.
  size_t bytes() const override;
  // Attention reads the codes directly (kernels/cpu/token_codes.hpp), a GQA group's queries at once;
  // logits may be cut at any token and values at any 16 channels.
  void logits(const float* q, float* scores) const override { logits_group(q, 1, d_, scores); }
  void accumulate(const float* p, float* acc) const override { accumulate_group(p, 1, d_, acc); }
  void logits_group(const float* q, int g, int d, float* scores) const override;
  void accumulate_group(const float* p, int g, int d, float* acc) const override;
  std::vector<size_t> token_cuts(int parts) const override { return even_cuts(size(), parts, 16); }
  std::vector<size_t> channel_cuts(int parts, int d) const override { return even_cuts(size_t(d), parts, 16); }
  void logits_part(const float* q, int g, int d, size_t t0, size_t t1, float* scores, size_t ld) const override;
  void accumulate_part(const float* p, int g, int d, int c0, int c1, float* acc) const override;
  // Quantizes the token as it enters (prefill and decode alike).
  bool append_token(const float* k, const float* v, int32_t pos) override;
  void store_as(KvDtype) override {}

  // The signed codes [size, head_dim] of the keys or the values, and both read back: the reference of
  // the fused attention paths and what the tests compare with KIVI's SymQuantizer.
  std::vector<int> codes(bool keys) const;
  void reconstruct(std::vector<float>& k, std::vector<float>& v) const;

 private:
  void quantize(const float* x, std::vector<uint8_t>& codes, std::vector<uint16_t>& steps) const;
  TokenCodesView view(bool keys) const;

  int d_, bits_, group_, levels_ = 0;
  size_t row_bytes_ = 0;
  std::vector<uint8_t> k_codes_, v_codes_;   // [token][row_bytes_], code + levels_ in bits_ bits
  std::vector<uint16_t> k_steps_, v_steps_;  // [token][group]
  std::vector<int32_t> pos_;
};

}  // namespace kvb
