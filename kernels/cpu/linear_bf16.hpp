#pragma once
// Matrix products over bf16 weights (fp32 activations and accumulation): the CPU engine's `bf16`
// weight format, which halves the bytes a decode step reads. Weights are rounded once, to nearest
// even (fp16.hpp: float_to_bf16); activations stay fp32, so the result differs from the fp32 engine
// only by the weights' rounding, on every processor alike (no bf16 dot-product instructions, which
// would round the activations too).
#include <cstdint>

namespace kvb {

// y[n, out] = x[n, in] W[out, in]^T (+ bias[out]), W in bf16. The reference accumulates in double.
void linear_bf16_ref(const float* x, const uint16_t* w, const float* bias, int n, int in, int out, float* y);
// One token (n == 1): a GEMV that streams W once (AVX2 where the processor has it). More tokens:
// W converted to fp32 a block of rows at a time for BLAS sgemm.
void linear_bf16(const float* x, const uint16_t* w, const float* bias, int n, int in, int out, float* y);
// n tokens decoded apart (a batch of sequences): row b of y exactly what linear_bf16 gives token b
// alone, each weight row read from memory once for all n.
void linear_bf16_tokens(const float* x, const uint16_t* w, const float* bias, int n, int in, int out, float* y);

}  // namespace kvb
