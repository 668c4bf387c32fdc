#include "harness/cache/quantized_segment.hpp"

#include "harness/cache/device_form.hpp"

#include <fmt/format.h>

#include <algorithm>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_quant.hpp"

namespace kvb {

QuantizedKeys::QuantizedKeys(int head_dim, int bits, int group) : d_(head_dim), bits_(bits), group_(group) {
  if (bits < 1 || bits > 4) fail("key bit width {} is outside 1-4", bits);
  const int per = codes_per_word(bits);
  if (bits == 3 && group % 11 != 0) fail("3-bit keys need token groups of a multiple of 11, got {}", group);
  if (bits != 3 && group % per != 0)
    fail("{}-bit keys need token groups of a multiple of {}, got {}", bits, per, group);
  words_per_group_ = group / per;
}

size_t QuantizedKeys::bytes() const {
  return words_.size() * sizeof(uint32_t) + (scale_.size() + min_.size()) * sizeof(uint16_t);
}

void QuantizedKeys::append(const float* k, int n, size_t stride) {
  if (n % group_ != 0) fail("quantized keys: {} tokens is not a whole number of {}-token groups", n, group_);
  std::vector<uint32_t> codes(static_cast<size_t>(group_));
  for (int g0 = 0; g0 < n; g0 += group_)
    for (int c = 0; c < d_; ++c) {
      uint16_t s, m;
      quantize_group(k + size_t(g0) * stride + c, group_, static_cast<int>(stride), bits_, codes.data(), s, m);
      const size_t at = words_.size();
      words_.resize(at + size_t(words_per_group_));
      pack_codes(codes.data(), group_, bits_, words_.data() + at);
      scale_.push_back(s);
      min_.push_back(m);
    }
  tokens_ += size_t(n);
}

void QuantizedKeys::reconstruct(float* k) const {
  std::vector<uint32_t> codes(static_cast<size_t>(group_));
  for (size_t g = 0; g < tokens_ / size_t(group_); ++g)
    for (int c = 0; c < d_; ++c) {
      const size_t i = g * d_ + c;
      unpack_codes(words_.data() + i * words_per_group_, group_, bits_, codes.data());
      const float s = half_to_float(scale_[i]), m = half_to_float(min_[i]);
      for (int t = 0; t < group_; ++t) k[(g * group_ + t) * d_ + c] = static_cast<float>(codes[t]) * s + m;
    }
}

void QuantizedKeys::logits(const float* q, float* scores, int g) const { quant_keys_dot(view(), q, scores, g); }

void QuantizedKeys::logits(const float* q, size_t t0, size_t t1, float* scores, int g, size_t ldo) const {
  if (t0 % size_t(group_) != 0 || t1 % size_t(group_) != 0 || t0 > t1 || t1 > tokens_)
    fail("internal: quantized keys read from token {} to {}, not whole groups of {}", t0, t1, group_);
  const size_t g0 = t0 / size_t(group_);
  QuantKeysView v = view();
  v.words += g0 * size_t(d_) * size_t(words_per_group_);
  v.scale += g0 * size_t(d_);
  v.min += g0 * size_t(d_);
  v.tokens = t1 - t0;
  quant_keys_dot(v, q, scores, g, ldo);
}

QuantizedValues::QuantizedValues(int head_dim, int bits, int group) : d_(head_dim), bits_(bits), group_(group) {
  if (bits < 1 || bits > 4) fail("value bit width {} is outside 1-4", bits);
  if (bits == 3) fail("3-bit values are not supported (11 codes per word do not tile channel groups); use 2 or 4");
  const int per = codes_per_word(bits);
  if (group <= 0 || head_dim % group != 0 || group % per != 0)
    fail("{}-bit values need channel groups dividing the head dim {} and a multiple of {}, got {}", bits, head_dim, per,
         group);
  words_per_token_ = head_dim / per;
}

size_t QuantizedValues::bytes() const {
  return words_.size() * sizeof(uint32_t) + (scale_.size() + min_.size()) * sizeof(uint16_t);
}

void QuantizedValues::append(const float* v, int n, size_t stride) {
  std::vector<uint32_t> codes(static_cast<size_t>(group_));
  const int per = codes_per_word(bits_);
  for (int t = 0; t < n; ++t) {
    const size_t at = words_.size();
    words_.resize(at + size_t(words_per_token_));
    for (int c0 = 0; c0 < d_; c0 += group_) {
      uint16_t s, m;
      quantize_group(v + size_t(t) * stride + c0, group_, 1, bits_, codes.data(), s, m);
      pack_codes(codes.data(), group_, bits_, words_.data() + at + c0 / per);
      scale_.push_back(s);
      min_.push_back(m);
    }
  }
  tokens_ += size_t(n);
}

void QuantizedValues::reconstruct(float* v) const {
  std::vector<uint32_t> codes(static_cast<size_t>(group_));
  const int groups = d_ / group_, per = codes_per_word(bits_);
  for (size_t t = 0; t < tokens_; ++t)
    for (int gi = 0; gi < groups; ++gi) {
      unpack_codes(words_.data() + t * words_per_token_ + size_t(gi) * group_ / per, group_, bits_, codes.data());
      const float s = half_to_float(scale_[t * groups + gi]), m = half_to_float(min_[t * groups + gi]);
      for (int c = 0; c < group_; ++c) v[t * d_ + size_t(gi) * group_ + c] = static_cast<float>(codes[c]) * s + m;
    }
}

void QuantizedValues::accumulate(const float* p, float* acc, int g) const { quant_values_axpy(view(), p, acc, g); }

QuantizedSegment::QuantizedSegment(int head_dim, int k_bits, int v_bits, int k_group, int v_group)
    : d_(head_dim), keys_(head_dim, k_bits, k_group), values_(head_dim, v_bits, v_group) {}

std::string QuantizedSegment::format() const { return fmt::format("quantized(k{},v{})", k_bits(), v_bits()); }

void QuantizedSegment::append(const float* k, const float* v, int n, const int32_t* pos) {
  keys_.append(k, n, size_t(d_));
  values_.append(v, n, size_t(d_));
  pos_.insert(pos_.end(), pos, pos + n);
}

void QuantizedSegment::reconstruct(std::vector<float>& k, std::vector<float>& v) const {
  k.assign(size() * d_, 0.0f);
  v.assign(size() * d_, 0.0f);
  keys_.reconstruct(k.data());
  values_.reconstruct(v.data());
}

bool QuantizedSegment::device_form(DeviceUploader& up, cuda::DecodeSegment& d) const {
  d.kind = cuda::kQuantized;
  d.pos = up.upload(positions());
  d.k_words = up.upload(k_words());
  d.k_scale = up.upload(k_scales());
  d.k_min = up.upload(k_mins());
  d.v_words = up.upload(v_words());
  d.v_scale = up.upload(v_scales());
  d.v_min = up.upload(v_mins());
  d.k_bits = k_bits();
  d.v_bits = v_bits();
  d.k_group = k_group();
  d.v_group = v_group();
  return true;
}

}  // namespace kvb
