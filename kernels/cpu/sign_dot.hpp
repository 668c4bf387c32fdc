#pragma once
// Inner products of one vector with many vectors of signs stored as bits (QJL's sketched keys,
// methods/qjl): bit j of byte j / 8 at j % 8, set for +1 and clear for -1.
#include <cstddef>
#include <cstdint>

namespace kvb {

// out[t] = sum_{j < n} (bit j of codes + t * stride ? x[j] : -x[j]) for t < tokens; n a multiple of 8.
// The fast version runs AVX2 on processors that have it (kv_rows.hpp: cpu_has_avx2), a portable loop
// otherwise; the reference sums in double.
void sign_dots(const uint8_t* codes, size_t tokens, size_t stride, const float* x, int n, float* out);
// The same for g vectors x [g, ldx] at once (the codes read once for all): out[j * ldo + t] is what
// sign_dots gives for x + j * ldx, bit for bit (under AVX-512 two bytes of signs a mask on 16 lanes, each
// lane the AVX2 kernel's lane).
void sign_dots_group(const uint8_t* codes, size_t tokens, size_t stride, const float* x, size_t ldx, int g, int n,
                     float* out, size_t ldo);
void sign_dots_ref(const uint8_t* codes, size_t tokens, size_t stride, const float* x, int n, float* out);

}  // namespace kvb
