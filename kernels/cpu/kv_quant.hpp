#pragma once
// Asymmetric min/max quantization of KV-cache groups and KVmix's bit packing into 32-bit words:
// b = 1, 2, 4 bits pack 32/b codes per word; b = 3 packs 11 codes, slots 0-9 with 3 bits and slot 10
// with 2 bits (bits 30-31), the whole group sharing one scale computed for 3 bits
// (methods/kvmix/README.md §2-§3). Scales and minimums are stored as fp16.
#include <cstddef>
#include <cstdint>

namespace kvb {

// Codes per 32-bit word for a bit width.
int codes_per_word(int bits);
// Largest code of slot `slot` of a word (3-bit slot 10 holds only 0..3).
uint32_t max_code(int bits, int slot);

// Quantizes n values x[i * stride] into codes, returning the fp16 scale and minimum. The scale is
// (max - min) / (2^b - 1) in fp32; a constant group gets scale 0 and all-zero codes.
void quantize_group(const float* x, int n, int stride, int bits, uint32_t* codes, uint16_t& scale, uint16_t& minimum);
// Packs n codes into ceil(n / codes_per_word) words; unpacks them back.
void pack_codes(const uint32_t* codes, int n, int bits, uint32_t* words);
void unpack_codes(const uint32_t* words, int n, int bits, uint32_t* codes);

// Keys quantized per channel along tokens: words [token group][channel][group / per words], scale and
// min [token group][channel]; `tokens` a multiple of `group`.
struct QuantKeysView {
  const uint32_t* words;
  const uint16_t *scale, *min;
  size_t tokens;
  int d, bits, group;
};
// Values quantized per token along channels: words [token][d / per words], scale and min
// [token][d / group].
struct QuantValuesView {
  const uint32_t* words;
  const uint16_t *scale, *min;
  size_t tokens;
  int d, bits, group;
};

// scores[t] = q . k^_t, fused: q folded into each channel's scale and minimum, codes read in place.
// The fast version runs AVX2 on processors that have it (kv_rows.hpp: cpu_has_avx2), a portable loop
// otherwise; the reference dequantizes each key and takes the dot product in double. With g > 1, for g
// queries at once (q [g, d], scores [g, ldo], ldo = tokens when 0: the query heads of a GQA group), the
// codes unpacked once for all of them; each query's sums are those it gets alone, and each token's does
// not depend on the others (a view of some of the token groups gives the whole's numbers for them).
void quant_keys_dot(const QuantKeysView& k, const float* q, float* scores, int g = 1, size_t ldo = 0);
void quant_keys_dot_ref(const QuantKeysView& k, const float* q, float* scores);
// acc[0..d) += sum_t p[t] v^_t, fused: each probability folded into its token's scales.
// With g > 1, for g weight vectors at once (p [g, ldp], ldp = tokens when 0; acc [g, d]). Only channels
// [c0, c1) (c1 = d when 0; both on channel-group boundaries), each with the numbers the whole gives it.
void quant_values_axpy(const QuantValuesView& v, const float* p, float* acc, int g = 1, int c0 = 0, int c1 = 0,
                       size_t ldp = 0);
void quant_values_axpy_ref(const QuantValuesView& v, const float* p, float* acc);

}  // namespace kvb
