#pragma once
// Matrix products straight on GGUF weight blocks (Q4_0, Q4_1, Q5_0, Q5_1, Q8_0, and the K-quants Q4_K
// and Q6_K of Q4_K_M files): the CPU engine's `gguf` weight format, which reads the file's quantized bytes at
// each decode step instead of their fp32 expansion. As ggml does for these types, one token's
// activations are quantized to 8 bits per block (of 32: Q8_0 for Q4_0, Q5_0 and Q8_0 weights, Q8_1, which
// also keeps d x sum(q), for Q4_1 and Q5_1; of 256: Q8_K, with the sums of each 16, for the K-quants), the
// block products are exact integer sums, and each is scaled by the blocks' scales.
#include <cstdint>
#include <span>
#include <vector>

#include "kernels/dtype.hpp"

namespace kvb {

bool linear_quant_supports(DType t);

// One row of activations quantized per block of 32 as ggml's quantize_row_q8_0 / q8_1 reference
// does: d = max|x| / 127 (stored as fp16), q = round(x / d) (half away from zero), s = d x sum(q).
struct Q8Row {
  std::vector<float> d, s;    // per block; d and s hold the fp16-rounded values ggml stores
  std::vector<int32_t> qsum;  // per block: sum(q), exact
  std::vector<int8_t> q;
};
void quantize_row_q8(const float* x, int n, Q8Row& out);

// y[o] = sum over blocks of W row o against the quantized x. The reference takes each block's
// integer sum and scales it in double.
void gemv_quant_ref(DType t, const uint8_t* w, const Q8Row& x, int in, int out, float* y);

// One row of activations quantized per block of 256 as ggml's quantize_row_q8_K_ref does: the value
// of largest magnitude maps to -127 (d = max / -127, kept as fp32), q = nearest(x / d) (half to even),
// and bsums holds the sum of each 16 q.
struct Q8KRow {
  std::vector<float> d;
  std::vector<int8_t> q;
  std::vector<int16_t> bsums;
};
void quantize_row_q8_k(const float* x, int n, Q8KRow& out);
// The same for Q4_K and Q6_K rows against Q8_K activations: every sub-block's integer sum, scaled in
// double by the block scales (and, for Q4_K, minus its mins against the activations' sums).
void gemv_kquant_ref(DType t, const uint8_t* w, const Q8KRow& x, int in, int out, float* y);

// How a matrix [rows, cols] of these types is stored for the products below: in tiles of 16 rows whose
// blocks interleave the rows' quants (for the K-quants every word of the block but its fp16 scales) 32 bits
// at a time (a vector register is then one word of 16 rows), the last tile padded with zero rows.
// store_rows writes stored_bytes(t, rows, cols) bytes from the file's blocks; load_rows gives rows
// r0..r0+rows-1 back as the file's blocks (for dequantize), byte for byte.
size_t stored_bytes(DType t, int rows, int cols);
void store_rows(DType t, const uint8_t* blocks, int rows, int cols, uint8_t* dst);
void load_rows(DType t, const uint8_t* stored, int r0, int rows, int cols, uint8_t* blocks);

// y[n, out] = x[n, in] W[out, in]^T (+ bias), W stored by store_rows. One token: x quantized, then a
// GEMV over the blocks (AVX2 where the processor has it). More tokens (prefill): W dequantized a block
// of rows at a time for BLAS sgemm, as ggml hands large batches to BLAS.
void linear_quant(DType t, const uint8_t* w, const float* bias, const float* x, int n, int in, int out, float* y);
// n tokens decoded apart (a batch of sequences): row b of y is exactly what linear_quant gives token b
// alone (its own quantized activations, the same block products), and each weight row is read from
// memory once for all n. Each output is, block by block, the exact integer sum s of the block product,
// then acc = fma(s, d x d_x, acc) (and acc = fma(m, s_x, acc) for the types with a min; for Q4_K
// acc = fma(mins, -(dmin x d_x), acc), mins its exact sum_j m_j sum(q of sub-block j)): the AVX-512, AVX2
// and portable kernels give the same numbers.
void linear_quant_tokens(DType t, const uint8_t* w, const float* bias, const float* x, int n, int in, int out,
                         float* y);

// One of several products of the same activations: y[n, out] = x W^T (+ bias), W of type t stored by store_rows.
struct QuantProduct {
  DType t;
  const uint8_t* w;
  const float* bias;
  int out;
  float* y;
};
// linear_quant_tokens for several matrices against the same n tokens (a layer's q, k and v; its gate and
// up): the tokens quantized once and the tiles of all the matrices shared among the threads in one pass,
// instead of a pass per matrix, each ending in a wait. Each y exactly as linear_quant_tokens gives it.
void linear_quant_tokens_shared(std::span<const QuantProduct> ps, const float* x, int n, int in);

}  // namespace kvb
