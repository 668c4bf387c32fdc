#pragma once
// Backward kernels of the transformer's next-token loss (used by harness/engine/gradients.*). Each has
// a plain reference (`*_ref`, double accumulation, loops written for clarity) and the fast version
// (BLAS, OpenMP); tests compare the two and check the references against finite differences.
// Layouts as in ops.hpp: activations [n, dim], weights [out, in] with y = x W^T. Gradient outputs
// named d* are accumulated (+=) unless a function says it overwrites them, so that callers can sum
// contributions (q/k/v into one input gradient, chunks of tokens into one weight gradient).
#include <cstddef>
#include <cstdint>
#include <utility>

namespace kvb {

// y = x W^T + b: dx += dy W, dw += dy^T x, db += sum over rows of dy. Any of dx, dw, db may be null.
void linear_backward_ref(const float* x, const float* w, const float* dy, int n, int in, int out, float* dx, float* dw,
                         float* db);
void linear_backward(const float* x, const float* w, const float* dy, int n, int in, int out, float* dx, float* dw,
                     float* db);

// y = x r w with r = 1 / sqrt(mean(x^2) + eps) per row: dx += r (w dy) - x r^3 / dim sum(w dy x),
// dw += sum over rows of dy x r. dw may be null.
void rmsnorm_backward_ref(const float* x, const float* w, const float* dy, int n, int dim, float eps, float* dx,
                          float* dw);
void rmsnorm_backward(const float* x, const float* w, const float* dy, int n, int dim, float eps, float* dx, float* dw);

// y = (x - mean) r w + b with r = 1 / sqrt(var + eps) per row (LayerNorm): with g = w dy and
// xh = (x - mean) r, dx += r (g - mean(g) - xh mean(g xh)), dw += sum over rows of dy xh, db += sum of dy.
// dw and db may be null.
void layernorm_backward_ref(const float* x, const float* w, const float* dy, int n, int dim, float eps, float* dx,
                            float* dw, float* db);
void layernorm_backward(const float* x, const float* w, const float* dy, int n, int dim, float eps, float* dx,
                        float* dw, float* db);

// out = gelu(x) = x Phi(x): overwrites dx = dout (Phi(x) + x phi(x)).
void gelu_backward_ref(const float* x, const float* dout, size_t n, float* dx);
void gelu_backward(const float* x, const float* dout, size_t n, float* dx);

// out = silu(g) u: overwrites dgate = dout u silu'(g) and dup = dout silu(g).
void swiglu_backward_ref(const float* gate, const float* up, const float* dout, size_t n, float* dgate, float* dup);
void swiglu_backward(const float* gate, const float* up, const float* dout, size_t n, float* dgate, float* dup);

// Causal attention of a whole sequence from position 0 with grouped K/V heads, q[n, hq, d] and k/v
// [n, hkv, d] (post-RoPE), softmax(q k^T / sqrt(d)). The forward also writes each row's log-sum-exp
// of the scaled scores, lse[hq, n], which is all the backward needs to rebuild the probabilities
// block by block (memory O(block x n), never n x n).
void attention_forward_ref(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d, float* out,
                           float* lse);
void attention_forward(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d, float* out,
                       float* lse);
// Overwrites dq[n, hq, d], dk and dv [n, hkv, d] (the query heads of a group sum into their KV head).
void attention_backward_ref(const float* q, const float* k, const float* v, const float* out, const float* lse,
                            const float* dout, int n, int hq, int hkv, int d, float* dq, float* dk, float* dv);
void attention_backward(const float* q, const float* k, const float* v, const float* out, const float* lse,
                        const float* dout, int n, int hq, int hkv, int d, float* dq, float* dk, float* dv);

// Cross-entropy of logits[n, vocab] against targets[n] (a target < 0 is ignored): returns the sum of
// the row losses (natural log) and overwrites dlogits = (softmax - onehot) * grad_scale (zero rows for
// ignored targets). dlogits may alias logits.
double cross_entropy_ref(const float* logits, const int32_t* targets, int n, int vocab, float grad_scale,
                         float* dlogits);
double cross_entropy(const float* logits, const int32_t* targets, int n, int vocab, float grad_scale, float* dlogits);

// Distillation (MatryoshkaKV's objective) of logits[n, vocab] towards a teacher's logits: with p the
// softmax of a row and p_t the teacher's, the row's cross-entropy ce = lse - logits[target] (rows with
// target >= 0) and kl = KL(p_t || p) = sum p_t (log p_t - log p). Returns {sum ce, sum kl} and
// overwrites dlogits = ce_scale (p - onehot) + kl_scale (p - p_t) (no ce term for ignored targets).
// dlogits may alias logits.
std::pair<double, double> distill_loss_ref(const float* logits, const float* teacher, const int32_t* targets, int n,
                                           int vocab, float ce_scale, float kl_scale, float* dlogits);
std::pair<double, double> distill_loss(const float* logits, const float* teacher, const int32_t* targets, int n,
                                       int vocab, float ce_scale, float kl_scale, float* dlogits);

// Embedding lookup out[t] = table[ids[t]]: dtable[ids[t]] += dout[t] (a scatter-add; rows repeat).
void embed_backward(const int32_t* ids, int n, int dim, const float* dout, float* dtable);

}  // namespace kvb
