// Symmetric per-token round-to-nearest quantization of keys and values, the "2bit/4bit (k-T, v-T)" rows of
// KVmix's Table 3, with KIVI's SymQuantizer (jy-yuan/KIVI, models/utils_quant.py) as the quantizer: per
// token and group of channels, s = (2^(b-1) - 1) / (max |x| + 1e-6), code = round(x s) (half to even) in
// [-(2^(b-1) - 1), 2^(b-1) - 1], read back as code / (s + 1e-6). Every token is quantized as it enters
// the cache, at prefill and at each decode step (no full-precision recent tokens: the paper's RPC 0).
#include <fmt/format.h>

#include <cmath>

#include "harness/method/method.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "methods/rtn/rtn_segment.hpp"

namespace kvb {

RtnSegment::RtnSegment(int head_dim, int bits, int group) : d_(head_dim), bits_(bits), group_(group) {
  if (bits != 2 && bits != 4 && bits != 8)
    fail("rtn: bits must be 2, 4 or 8 (codes packed whole into bytes), got {}", bits);
  if (group <= 0 || head_dim % group != 0)
    fail("rtn: the group of {} channels must divide head_dim {}", group, head_dim);
  levels_ = (1 << (bits - 1)) - 1;
  row_bytes_ = size_t(head_dim * bits + 7) / 8;
}

std::string RtnSegment::format() const { return fmt::format("rtn(k{},v{},g{})", bits_, bits_, group_); }

size_t RtnSegment::bytes() const { return 2 * size() * (row_bytes_ + sizeof(uint16_t) * size_t(d_ / group_)); }

void RtnSegment::quantize(const float* x, std::vector<uint8_t>& codes, std::vector<uint16_t>& steps) const {
  const size_t at = codes.size();
  codes.resize(at + row_bytes_, 0);
  const int per_byte = 8 / bits_;
  for (int g0 = 0; g0 < d_; g0 += group_) {
    float m = 0;
    for (int i = g0; i < g0 + group_; ++i) m = std::max(m, std::abs(x[i]));
    const float s = float(levels_) / (m + 1e-6f);
    steps.push_back(float_to_half(1.0f / (s + 1e-6f)));
    for (int i = g0; i < g0 + group_; ++i) {
      const int c = std::clamp(int(std::nearbyint(x[i] * s)), -levels_, levels_);
      codes[at + size_t(i / per_byte)] |= uint8_t((c + levels_) << (bits_ * (i % per_byte)));
    }
  }
}

bool RtnSegment::append_token(const float* k, const float* v, int32_t pos) {
  quantize(k, k_codes_, k_steps_);
  quantize(v, v_codes_, v_steps_);
  pos_.push_back(pos);
  return true;
}

TokenCodesView RtnSegment::view(bool keys) const {
  return {
      keys ? k_codes_.data() : v_codes_.data(), keys ? k_steps_.data() : v_steps_.data(), size(), d_, bits_, group_};
}

void RtnSegment::logits_group(const float* q, int g, int, float* scores) const {
  token_codes_dot(view(true), q, g, 0, size(), scores, size());
}

void RtnSegment::accumulate_group(const float* p, int g, int, float* acc) const {
  token_codes_axpy(view(false), p, g, size(), 0, d_, acc);
}

void RtnSegment::logits_part(const float* q, int g, int, size_t t0, size_t t1, float* scores, size_t ld) const {
  token_codes_dot(view(true), q, g, t0, t1, scores + t0, ld);
}

void RtnSegment::accumulate_part(const float* p, int g, int, int c0, int c1, float* acc) const {
  token_codes_axpy(view(false), p, g, size(), c0, c1, acc);
}

std::vector<int> RtnSegment::codes(bool keys) const {
  const TokenCodesView c = view(keys);
  std::vector<int> out;
  for (size_t t = 0; t < size(); ++t)
    for (int i = 0; i < d_; ++i) out.push_back(token_code(c, t, i));
  return out;
}

void RtnSegment::reconstruct(std::vector<float>& k, std::vector<float>& v) const {
  const int groups = d_ / group_;
  for (auto [keys, out] : {std::pair{true, &k}, std::pair{false, &v}}) {
    const TokenCodesView c = view(keys);
    out->assign(size() * size_t(d_), 0);
    for (size_t t = 0; t < size(); ++t)
      for (int i = 0; i < d_; ++i)
        (*out)[t * size_t(d_) + size_t(i)] =
            float(token_code(c, t, i)) * half_to_float(c.steps[t * size_t(groups) + size_t(i / group_)]);
  }
}

namespace {

class Rtn final : public Method {
 public:
  void setup() override {
    const int group = int(params().integer("group"));
    group_ = group ? group : model().head_dim;
    RtnSegment check(model().head_dim, std::stoi(params().get("bits")), group_);  // refused now, not mid-sweep
  }

  LayerCache compress(const PrefillView& v, const Budget&) override {
    // Native: one store per KV head, shared by its query heads. Repeat: a copy per query head.
    const int hkv = v.n_kv_heads, d = v.head_dim, stored = stored_heads(), G = stored / hkv;
    LayerCache cache(v.n_heads, stored, d);
    for (int s = 0; s < stored; ++s) {
      auto seg = std::make_unique<RtnSegment>(d, std::stoi(params().get("bits")), group_);
      const size_t g = size_t(s / G), stride = size_t(hkv) * size_t(d);
      for (int t = 0; t < v.n_tokens; ++t)
        seg->append_token(v.k + size_t(t) * stride + g * size_t(d), v.v + size_t(t) * stride + g * size_t(d),
                          v.positions[t]);
      cache.segments(s).push_back(std::move(seg));
    }
    return cache;
  }

 private:
  int group_ = 0;
};

const bool registered = register_method(
    {.name = "rtn",
     .summary = "symmetric per-token round-to-nearest 2/4/8-bit keys and values, every token quantized (KIVI's "
                "SymQuantizer; KVmix Table 3's k-T, v-T)",
     .params = {ParamSpec::choice("bits", "4", {"2", "4", "8"}, "bits of keys and values"),
                ParamSpec::integer("group", 0, 0, 4096,
                                   "channels sharing one scale, dividing head_dim (0: the whole head, one scale per "
                                   "token and head)")},
     .make = [] { return std::make_unique<Rtn>(); },
     .budgeted = false});

}  // namespace
}  // namespace kvb
