// Decode attention over a segmented KV cache: the GPU form of harness/cache/layer_cache.cpp attend().
// Four launches per layer, whatever the mix of formats: logits of every segment (one block per chunk
// of a segment's tokens, all query heads of its group at once), softmax per query head over all its
// segments, probability-weighted value sums per chunk (partials), and a fixed-order reduction of the
// partials (deterministic). Each format reads its own compressed layout; nothing is expanded in memory.
#include <cuda_fp16.h>

#include <cfloat>

#include "kernels/cuda/cuda_kernels.hpp"

namespace kvb::cuda {
namespace {

constexpr int kThreads = 128;
constexpr int kWarps = kThreads / 32;
constexpr int kMaxD = 256;
constexpr int kUnroll = 4;

__device__ float half_to_float(uint16_t h) { return __half2float(__ushort_as_half(h)); }

// Code `slot` of a KVmix word: `bits` bits at bit slot*bits (3-bit slot 10 keeps 2 bits).
__device__ uint32_t code_at(const uint32_t* words, int i, int bits) {
  const int per = bits == 3 ? 11 : 32 / bits;
  const int slot = i % per;
  const uint32_t mask = (bits == 3 && slot == 10) ? 3u : (1u << bits) - 1u;
  return (words[i / per] >> (slot * bits)) & mask;
}

// The pair of channels RoPE rotates together for frequency i, and the rotation of (xa, xb).
__device__ void rope_pair(int i, int d, bool interleaved, int& a, int& b) {
  a = interleaved ? 2 * i : i;
  b = interleaved ? 2 * i + 1 : i + d / 2;
}
__device__ void rope_cos_sin(int32_t pos, const float* inv_freq, int i, float& c, float& s) {
  const float angle = static_cast<float>(pos) * inv_freq[i];
  c = static_cast<float>(cos(static_cast<double>(angle)));
  s = static_cast<float>(sin(static_cast<double>(angle)));
}

// Rebuilds the (post-RoPE) key of token t of a pre-RoPE low-rank segment into buf[d] (one warp).
__device__ void rebuild_prerope_key(const DecodeSegment& sg, int t, int d, const float* inv_freq, bool interleaved,
                                    float* buf) {
  const int lane = threadIdx.x % 32;
  for (int i = lane; i < d; i += 32) {
    float x = 0;
    for (int j = 0; j < sg.rk; ++j) x += sg.k[size_t(t) * sg.rk + j] * sg.basis_k[size_t(i) * sg.R + j];
    buf[i] = x;
  }
  __syncwarp();
  for (int i = lane; i < d / 2; i += 32) {
    int a, b;
    rope_pair(i, d, interleaved, a, b);
    float c, s;
    rope_cos_sin(sg.pos[t], inv_freq, i, c, s);
    const float xa = buf[a], xb = buf[b];
    buf[a] = xa * c - xb * s;
    buf[b] = xa * s + xb * c;
  }
  __syncwarp();
}

__global__ void __launch_bounds__(kThreads) logits_kernel(DecodeLayout L, const float* q) {
  const DecodeSegment& sg = L.segments[blockIdx.y];
  const int t0 = blockIdx.x * kDecodeChunk;
  if (t0 >= sg.n) return;
  const int d = L.d, group = L.hq / L.n_cache_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  __shared__ float qs[kMaxGroup][kMaxD];  // the group's queries, or their projection on the key basis
  __shared__ float keybuf[kWarps][kMaxD];
  const int qdim = sg.kind == kLowRank ? sg.rk : d;
  for (int i = threadIdx.x; i < group * d; i += blockDim.x)
    qs[i / d][i % d] = q[size_t(sg.cache_head * group + i / d) * d + i % d];
  __syncthreads();
  if (sg.kind == kLowRank) {
    // q . (c P^T) = (q P) . c: project each query once.
    __shared__ float proj[kMaxGroup][kMaxD];
    for (int i = threadIdx.x; i < group * sg.rk; i += blockDim.x) {
      const int g = i / sg.rk, j = i % sg.rk;
      float x = 0;
      for (int c = 0; c < d; ++c) x += qs[g][c] * sg.basis_k[size_t(c) * sg.R + j];
      proj[g][j] = x;
    }
    __syncthreads();
    for (int i = threadIdx.x; i < group * sg.rk; i += blockDim.x) qs[i / sg.rk][i % sg.rk] = proj[i / sg.rk][i % sg.rk];
    __syncthreads();
  }
  const float scale = rsqrtf(static_cast<float>(d));
  const int t_end = min(sg.n, t0 + kDecodeChunk);
  auto emit = [&](int t, float* acc) {
    for (int g = 0; g < group; ++g) {
      float x = acc[g];
      for (int o = 16; o > 0; o >>= 1) x += __shfl_xor_sync(0xffffffffu, x, o);
      if (lane == 0) L.scores[size_t(sg.cache_head * group + g) * L.score_stride + sg.offset + t] = x * scale;
    }
  };
  if (sg.kind == kDense || sg.kind == kApproxAffine) {
    // Full-dimension keys, the long-context case: kUnroll tokens per warp so that several rows are in
    // flight at once (decoding is bound by reading the cache).
    for (int tb = t0 + warp * kUnroll; tb < t_end; tb += kWarps * kUnroll) {
      float kv[kUnroll][kMaxD / 32];
      for (int u = 0; u < kUnroll; ++u)
        for (int e = 0, c = lane; c < d; ++e, c += 32) kv[u][e] = tb + u < t_end ? sg.k[size_t(tb + u) * d + c] : 0.0f;
      for (int u = 0; u < kUnroll && tb + u < t_end; ++u) {
        float acc[kMaxGroup];
        for (int g = 0; g < group; ++g) {
          acc[g] = 0;
          for (int e = 0, c = lane; c < d; ++e, c += 32) acc[g] += qs[g][c] * kv[u][e];
        }
        emit(tb + u, acc);
      }
    }
    return;
  }
  for (int t = t0 + warp; t < t_end; t += kWarps) {
    float acc[kMaxGroup];
    for (int g = 0; g < kMaxGroup; ++g) acc[g] = 0;
    switch (sg.kind) {
      case kLowRank:
        for (int j = lane; j < qdim; j += 32) {
          const float kv = sg.k[size_t(t) * sg.rk + j];
          for (int g = 0; g < group; ++g) acc[g] += qs[g][j] * kv;
        }
        break;
      case kLowRankPreRope:
        rebuild_prerope_key(sg, t, d, L.inv_freq, L.interleaved, keybuf[warp]);
        for (int c = lane; c < d; c += 32)
          for (int g = 0; g < group; ++g) acc[g] += qs[g][c] * keybuf[warp][c];
        break;
      case kQuantized: {
        const int tg = t / sg.k_group, ti = t % sg.k_group;
        const int words_per_group = sg.k_group / (sg.k_bits == 3 ? 11 : 32 / sg.k_bits);
        for (int c = lane; c < d; c += 32) {
          const size_t gi = size_t(tg) * d + c;
          const float kv = static_cast<float>(code_at(sg.k_words + gi * words_per_group, ti, sg.k_bits)) *
                               half_to_float(sg.k_scale[gi]) +
                           half_to_float(sg.k_min[gi]);
          for (int g = 0; g < group; ++g) acc[g] += qs[g][c] * kv;
        }
        break;
      }
      default:
        break;
    }
    emit(t, acc);
  }
}

__device__ float block_reduce(float v, bool is_max) {
  __shared__ float buf[32];
  for (int o = 16; o > 0; o >>= 1) {
    const float other = __shfl_xor_sync(0xffffffffu, v, o);
    v = is_max ? fmaxf(v, other) : v + other;
  }
  if (threadIdx.x % 32 == 0) buf[threadIdx.x / 32] = v;
  __syncthreads();
  float r = buf[0];
  for (int w = 1; w < static_cast<int>(blockDim.x / 32); ++w) r = is_max ? fmaxf(r, buf[w]) : r + buf[w];
  __syncthreads();
  return r;
}

__global__ void softmax_kernel(DecodeLayout L) {
  const int h = blockIdx.x, group = L.hq / L.n_cache_heads;
  const int n = L.head_tokens[h / group];
  float* row = L.scores + size_t(h) * L.score_stride;
  float m = -FLT_MAX;
  for (int t = threadIdx.x; t < n; t += blockDim.x) m = fmaxf(m, row[t]);
  m = block_reduce(m, true);
  float sum = 0;
  for (int t = threadIdx.x; t < n; t += blockDim.x) {
    const float e = __expf(row[t] - m);
    row[t] = e;
    sum += e;
  }
  sum = block_reduce(sum, false);
  const float inv = 1.0f / sum;
  for (int t = threadIdx.x; t < n; t += blockDim.x) row[t] *= inv;
}

// partial[g][:] = sum over the chunk's tokens of p_g(t) v_t, in the value space of the format, then
// mapped to the head dimension (low-rank: expand by the value basis; affine: W x + c sum p).
__global__ void __launch_bounds__(kThreads) accumulate_kernel(DecodeLayout L) {
  const DecodeSegment& sg = L.segments[blockIdx.y];
  const int t0 = blockIdx.x * kDecodeChunk;
  if (t0 >= sg.n) return;
  const int d = L.d, group = L.hq / L.n_cache_heads;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int t_end = min(sg.n, t0 + kDecodeChunk);
  const int vdim = sg.kind == kLowRank || sg.kind == kLowRankPreRope ? sg.rv : d;
  constexpr int kPerLane = kMaxD / 32;
  float acc[kMaxGroup][kPerLane];
  float psum[kMaxGroup];
  for (int g = 0; g < kMaxGroup; ++g) {
    psum[g] = 0;
    for (int e = 0; e < kPerLane; ++e) acc[g][e] = 0;
  }
  const float* prow = L.scores + size_t(sg.cache_head * group) * L.score_stride + sg.offset;
  if (sg.kind == kDense) {
    for (int tb = t0 + warp * kUnroll; tb < t_end; tb += kWarps * kUnroll) {
      float vv[kUnroll][kPerLane];
      for (int u = 0; u < kUnroll; ++u)
        for (int e = 0, c = lane; c < d; ++e, c += 32) vv[u][e] = tb + u < t_end ? sg.v[size_t(tb + u) * d + c] : 0.0f;
      for (int u = 0; u < kUnroll && tb + u < t_end; ++u)
        for (int g = 0; g < group; ++g) {
          const float p = prow[size_t(g) * L.score_stride + tb + u];
          psum[g] += p;
          for (int e = 0, c = lane; c < d; ++e, c += 32) acc[g][e] += p * vv[u][e];
        }
    }
  }
  for (int t = t0 + warp; t < t_end && sg.kind != kDense; t += kWarps) {
    float p[kMaxGroup];
    for (int g = 0; g < group; ++g) {
      p[g] = prow[size_t(g) * L.score_stride + t];
      psum[g] += p[g];
    }
    switch (sg.kind) {
      case kLowRank:
      case kLowRankPreRope:
        for (int e = 0, j = lane; j < vdim; ++e, j += 32) {
          const float x = sg.v[size_t(t) * sg.rv + j];
          for (int g = 0; g < group; ++g) acc[g][e] += p[g] * x;
        }
        break;
      case kQuantized: {
        const int cpw = sg.v_bits == 3 ? 11 : 32 / sg.v_bits;
        const int words_per_token = d / cpw, groups = d / sg.v_group;
        for (int e = 0, c = lane; c < d; ++e, c += 32) {
          const int gi = c / sg.v_group, ci = c % sg.v_group;
          const uint32_t* words = sg.v_words + size_t(t) * words_per_token + size_t(gi) * sg.v_group / cpw;
          const float x =
              static_cast<float>(code_at(words, ci, sg.v_bits)) * half_to_float(sg.v_scale[size_t(t) * groups + gi]) +
              half_to_float(sg.v_min[size_t(t) * groups + gi]);
          for (int g = 0; g < group; ++g) acc[g][e] += p[g] * x;
        }
        break;
      }
      case kApproxAffine:
        // Sum the pre-RoPE keys: each lane inverts the rotation of its own channels, reading the
        // partner channel of each pair.
        for (int e = 0, c = lane; c < d; ++e, c += 32) {
          const int i = L.interleaved ? c / 2 : c % (d / 2);
          const bool first = L.interleaved ? c % 2 == 0 : c < d / 2;
          const int partner = L.interleaved ? (first ? c + 1 : c - 1) : (first ? c + d / 2 : c - d / 2);
          float cs, sn;
          rope_cos_sin(sg.pos[t], L.inv_freq, i, cs, sn);
          const float x = sg.k[size_t(t) * d + c], y = sg.k[size_t(t) * d + partner];
          const float pre = first ? x * cs + y * sn : x * cs - y * sn;
          for (int g = 0; g < group; ++g) acc[g][e] += p[g] * pre;
        }
        break;
      default:
        break;
    }
  }

  // Cross-warp sum into shared memory: red[g][c], with channel c owned by lane c % 32.
  __shared__ float red[kMaxGroup][kMaxD];
  __shared__ float red_p[kMaxGroup];
  for (int i = threadIdx.x; i < group * kMaxD; i += blockDim.x) red[i / kMaxD][i % kMaxD] = 0;
  if (threadIdx.x < kMaxGroup) red_p[threadIdx.x] = 0;
  __syncthreads();
  for (int w = 0; w < kWarps; ++w) {
    if (warp == w) {
      for (int g = 0; g < group; ++g) {
        for (int e = 0, c = lane; c < vdim; ++e, c += 32) red[g][c] += acc[g][e];
        if (lane == 0) red_p[g] += psum[g];
      }
    }
    __syncthreads();
  }
  float* out = L.partials + size_t(sg.part + blockIdx.x) * group * d;
  for (int i = threadIdx.x; i < group * d; i += blockDim.x) {
    const int g = i / d, c = i % d;
    float x;
    switch (sg.kind) {
      case kLowRank:
      case kLowRankPreRope: {
        x = 0;
        for (int j = 0; j < sg.rv; ++j) x += red[g][j] * sg.basis_v[size_t(c) * sg.R + j];
        break;
      }
      case kApproxAffine: {
        x = 0;
        for (int j = 0; j < d; ++j) x += sg.w[size_t(c) * d + j] * red[g][j];
        if (sg.c) x += sg.c[c] * red_p[g];
        break;
      }
      default:
        x = red[g][c];
    }
    out[i] = x;
  }
}

__global__ void reduce_kernel(DecodeLayout L, float* out) {
  const int h = blockIdx.x, group = L.hq / L.n_cache_heads, ch = h / group, g = h % group;
  const int begin = L.head_part_begin[ch], end = L.head_part_begin[ch + 1];
  for (int c = threadIdx.x; c < L.d; c += blockDim.x) {
    float x = 0;
    for (int part = begin; part < end; ++part) x += L.partials[(size_t(part) * group + g) * L.d + c];
    out[size_t(h) * L.d + c] = x;
  }
}

}  // namespace

void attention_decode(const DecodeLayout& L, const float* q, float* out, cudaStream_t s) {
  if (L.d > kMaxD || L.d % 32 != 0 || L.hq / L.n_cache_heads > kMaxGroup)
    check(cudaErrorInvalidValue, "attention_decode: head dim must be a multiple of 32 up to 256, group <= 8");
  if (L.n_segments > 0) {
    const dim3 grid(L.max_chunks, L.n_segments);
    logits_kernel<<<grid, kThreads, 0, s>>>(L, q);
    check(cudaGetLastError(), "attention_decode logits");
    softmax_kernel<<<L.hq, 256, 0, s>>>(L);
    check(cudaGetLastError(), "attention_decode softmax");
    accumulate_kernel<<<grid, kThreads, 0, s>>>(L);
    check(cudaGetLastError(), "attention_decode accumulate");
  }
  reduce_kernel<<<L.hq, 128, 0, s>>>(L, out);
  check(cudaGetLastError(), "attention_decode reduce");
}

}  // namespace kvb::cuda
