#pragma once
// Host-side entry points of the CUDA kernels. Everything is asynchronous on `stream`; pointers are
// device memory. Activations are fp32, weights bf16 (stored as raw uint16_t so that this header
// compiles without the CUDA math headers). Each kernel's CPU counterpart in kernels/cpu is its
// reference; tests/test_cuda.cpp compares them.
#include <cuda_runtime_api.h>

#include <cstddef>
#include <cstdint>

#include "kernels/decode_segment.hpp"

namespace kvb::cuda {

// Throws kvb::Error naming `what` when a CUDA call failed.
void check(cudaError_t e, const char* what);

void f32_to_bf16(const float* x, uint16_t* y, size_t n, cudaStream_t s);
// out[i, :] = table[ids[i], :] as fp32.
void embed_bf16(const uint16_t* table, const int32_t* ids, int n, int dim, float* out, cudaStream_t s);
void rmsnorm(const float* x, const float* w, int n, int dim, float eps, float* y, cudaStream_t s);
// Rotary embedding in place on x[n, heads, d]; inv_freq[d/2]. Token t sits at pos[t], or at pos0 + t
// when pos is null (no upload for the usual consecutive positions). The angle is the fp32 product
// position x frequency, its cosine and sine taken in double, as the CPU table does.
void rope(float* x, int n, int heads, int d, const int32_t* pos, int32_t pos0, const float* inv_freq, bool interleaved,
          float sign, cudaStream_t s);
void layernorm(const float* x, const float* w, const float* b, int n, int dim, float eps, float* y, cudaStream_t s);
void swiglu(const float* gate, const float* up, size_t n, float* out, cudaStream_t s);
void gelu(const float* x, size_t n, float* out, cudaStream_t s);
void add(float* x, const float* y, size_t n, cudaStream_t s);
void add_bias(float* y, const float* bias, int n, int dim, cudaStream_t s);
// y[n, out] = x[n, in] W[out, in]^T for small n (decode), reading W once: bandwidth-bound.
void gemv_bf16(const float* x, const uint16_t* w, int n, int in, int out, float* y, cudaStream_t s);

// Causal GQA attention of n queries at positions past..past+n-1 over the keys of positions
// 0..past+n-1, tiled with online softmax (bf16 tensor cores, fp32 accumulation and softmax):
// q[n, hq, d], k/v[past + n, hkv, d] (a continued prefill's past rows first) -> out[n, hq, d]; past = 0
// is a whole prompt. lse[hq, n] receives each query row's log-sum-exp of its scaled logits. d must be
// 64 or 128. `scratch` holds the bf16 copies of q, k and v: attention_prefill_scratch_bytes(n, past, ...).
void attention_prefill(const float* q, const float* k, const float* v, int n, int past, int hq, int hkv, int d,
                       float* out, float* lse, uint16_t* scratch, cudaStream_t s);
size_t attention_prefill_scratch_bytes(int n, int past, int hq, int hkv, int d);
// colsum[hq, past + n]: attention probability each key receives summed over these n queries,
// recomputed from the lse of attention_prefill (H2O's accumulated attention).
void attention_colsum(const float* q, const float* k, const float* lse, int n, int past, int hq, int hkv, int d,
                      float* colsum, cudaStream_t s);
bool attention_prefill_supports(int d);

// Decode attention over a segmented cache (harness/cache/layer_cache.hpp): one query token; the
// segments' descriptors are in kernels/decode_segment.hpp.

// Tokens per block of the decode kernels: a segment of n tokens has ceil(n / kDecodeChunk) partials.
constexpr int kDecodeChunk = 256;
// Largest number of query heads reading one cache head.
constexpr int kMaxGroup = 8;

struct DecodeLayout {
  int hq = 0, n_cache_heads = 0, d = 0;
  int n_segments = 0;
  int max_chunks = 0;  // largest ceil(n / kDecodeChunk) over segments
  int n_parts = 0;
  int score_stride = 0;                      // >= tokens of the longest cache head
  const DecodeSegment* segments = nullptr;   // device [n_segments]
  const int32_t* head_tokens = nullptr;      // device [n_cache_heads]
  const int32_t* head_part_begin = nullptr;  // device [n_cache_heads + 1]: CSR of partials per head
  const float* inv_freq = nullptr;           // device [d/2]
  bool interleaved = false;
  float* scores = nullptr;    // device [hq, score_stride]
  float* partials = nullptr;  // device [n_parts, group, d]
};

// out[hq, d]: softmax over every segment of the query's cache head, scale 1/sqrt(d).
void attention_decode(const DecodeLayout& layout, const float* q, float* out, cudaStream_t s);

// Copies n rows of `width` floats: src[i] -> dst[i] (device arrays of device pointers).
void copy_rows(const float* const* src, float* const* dst, int n, int width, cudaStream_t s);

// Device-wide read bandwidth probe: sums x[n] into *out (bytes read / time is the read bandwidth).
void read_sum(const float* x, size_t n, float* out, cudaStream_t s);

}  // namespace kvb::cuda
