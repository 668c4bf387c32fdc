#include "kernels/cpu/kv_quant.hpp"

#include <algorithm>
#include <cmath>

#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"

namespace kvb {

int codes_per_word(int bits) {
  switch (bits) {
    case 1: return 32;
    case 2: return 16;
    case 3: return 11;
    case 4: return 8;
    default: fail("KV quantization supports 1, 2, 3 or 4 bits, not {}", bits);
  }
}

uint32_t max_code(int bits, int slot) {
  if (bits == 3 && slot % 11 == 10) return 3;
  return (1u << bits) - 1;
}

namespace {
inline int bit_offset(int bits, int slot) { return slot * bits; }  // 3-bit slot 10 starts at bit 30
}  // namespace

void quantize_group(const float* x, int n, int stride, int bits, uint32_t* codes, uint16_t& scale,
                    uint16_t& minimum) {
  float mn = x[0], mx = x[0];
  for (int i = 1; i < n; ++i) {
    mn = std::min(mn, x[size_t(i) * stride]);
    mx = std::max(mx, x[size_t(i) * stride]);
  }
  const float qmax = static_cast<float>((1u << bits) - 1);
  const float s = (mx - mn) / qmax;
  scale = float_to_half(s);
  minimum = float_to_half(mn);
  for (int i = 0; i < n; ++i) {
    if (s == 0.0f) {
      codes[i] = 0;
      continue;
    }
    const float q = std::nearbyint((x[size_t(i) * stride] - mn) / s);
    codes[i] = static_cast<uint32_t>(std::clamp(q, 0.0f, static_cast<float>(max_code(bits, i))));
  }
}

void pack_codes(const uint32_t* codes, int n, int bits, uint32_t* words) {
  const int per = codes_per_word(bits);
  for (int w = 0; w < (n + per - 1) / per; ++w) words[w] = 0;
  for (int i = 0; i < n; ++i) words[i / per] |= codes[i] << bit_offset(bits, i % per);
}

void unpack_codes(const uint32_t* words, int n, int bits, uint32_t* codes) {
  const int per = codes_per_word(bits);
  for (int i = 0; i < n; ++i) {
    const int slot = i % per;
    codes[i] = (words[i / per] >> bit_offset(bits, slot)) & max_code(bits, slot);
  }
}

}  // namespace kvb
