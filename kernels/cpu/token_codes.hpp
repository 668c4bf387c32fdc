#pragma once
// Attention over rows quantized per token, symmetric: each token's d channels as b-bit codes (b = 2, 4
// or 8) packed into bytes low bits first, code c stored as c + levels (levels = 2^(b-1) - 1), and one
// fp16 step per group of `group` channels; a value reads back as c x step (RTN's store, methods/rtn).
#include <cstddef>
#include <cstdint>

namespace kvb {

struct TokenCodesView {
  const uint8_t* codes;   // [tokens][row_bytes()]
  const uint16_t* steps;  // [tokens][d / group], fp16
  size_t tokens;
  int d, bits, group;
  size_t row_bytes() const { return (size_t(d) * size_t(bits) + 7) / 8; }
};

// The signed code of token t, channel i.
int token_code(const TokenCodesView& c, size_t t, int i);

// scores[j * ldo + t - t0] for tokens t in [t0, t1) and the g queries q [g, d]: per token, over the groups
// in order, sum += step x dot with dot the group's q_j[i] x c summed channel by channel, every product and
// sum rounded apart. The reference is that loop; the fast form the same numbers bit for bit.
void token_codes_dot(const TokenCodesView& k, const float* q, int g, size_t t0, size_t t1, float* scores, size_t ldo);
void token_codes_dot_ref(const TokenCodesView& k, const float* q, int g, size_t t0, size_t t1, float* scores,
                         size_t ldo);

// acc[j * d + i] += (p[j * ldp + t] x step) x c over all tokens in order, for channels i in [c0, c1)
// and the g weight vectors p, each product and sum rounded apart (weights of 0 included).
void token_codes_axpy(const TokenCodesView& v, const float* p, int g, size_t ldp, int c0, int c1, float* acc);
void token_codes_axpy_ref(const TokenCodesView& v, const float* p, int g, size_t ldp, int c0, int c1, float* acc);

}  // namespace kvb
