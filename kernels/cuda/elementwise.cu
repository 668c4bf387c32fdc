// Row-wise and elementwise kernels of the transformer: embedding, RMSNorm, LayerNorm, RoPE, SwiGLU, GELU,
// adds, and the small-batch bf16 matrix-vector product of decoding.
#include <cuda_bf16.h>

#include "kernels/cuda/cuda_kernels.hpp"

namespace kvb::cuda {
namespace {

unsigned blocks_for(size_t n, unsigned threads) {
  const size_t b = (n + threads - 1) / threads;
  return static_cast<unsigned>(b < 65535u * 32u ? b : 65535u * 32u);
}

__device__ float bf16_to_float(uint16_t b) { return __uint_as_float(static_cast<uint32_t>(b) << 16); }

__global__ void f32_to_bf16_kernel(const float* x, uint16_t* y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const __nv_bfloat16 b = __float2bfloat16_rn(x[i]);
    y[i] = *reinterpret_cast<const uint16_t*>(&b);
  }
}

__global__ void embed_kernel(const uint16_t* table, const int32_t* ids, int dim, float* out) {
  const uint16_t* row = table + size_t(ids[blockIdx.x]) * dim;
  float* o = out + size_t(blockIdx.x) * dim;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) o[c] = bf16_to_float(row[c]);
}

// Block-wide sum of one value per thread (blockDim.x a multiple of 32, at most 1024).
__device__ float block_sum(float v) {
  __shared__ float warp_sums[32];
  for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  if (lane == 0) warp_sums[warp] = v;
  __syncthreads();
  const int warps = blockDim.x / 32;
  float total = 0;
  for (int w = 0; w < warps; ++w) total += warp_sums[w];
  __syncthreads();
  return total;
}

__global__ void rmsnorm_kernel(const float* x, const float* w, int dim, float eps, float* y) {
  const float* xr = x + size_t(blockIdx.x) * dim;
  float* yr = y + size_t(blockIdx.x) * dim;
  float ss = 0;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += xr[c] * xr[c];
  ss = block_sum(ss);
  const float r = rsqrtf(ss / static_cast<float>(dim) + eps);
  for (int c = threadIdx.x; c < dim; c += blockDim.x) yr[c] = xr[c] * r * w[c];
}

__global__ void layernorm_kernel(const float* x, const float* w, const float* b, int dim, float eps, float* y) {
  const float* xr = x + size_t(blockIdx.x) * dim;
  float* yr = y + size_t(blockIdx.x) * dim;
  float sum = 0;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) sum += xr[c];
  const float mean = block_sum(sum) / static_cast<float>(dim);
  float ss = 0;
  for (int c = threadIdx.x; c < dim; c += blockDim.x) ss += (xr[c] - mean) * (xr[c] - mean);
  const float r = rsqrtf(block_sum(ss) / static_cast<float>(dim) + eps);
  for (int c = threadIdx.x; c < dim; c += blockDim.x) yr[c] = (xr[c] - mean) * r * w[c] + b[c];
}

__global__ void rope_kernel(float* x, int n, int heads, int d, const int32_t* pos, int32_t pos0, const float* inv_freq,
                            bool interleaved, float sign) {
  const int half = d / 2;
  const size_t total = size_t(n) * heads * half;
  for (size_t idx = blockIdx.x * size_t(blockDim.x) + threadIdx.x; idx < total; idx += size_t(gridDim.x) * blockDim.x) {
    const int i = static_cast<int>(idx % half);
    const size_t row = idx / half;  // token * heads + head
    const int t = static_cast<int>(row / heads);
    const float angle = static_cast<float>(pos ? pos[t] : pos0 + t) * inv_freq[i];
    const float c = static_cast<float>(cos(static_cast<double>(angle)));
    const float s = sign * static_cast<float>(sin(static_cast<double>(angle)));
    float* h = x + row * d;
    const int a = interleaved ? 2 * i : i, b = interleaved ? 2 * i + 1 : i + half;
    const float xa = h[a], xb = h[b];
    h[a] = xa * c - xb * s;
    h[b] = xa * s + xb * c;
  }
}

__global__ void swiglu_kernel(const float* gate, const float* up, size_t n, float* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x) {
    const float g = gate[i];
    out[i] = g / (1.0f + expf(-g)) * up[i];
  }
}

__global__ void gelu_kernel(const float* x, size_t n, float* out) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    out[i] = 0.5f * x[i] * (1.0f + erff(x[i] * 0.70710678118654752f));
}

__global__ void add_kernel(float* x, const float* y, size_t n) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n; i += size_t(gridDim.x) * blockDim.x)
    x[i] += y[i];
}

__global__ void add_bias_kernel(float* y, const float* bias, size_t total, int dim) {
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < total; i += size_t(gridDim.x) * blockDim.x)
    y[i] += bias[i % dim];
}

// One warp per output row, N (<= 4) input rows. Decoding is bound by reading W once, so each lane
// keeps four 16-byte weight loads in flight (streamed past L1) and x comes from the cache.
constexpr int kGemvMaxRows = 4;

__device__ void bf16x8(const uint4& p, float* f) {
  const uint32_t words[4] = {p.x, p.y, p.z, p.w};
  for (int e = 0; e < 4; ++e) {
    f[2 * e] = __uint_as_float(words[e] << 16);
    f[2 * e + 1] = __uint_as_float(words[e] & 0xffff0000u);
  }
}

template <int N>
__device__ void gemv_step(const uint4& packed, const float* x, int in, int j, float* acc) {
  float wf[8];
  bf16x8(packed, wf);
  for (int r = 0; r < N; ++r) {
    const float4 xa = reinterpret_cast<const float4*>(x + size_t(r) * in)[2 * j];
    const float4 xb = reinterpret_cast<const float4*>(x + size_t(r) * in)[2 * j + 1];
    acc[r] += wf[0] * xa.x + wf[1] * xa.y + wf[2] * xa.z + wf[3] * xa.w + wf[4] * xb.x + wf[5] * xb.y + wf[6] * xb.z +
              wf[7] * xb.w;
  }
}

template <int N>
__global__ void gemv_bf16_kernel(const float* x, const uint16_t* w, int in, int out, float* y) {
  const int row = (blockIdx.x * blockDim.x + threadIdx.x) / 32, lane = threadIdx.x % 32;
  if (row >= out) return;
  const uint4* wr = reinterpret_cast<const uint4*>(w + size_t(row) * in);
  float acc[N] = {};
  const int vecs = in / 8;
  int j = lane;
  for (; j + 96 < vecs; j += 128) {
    const uint4 p0 = __ldcs(wr + j), p1 = __ldcs(wr + j + 32), p2 = __ldcs(wr + j + 64), p3 = __ldcs(wr + j + 96);
    gemv_step<N>(p0, x, in, j, acc);
    gemv_step<N>(p1, x, in, j + 32, acc);
    gemv_step<N>(p2, x, in, j + 64, acc);
    gemv_step<N>(p3, x, in, j + 96, acc);
  }
  for (; j < vecs; j += 32) gemv_step<N>(__ldcs(wr + j), x, in, j, acc);
  for (int r = 0; r < N; ++r) {
    float v = acc[r];
    for (int o = 16; o > 0; o >>= 1) v += __shfl_xor_sync(0xffffffffu, v, o);
    if (lane == 0) y[size_t(r) * out + row] = v;
  }
}

__global__ void copy_rows_kernel(const float* const* src, float* const* dst, int width) {
  const float* s = src[blockIdx.x];
  float* d = dst[blockIdx.x];
  for (int c = threadIdx.x; c < width; c += blockDim.x) d[c] = s[c];
}

__global__ void read_sum_kernel(const float4* x, size_t n4, float* out) {
  float acc = 0;
  for (size_t i = blockIdx.x * size_t(blockDim.x) + threadIdx.x; i < n4; i += size_t(gridDim.x) * blockDim.x) {
    const float4 v = x[i];
    acc += v.x + v.y + v.z + v.w;
  }
  acc = block_sum(acc);
  if (threadIdx.x == 0) atomicAdd(out, acc);
}

}  // namespace

void f32_to_bf16(const float* x, uint16_t* y, size_t n, cudaStream_t s) {
  f32_to_bf16_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, y, n);
  check(cudaGetLastError(), "f32_to_bf16");
}

void embed_bf16(const uint16_t* table, const int32_t* ids, int n, int dim, float* out, cudaStream_t s) {
  embed_kernel<<<n, 256, 0, s>>>(table, ids, dim, out);
  check(cudaGetLastError(), "embed");
}

void rmsnorm(const float* x, const float* w, int n, int dim, float eps, float* y, cudaStream_t s) {
  rmsnorm_kernel<<<n, 256, 0, s>>>(x, w, dim, eps, y);
  check(cudaGetLastError(), "rmsnorm");
}

void layernorm(const float* x, const float* w, const float* b, int n, int dim, float eps, float* y, cudaStream_t s) {
  layernorm_kernel<<<n, 256, 0, s>>>(x, w, b, dim, eps, y);
  check(cudaGetLastError(), "layernorm");
}

void rope(float* x, int n, int heads, int d, const int32_t* pos, int32_t pos0, const float* inv_freq, bool interleaved,
          float sign, cudaStream_t s) {
  rope_kernel<<<blocks_for(size_t(n) * heads * (d / 2), 256), 256, 0, s>>>(x, n, heads, d, pos, pos0, inv_freq,
                                                                           interleaved, sign);
  check(cudaGetLastError(), "rope");
}

void swiglu(const float* gate, const float* up, size_t n, float* out, cudaStream_t s) {
  swiglu_kernel<<<blocks_for(n, 256), 256, 0, s>>>(gate, up, n, out);
  check(cudaGetLastError(), "swiglu");
}

void gelu(const float* x, size_t n, float* out, cudaStream_t s) {
  gelu_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, n, out);
  check(cudaGetLastError(), "gelu");
}

void add(float* x, const float* y, size_t n, cudaStream_t s) {
  add_kernel<<<blocks_for(n, 256), 256, 0, s>>>(x, y, n);
  check(cudaGetLastError(), "add");
}

void add_bias(float* y, const float* bias, int n, int dim, cudaStream_t s) {
  add_bias_kernel<<<blocks_for(size_t(n) * dim, 256), 256, 0, s>>>(y, bias, size_t(n) * dim, dim);
  check(cudaGetLastError(), "add_bias");
}

void gemv_bf16(const float* x, const uint16_t* w, int n, int in, int out, float* y, cudaStream_t s) {
  if (n < 1 || n > kGemvMaxRows || in % 8 != 0)
    check(cudaErrorInvalidValue, "gemv_bf16 (needs 1 <= n <= 4 and in a multiple of 8)");
  const int threads = 256, rows_per_block = threads / 32;
  const unsigned blocks = static_cast<unsigned>((out + rows_per_block - 1) / rows_per_block);
  switch (n) {
    case 1:
      gemv_bf16_kernel<1><<<blocks, threads, 0, s>>>(x, w, in, out, y);
      break;
    case 2:
      gemv_bf16_kernel<2><<<blocks, threads, 0, s>>>(x, w, in, out, y);
      break;
    case 3:
      gemv_bf16_kernel<3><<<blocks, threads, 0, s>>>(x, w, in, out, y);
      break;
    default:
      gemv_bf16_kernel<4><<<blocks, threads, 0, s>>>(x, w, in, out, y);
      break;
  }
  check(cudaGetLastError(), "gemv_bf16");
}

void copy_rows(const float* const* src, float* const* dst, int n, int width, cudaStream_t s) {
  if (n == 0) return;
  copy_rows_kernel<<<n, 128, 0, s>>>(src, dst, width);
  check(cudaGetLastError(), "copy_rows");
}

void read_sum(const float* x, size_t n, float* out, cudaStream_t s) {
  read_sum_kernel<<<132 * 8, 512, 0, s>>>(reinterpret_cast<const float4*>(x), n / 4, out);
  check(cudaGetLastError(), "read_sum");
}

}  // namespace kvb::cuda
