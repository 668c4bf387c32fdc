#pragma once
// CPU kernels of the transformer. Each has a plain reference (`*_ref`, loops written for clarity)
// and the fast version the engine uses (BLAS GEMM, OpenMP, precomputed tables); tests compare them.
// Layouts are row-major: activations [n_tokens, dim], weights [out, in] (y = x W^T).
#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <vector>

namespace kvb {

// y[n, out] = x[n, in] W[out, in]^T (+ bias[out]).
void linear_ref(const float* x, const float* w, const float* bias, int n, int in, int out, float* y);
void linear(const float* x, const float* w, const float* bias, int n, int in, int out, float* y);
// One token: a GEMV of our own (AVX2 where the processor has it) rather than BLAS sgemv, whose
// per-row rounding depends on how it splits the rows over threads. More tokens: BLAS sgemm.
// linear_tokens: n tokens decoded apart (a batch of sequences), row b exactly what linear gives
// token b alone, each weight row read from memory once for all n.
void linear_tokens(const float* x, const float* w, const float* bias, int n, int in, int out, float* y);

// y[n, out] = x[n, in] W^T (+ bias) for W stored in another format (bf16, quantized blocks):
// `widen(o0, rows, dst)` writes rows [o0, o0 + rows) of W as fp32 into dst; blocks of rows are
// widened, kept in cache, and multiplied by BLAS sgemm in turn.
void linear_widened(const float* x, const float* bias, int n, int in, int out, float* y,
                    const std::function<void(int o0, int rows, float* dst)>& widen);
// y[i, :] += bias for each of n rows.
void add_bias(float* y, const float* bias, int n, int out);

// Row-wise RMSNorm: y = x / sqrt(mean(x^2) + eps) * w.
void rmsnorm_ref(const float* x, const float* w, int n, int dim, float eps, float* y);
void rmsnorm(const float* x, const float* w, int n, int dim, float eps, float* y);

// Row-wise LayerNorm with bias (Falcon): y = (x - mean(x)) / sqrt(var(x) + eps) * w + b, the
// variance biased (divided by dim) as torch.nn.LayerNorm computes it.
void layernorm_ref(const float* x, const float* w, const float* b, int n, int dim, float eps, float* y);
void layernorm(const float* x, const float* w, const float* b, int n, int dim, float eps, float* y);

// out = gelu(x) = x * Phi(x), elementwise, with the exact (erf) Phi of torch.nn.GELU() (Falcon's MLP).
void gelu_ref(const float* x, size_t n, float* out);
void gelu(const float* x, size_t n, float* out);

// out = silu(gate) * up, elementwise. swiglu computes g / (1 + std::exp(-g)) * up in float; its vector
// forms compute std::exp by exp_table, on 16 or 8 lanes.
void swiglu_ref(const float* gate, const float* up, size_t n, float* out);
void swiglu(const float* gate, const float* up, size_t n, float* out);

// e^x by the algorithm of std::exp(float) in glibc 2.27 and later on processors with FMA: x / ln 2 =
// k / 32 + r with k an integer, 2^(k/32) from a table of 32 and the exponent bits, 2^r by a cubic, all in
// double with fused multiply-adds and rounded to float once. Bit for bit std::exp's value there (tested),
// so that a vector form of it gives the numbers of a loop calling std::exp. For |x| < 88; std::exp elsewhere.
float exp_table(float x);

// Rotary embedding in place on x[n, heads, d] for token positions pos[n], given inverse frequencies
// inv_freq[d/2]. Interleaved rotates (2i, 2i+1); NeoX rotates (i, i + d/2).
enum class RopeStyle { Interleaved, NeoX };
void rope_ref(float* x, int n, int heads, int d, const int32_t* pos, std::span<const float> inv_freq, RopeStyle style);

// Precomputed cos/sin per position, the fast path. Like rope_ref (and Hugging Face), the angle is the
// float32 product position x frequency; its cosine and sine are then rounded once from double.
class RopeTable {
 public:
  RopeTable(std::vector<float> inv_freq, RopeStyle style);
  void apply(float* x, int n, int heads, int d, const int32_t* pos) const;
  // The inverse rotation (post-RoPE back to pre-RoPE).
  void apply_inverse(float* x, int n, int heads, int d, const int32_t* pos) const;
  void ensure(int max_pos);  // grows the table; call before apply from a single thread
  RopeStyle style() const { return style_; }
  std::span<const float> inv_freq() const { return inv_freq_; }

 private:
  void rotate_rows(float* x, int n, int heads, int d, const int32_t* pos, float sign) const;
  std::vector<float> inv_freq_;
  RopeStyle style_;
  int rows_ = 0;
  std::vector<float> cos_, sin_;  // [rows, d/2]
};

// Causal multi-head attention with grouped K/V heads, reference: q[nq, Hq, d], k/v[nk, Hkv, d];
// query i sits at position q_pos[i], key j at k_pos[j]; a query sees keys with k_pos <= q_pos.
void attention_ref(const float* q, const float* k, const float* v, int nq, int nk, int hq, int hkv, int d,
                   const int32_t* q_pos, const int32_t* k_pos, float* out);

// x[i] = exp(x[i] * scale - shift), the product rounded to float first (a softmax's scaled logits
// without a pass of their own); the fast version also returns the sum of the results. It applies exp_poly
// (vec_math.hpp: Cody-Waite range reduction, degree-6 minimax polynomial), with AVX-512 or AVX2
// intrinsics where the processor has them (the same numbers and sum; the compiler's vectorisation of
// exp_poly's selects costs 60% more) and vectorised for the widest unit otherwise; within 2 ulp of
// std::exp for x * scale - shift in [-87, 88], 0 below (results under FLT_MIN), saturating at e^88
// above. Softmax only feeds it values <= 0. exp dominates long-context attention, so it needs to be our
// own kernel.
void exp_shifted_ref(float* x, int n, float shift, float scale = 1.0f);
float exp_shifted(float* x, int n, float shift, float scale = 1.0f);

// Softmax over x[n] in place (max-subtracted).
void softmax_inplace(float* x, int n);

}  // namespace kvb
