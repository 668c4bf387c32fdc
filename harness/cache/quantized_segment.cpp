#include "harness/cache/quantized_segment.hpp"

#include <fmt/format.h>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_quant.hpp"

namespace kvb {

QuantizedSegment::QuantizedSegment(int head_dim, int k_bits, int v_bits, int k_group, int v_group)
    : d_(head_dim), kb_(k_bits), vb_(v_bits), kg_(k_group), vg_(v_group) {
  const int kper = codes_per_word(k_bits), vper = codes_per_word(v_bits);
  if (k_bits == 3 && k_group % 11 != 0) fail("3-bit keys need token groups of a multiple of 11, got {}", k_group);
  if (k_bits != 3 && k_group % kper != 0)
    fail("{}-bit keys need token groups of a multiple of {}, got {}", k_bits, kper, k_group);
  if (head_dim % v_group != 0 || v_group % vper != 0)
    fail("{}-bit values need channel groups dividing the head dim {} and a multiple of {}, got {}", v_bits,
         head_dim, vper, v_group);
  k_words_per_group_ = k_group / kper;
  v_words_per_token_ = head_dim / vper;
}

std::string QuantizedSegment::format() const { return fmt::format("quantized(k{},v{})", kb_, vb_); }

size_t QuantizedSegment::bytes() const {
  return (k_words_.size() + v_words_.size()) * sizeof(uint32_t) +
         (k_scale_.size() + k_min_.size() + v_scale_.size() + v_min_.size()) * sizeof(uint16_t);
}

void QuantizedSegment::append(const float* k, const float* v, int n, const int32_t* pos) {
  if (n % kg_ != 0) fail("QuantizedSegment: {} tokens is not a whole number of {}-token key groups", n, kg_);
  std::vector<uint32_t> codes(std::max(kg_, vg_));
  for (int g0 = 0; g0 < n; g0 += kg_) {
    for (int c = 0; c < d_; ++c) {
      uint16_t s, m;
      quantize_group(k + size_t(g0) * d_ + c, kg_, d_, kb_, codes.data(), s, m);
      const size_t at = k_words_.size();
      k_words_.resize(at + k_words_per_group_);
      pack_codes(codes.data(), kg_, kb_, k_words_.data() + at);
      k_scale_.push_back(s);
      k_min_.push_back(m);
    }
  }
  for (int t = 0; t < n; ++t) {
    const size_t at = v_words_.size();
    v_words_.resize(at + v_words_per_token_);
    for (int c0 = 0; c0 < d_; c0 += vg_) {
      uint16_t s, m;
      quantize_group(v + size_t(t) * d_ + c0, vg_, 1, vb_, codes.data(), s, m);
      pack_codes(codes.data(), vg_, vb_, v_words_.data() + at + c0 / codes_per_word(vb_));
      v_scale_.push_back(s);
      v_min_.push_back(m);
    }
    pos_.push_back(pos[t]);
  }
}

void QuantizedSegment::reconstruct(std::vector<float>& k, std::vector<float>& v) const {
  const size_t n = size();
  k.assign(n * d_, 0.0f);
  v.assign(n * d_, 0.0f);
  std::vector<uint32_t> codes(std::max(kg_, vg_));
  for (size_t g = 0; g < n / kg_; ++g)
    for (int c = 0; c < d_; ++c) {
      const size_t i = g * d_ + c;
      unpack_codes(k_words_.data() + i * k_words_per_group_, kg_, kb_, codes.data());
      const float s = half_to_float(k_scale_[i]), m = half_to_float(k_min_[i]);
      for (int t = 0; t < kg_; ++t) k[(g * kg_ + t) * d_ + c] = static_cast<float>(codes[t]) * s + m;
    }
  const int groups = d_ / vg_;
  for (size_t t = 0; t < n; ++t)
    for (int gi = 0; gi < groups; ++gi) {
      unpack_codes(v_words_.data() + t * v_words_per_token_ + size_t(gi) * vg_ / codes_per_word(vb_), vg_, vb_,
                   codes.data());
      const float s = half_to_float(v_scale_[t * groups + gi]), m = half_to_float(v_min_[t * groups + gi]);
      for (int c = 0; c < vg_; ++c) v[t * d_ + size_t(gi) * vg_ + c] = static_cast<float>(codes[c]) * s + m;
    }
}

void QuantizedSegment::logits(const float* q, float* scores) const {
  // score_t = sum_c q_c (code_ct s_cg + m_cg): per token group, fold q into each channel's scale and
  // minimum, then walk the codes without materialising the keys.
  const size_t n = size();
  std::vector<uint32_t> codes(kg_);
  for (size_t g = 0; g < n / kg_; ++g) {
    float* sg = scores + g * kg_;
    float bias = 0;
    std::fill(sg, sg + kg_, 0.0f);
    for (int c = 0; c < d_; ++c) {
      const size_t i = g * d_ + c;
      unpack_codes(k_words_.data() + i * k_words_per_group_, kg_, kb_, codes.data());
      const float qs = q[c] * half_to_float(k_scale_[i]);
      bias += q[c] * half_to_float(k_min_[i]);
      for (int t = 0; t < kg_; ++t) sg[t] += qs * static_cast<float>(codes[t]);
    }
    for (int t = 0; t < kg_; ++t) sg[t] += bias;
  }
}

void QuantizedSegment::accumulate(const float* p, float* acc) const {
  const size_t n = size();
  const int groups = d_ / vg_;
  std::vector<uint32_t> codes(vg_);
  for (size_t t = 0; t < n; ++t) {
    if (p[t] == 0.0f) continue;
    for (int gi = 0; gi < groups; ++gi) {
      unpack_codes(v_words_.data() + t * v_words_per_token_ + size_t(gi) * vg_ / codes_per_word(vb_), vg_, vb_,
                   codes.data());
      const float ps = p[t] * half_to_float(v_scale_[t * groups + gi]);
      const float pm = p[t] * half_to_float(v_min_[t * groups + gi]);
      float* a = acc + size_t(gi) * vg_;
      for (int c = 0; c < vg_; ++c) a[c] += ps * static_cast<float>(codes[c]) + pm;
    }
  }
}

}  // namespace kvb
