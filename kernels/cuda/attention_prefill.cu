// Causal GQA prefill attention, FlashAttention-2 style: one block per (64 queries, query head), key
// tiles of 64 streamed through shared memory, QK^T and PV on bf16 tensor cores (WMMA) with fp32
// accumulation, the online softmax in fp32. Memory is O(tile), never n x n.
#include <cuda_bf16.h>
#include <mma.h>

#include <cfloat>

#include "kernels/cuda/cuda_kernels.hpp"

namespace kvb::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = 64;    // queries per block and keys per tile
constexpr int kWarps = 4;    // each warp owns 16 query rows
constexpr int kPadH = 8;     // bf16 row padding (WMMA needs ldm % 8 == 0; also spreads banks)
constexpr int kPadF = 4;     // fp32 row padding (ldm % 4 == 0)

template <int D>
struct Smem {
  static constexpr int ldh = D + kPadH;        // Q, K, V rows
  static constexpr int lds = kTile + kPadF;    // S rows
  static constexpr int ldp = kTile + kPadH;    // P rows
  static constexpr int ldo = D + kPadF;        // O rows
  static constexpr size_t q = 0;
  static constexpr size_t k = q + sizeof(__nv_bfloat16) * kTile * ldh;
  static constexpr size_t v = k + sizeof(__nv_bfloat16) * kTile * ldh;
  static constexpr size_t s = v + sizeof(__nv_bfloat16) * kTile * ldh;
  static constexpr size_t p = s + sizeof(float) * kTile * lds;
  static constexpr size_t o = p + sizeof(__nv_bfloat16) * kTile * ldp;
  static constexpr size_t stats = o + sizeof(float) * kTile * ldo;
  static constexpr size_t bytes = stats + sizeof(float) * 2 * kTile;
};

// Loads rows [r0, r0 + 64) of head h from x[n, heads, D] into bf16 shared memory (zeros past n).
template <int D>
__device__ void load_tile(const float* x, int n, int heads, int h, int r0, __nv_bfloat16* dst) {
  constexpr int ld = Smem<D>::ldh;
  for (int idx = threadIdx.x; idx < kTile * D / 4; idx += blockDim.x) {
    const int r = idx / (D / 4), c = (idx % (D / 4)) * 4;
    float4 val = make_float4(0, 0, 0, 0);
    if (r0 + r < n) val = *reinterpret_cast<const float4*>(x + (size_t(r0 + r) * heads + h) * D + c);
    __nv_bfloat16* o = dst + r * ld + c;
    o[0] = __float2bfloat16_rn(val.x);
    o[1] = __float2bfloat16_rn(val.y);
    o[2] = __float2bfloat16_rn(val.z);
    o[3] = __float2bfloat16_rn(val.w);
  }
}

// S[16 rows of this warp][64 keys] = Q_w K^T (unscaled), into fp32 shared memory.
template <int D>
__device__ void warp_qk(const __nv_bfloat16* qs, const __nv_bfloat16* ks, float* s, int warp) {
  constexpr int ldh = Smem<D>::ldh, lds = Smem<D>::lds;
  for (int j = 0; j < kTile / 16; ++j) {
    wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
    wmma::fill_fragment(acc, 0.0f);
    for (int kk = 0; kk < D / 16; ++kk) {
      wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
      wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::col_major> b;
      wmma::load_matrix_sync(a, qs + warp * 16 * ldh + kk * 16, ldh);
      wmma::load_matrix_sync(b, ks + j * 16 * ldh + kk * 16, ldh);  // K^T: column j of B is key row j
      wmma::mma_sync(acc, a, b, acc);
    }
    wmma::store_matrix_sync(s + warp * 16 * lds + j * 16, acc, lds, wmma::mem_row_major);
  }
}

template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    flash_prefill_kernel(const float* q, const float* k, const float* v, int n, int hq, int hkv, float scale,
                         float* out, float* lse) {
  using L = Smem<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem + L::q);
  auto* ks = reinterpret_cast<__nv_bfloat16*>(smem + L::k);
  auto* vs = reinterpret_cast<__nv_bfloat16*>(smem + L::v);
  auto* ss = reinterpret_cast<float*>(smem + L::s);
  auto* ps = reinterpret_cast<__nv_bfloat16*>(smem + L::p);
  auto* os = reinterpret_cast<float*>(smem + L::o);
  float* row_max = reinterpret_cast<float*>(smem + L::stats);
  float* row_sum = row_max + kTile;

  // Largest query blocks (most keys) first.
  const int q0 = (gridDim.x - 1 - blockIdx.x) * kTile;
  const int h = blockIdx.y, hk = h / (hq / hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;

  load_tile<D>(q, n, hq, h, q0, qs);
  for (int i = threadIdx.x; i < kTile * L::ldo; i += blockDim.x) os[i] = 0.0f;
  for (int i = threadIdx.x; i < kTile; i += blockDim.x) {
    row_max[i] = -FLT_MAX;
    row_sum[i] = 0.0f;
  }

  const int key_end = min(n, q0 + kTile);
  // Two lanes per row: lane owns row warp*16 + lane/2, columns [half*32, half*32 + 32).
  const int r = warp * 16 + lane / 2, half = lane % 2;
  const int qi = q0 + r;
  for (int k0 = 0; k0 < key_end; k0 += kTile) {
    __syncthreads();  // previous tile's K/V no longer read
    load_tile<D>(k, n, hkv, hk, k0, ks);
    load_tile<D>(v, n, hkv, hk, k0, vs);
    __syncthreads();
    warp_qk<D>(qs, ks, ss, warp);
    __syncwarp();

    float* srow = ss + r * L::lds + half * 32;
    float m_tile = -FLT_MAX;
    for (int c = 0; c < 32; ++c) {
      const int kj = k0 + half * 32 + c;
      const float val = (kj <= qi && kj < n) ? srow[c] * scale : -FLT_MAX;
      srow[c] = val;
      m_tile = fmaxf(m_tile, val);
    }
    m_tile = fmaxf(m_tile, __shfl_xor_sync(0xffffffffu, m_tile, 1));
    const float m_old = row_max[r];
    const float m_new = fmaxf(m_old, m_tile);
    const float alpha = __expf(m_old - m_new);
    float psum = 0;
    __nv_bfloat16* prow = ps + r * L::ldp + half * 32;
    for (int c = 0; c < 32; ++c) {
      const float p = srow[c] == -FLT_MAX ? 0.0f : __expf(srow[c] - m_new);
      psum += p;
      prow[c] = __float2bfloat16_rn(p);
    }
    psum += __shfl_xor_sync(0xffffffffu, psum, 1);
    float* orow = os + r * L::ldo + half * (D / 2);
    for (int c = 0; c < D / 2; ++c) orow[c] *= alpha;
    __syncwarp();
    if (half == 0) {
      row_max[r] = m_new;
      row_sum[r] = row_sum[r] * alpha + psum;
    }

    // O_w += P_w V over this tile.
    for (int j = 0; j < D / 16; ++j) {
      wmma::fragment<wmma::accumulator, 16, 16, 16, float> acc;
      float* otile = os + warp * 16 * L::ldo + j * 16;
      wmma::load_matrix_sync(acc, otile, L::ldo, wmma::mem_row_major);
      for (int kk = 0; kk < kTile / 16; ++kk) {
        wmma::fragment<wmma::matrix_a, 16, 16, 16, __nv_bfloat16, wmma::row_major> a;
        wmma::fragment<wmma::matrix_b, 16, 16, 16, __nv_bfloat16, wmma::row_major> b;
        wmma::load_matrix_sync(a, ps + warp * 16 * L::ldp + kk * 16, L::ldp);
        wmma::load_matrix_sync(b, vs + kk * 16 * L::ldh + j * 16, L::ldh);
        wmma::mma_sync(acc, a, b, acc);
      }
      wmma::store_matrix_sync(otile, acc, L::ldo, wmma::mem_row_major);
    }
    __syncwarp();
  }

  if (qi < n) {
    const float inv = 1.0f / row_sum[r];
    float* dst = out + (size_t(qi) * hq + h) * D + half * (D / 2);
    const float* orow = os + r * L::ldo + half * (D / 2);
    for (int c = 0; c < D / 2; ++c) dst[c] = orow[c] * inv;
    if (half == 0) lse[size_t(h) * n + qi] = row_max[r] + logf(row_sum[r]);
  }
}

// One block per (64 keys, query head): walks the query tiles at or after the keys, recomputes the
// probabilities exp(s - lse) and sums them per key. Fixed summation order: deterministic.
template <int D>
__global__ void __launch_bounds__(kWarps * 32)
    colsum_kernel(const float* q, const float* k, const float* lse, int n, int hq, int hkv, float scale,
                  float* colsum) {
  using L = Smem<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem + L::q);
  auto* ks = reinterpret_cast<__nv_bfloat16*>(smem + L::k);
  auto* ss = reinterpret_cast<float*>(smem + L::s);
  float* warp_cols = reinterpret_cast<float*>(smem + L::o);  // [kWarps, 64]

  const int k0 = blockIdx.x * kTile;
  const int h = blockIdx.y, hk = h / (hq / hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  load_tile<D>(k, n, hkv, hk, k0, ks);
  float col0 = 0, col1 = 0;  // this lane's two columns, summed over this warp's rows
  for (int q0 = k0; q0 < n; q0 += kTile) {
    __syncthreads();
    load_tile<D>(q, n, hq, h, q0, qs);
    __syncthreads();
    warp_qk<D>(qs, ks, ss, warp);
    __syncwarp();
    for (int rr = 0; rr < 16; ++rr) {
      const int qi = q0 + warp * 16 + rr;
      if (qi >= n) break;
      const float l = lse[size_t(h) * n + qi];
      const float* srow = ss + (warp * 16 + rr) * L::lds;
      const int c0 = lane, c1 = lane + 32;
      if (k0 + c0 <= qi) col0 += __expf(srow[c0] * scale - l);
      if (k0 + c1 <= qi) col1 += __expf(srow[c1] * scale - l);
    }
    __syncwarp();
  }
  warp_cols[warp * kTile + lane] = col0;
  warp_cols[warp * kTile + lane + 32] = col1;
  __syncthreads();
  if (threadIdx.x < kTile && k0 + threadIdx.x < n) {
    float total = 0;
    for (int w = 0; w < kWarps; ++w) total += warp_cols[w * kTile + threadIdx.x];
    colsum[size_t(h) * n + k0 + threadIdx.x] = total;
  }
}

template <int D>
void launch_prefill(const float* q, const float* k, const float* v, int n, int hq, int hkv, float* out, float* lse,
                    cudaStream_t s) {
  const size_t smem = Smem<D>::bytes;
  check(cudaFuncSetAttribute(flash_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "attention_prefill shared memory");
  const dim3 grid((n + kTile - 1) / kTile, hq);
  flash_prefill_kernel<D><<<grid, kWarps * 32, smem, s>>>(q, k, v, n, hq, hkv, rsqrtf(static_cast<float>(D)),
                                                          out, lse);
  check(cudaGetLastError(), "attention_prefill");
}

template <int D>
void launch_colsum(const float* q, const float* k, const float* lse, int n, int hq, int hkv, float* colsum,
                   cudaStream_t s) {
  const size_t smem = Smem<D>::bytes;
  check(cudaFuncSetAttribute(colsum_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "attention_colsum shared memory");
  const dim3 grid((n + kTile - 1) / kTile, hq);
  colsum_kernel<D><<<grid, kWarps * 32, smem, s>>>(q, k, lse, n, hq, hkv, rsqrtf(static_cast<float>(D)), colsum);
  check(cudaGetLastError(), "attention_colsum");
}

}  // namespace

bool attention_prefill_supports(int d) { return d == 64 || d == 128; }

void attention_prefill(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d, float* out,
                       float* lse, cudaStream_t s) {
  if (d == 64) return launch_prefill<64>(q, k, v, n, hq, hkv, out, lse, s);
  if (d == 128) return launch_prefill<128>(q, k, v, n, hq, hkv, out, lse, s);
  check(cudaErrorInvalidValue, "attention_prefill: head dim must be 64 or 128");
}

void attention_colsum(const float* q, const float* k, const float* lse, int n, int hq, int hkv, int d,
                      float* colsum, cudaStream_t s) {
  if (d == 64) return launch_colsum<64>(q, k, lse, n, hq, hkv, colsum, s);
  if (d == 128) return launch_colsum<128>(q, k, lse, n, hq, hkv, colsum, s);
  check(cudaErrorInvalidValue, "attention_colsum: head dim must be 64 or 128");
}

}  // namespace kvb::cuda
