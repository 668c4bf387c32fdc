// Causal GQA prefill attention on bf16 tensor cores with fp32 accumulation and softmax: a
// FlashAttention-2 kernel for the output and log-sum-exp, and a second pass that recomputes the
// probabilities from the lse for H2O's column sums. Memory is O(tile), never n x n. The n queries sit
// at positions past..past+n-1 and the keys at 0..past+n-1 (past = 0: a whole prompt; past > 0: a
// prefill continued after a prefix whose keys come first), so query row i sees keys 0..past+i.
#include <cuda_bf16.h>
#include <mma.h>

#include <cfloat>

#include "kernels/cuda/cuda_kernels.hpp"

namespace kvb::cuda {
namespace {

using namespace nvcuda;

constexpr int kTile = 64;  // queries per block and keys per tile
constexpr int kWarps = 4;  // each warp owns 16 query rows
constexpr int kPadH = 8;   // bf16 row padding (WMMA needs ldm % 8 == 0; also spreads banks)
constexpr int kPadF = 4;   // fp32 row padding (ldm % 4 == 0)

template <int D>
struct Smem {
  static constexpr int ldh = D + kPadH;      // Q, K, V rows
  static constexpr int lds = kTile + kPadF;  // S rows
  static constexpr int ldp = kTile + kPadH;  // P rows
  static constexpr int ldo = D + kPadF;      // O rows
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

// ---- Tensor-core flash attention (FlashAttention-2 layout, mma.sync m16n8k16, sm_80 and later) ----
// One block per (query head, 128 queries); 8 warps of 16 query rows each; key tiles of 64 double-
// buffered in shared memory by cp.async. S = QK^T, the softmax and O = PV stay in registers: P is
// reused as the A operand of PV straight from the S accumulators, so no tile goes through shared
// memory except K and V. Inputs are bf16 copies of q, k and v made once per call.
constexpr int kFaRows = 128, kFaKeys = 64, kFaWarps = 8;
constexpr int kFaPad = 8;  // bf16 per row: a 16-byte shift per row keeps ldmatrix free of bank conflicts

template <int D>
struct FaSmem {
  static constexpr int ld = D + kFaPad;
  static constexpr size_t q = 0;
  static constexpr size_t kv = q + sizeof(__nv_bfloat16) * kFaRows * ld;  // [2 stages][K, V][64][ld]
  static constexpr size_t bytes = kv + sizeof(__nv_bfloat16) * 4 * kFaKeys * ld;
};

__device__ __forceinline__ uint32_t smem_addr(const void* p) {
  return static_cast<uint32_t>(__cvta_generic_to_shared(p));
}

// 16 bytes global -> shared, zero-filled when `valid` is false (rows past the prompt).
__device__ __forceinline__ void cp_async16(void* dst, const void* src, bool valid) {
  asm volatile("cp.async.cg.shared.global [%0], [%1], 16, %2;\n" ::"r"(smem_addr(dst)), "l"(src), "r"(valid ? 16 : 0));
}
__device__ __forceinline__ void cp_async_commit() { asm volatile("cp.async.commit_group;\n" ::); }
template <int N>
__device__ __forceinline__ void cp_async_wait() {
  asm volatile("cp.async.wait_group %0;\n" ::"n"(N));
}

__device__ __forceinline__ void ldmatrix_x4(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
__device__ __forceinline__ void ldmatrix_x4_trans(uint32_t (&r)[4], const void* p) {
  asm volatile("ldmatrix.sync.aligned.m8n8.x4.trans.shared.b16 {%0,%1,%2,%3}, [%4];\n"
               : "=r"(r[0]), "=r"(r[1]), "=r"(r[2]), "=r"(r[3])
               : "r"(smem_addr(p)));
}
// c += a b: a 16x16 row-major, b 16x8 column-major, bf16; c 16x8 fp32.
__device__ __forceinline__ void mma_bf16(float (&c)[4], const uint32_t (&a)[4], uint32_t b0, uint32_t b1) {
  asm volatile(
      "mma.sync.aligned.m16n8k16.row.col.f32.bf16.bf16.f32 {%0,%1,%2,%3}, {%4,%5,%6,%7}, {%8,%9}, "
      "{%0,%1,%2,%3};\n"
      : "+f"(c[0]), "+f"(c[1]), "+f"(c[2]), "+f"(c[3])
      : "r"(a[0]), "r"(a[1]), "r"(a[2]), "r"(a[3]), "r"(b0), "r"(b1));
}
// 2^x by the special-function unit (exp2(-inf) = 0, which the masked logits rely on).
__device__ __forceinline__ float fast_exp2(float x) {
  float y;
  asm("ex2.approx.ftz.f32 %0, %1;\n" : "=f"(y) : "f"(x));
  return y;
}
__device__ __forceinline__ uint32_t pack_bf16(float lo, float hi) {
  const __nv_bfloat162 v = __floats2bfloat162_rn(lo, hi);
  return *reinterpret_cast<const uint32_t*>(&v);
}

// Rows [r0, r0 + rows) of head h of x[n, heads, D] (bf16) into shared rows of stride ld.
template <int D, int Rows>
__device__ __forceinline__ void fa_load_rows(const __nv_bfloat16* x, int n, int heads, int h, int r0,
                                             __nv_bfloat16* dst) {
  constexpr int chunks = D / 8;  // 16-byte pieces per row
  for (int idx = threadIdx.x; idx < Rows * chunks; idx += kFaWarps * 32) {
    const int r = idx / chunks, c = (idx % chunks) * 8;
    const bool valid = r0 + r < n;
    const __nv_bfloat16* src = x + (size_t(valid ? r0 + r : 0) * heads + h) * D + c;
    cp_async16(dst + r * FaSmem<D>::ld + c, src, valid);
  }
}

template <int D>
__global__ void __launch_bounds__(kFaWarps * 32)
    flash_prefill_kernel(const __nv_bfloat16* q, const __nv_bfloat16* k, const __nv_bfloat16* v, int n, int past,
                         int hq, int hkv, float scale_log2, float scale, float* out, float* lse) {
  using L = FaSmem<D>;
  constexpr int ld = L::ld;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem + L::q);
  auto* kvs = reinterpret_cast<__nv_bfloat16*>(smem + L::kv);
  auto k_stage = [&](int st) { return kvs + (st * 2) * kFaKeys * ld; };
  auto v_stage = [&](int st) { return kvs + (st * 2 + 1) * kFaKeys * ld; };

  // Heads vary fastest so that the query heads of one KV head run together and share its tiles in
  // L2; the largest query blocks (most keys) start first.
  const int h = blockIdx.x, hk = h / (hq / hkv);
  const int q0 = (gridDim.y - 1 - blockIdx.y) * kFaRows;
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int g = lane / 4, t4 = lane % 4;  // mma fragment coordinates
  const int row0 = q0 + warp * 16;        // this warp's first query (its position is past + row0)
  const int nk = past + n;                // keys

  const int key_end = min(nk, past + q0 + kFaRows);
  const int n_tiles = (key_end + kFaKeys - 1) / kFaKeys;

  fa_load_rows<D, kFaRows>(q, n, hq, h, q0, qs);
  fa_load_rows<D, kFaKeys>(k, nk, hkv, hk, 0, k_stage(0));
  fa_load_rows<D, kFaKeys>(v, nk, hkv, hk, 0, v_stage(0));
  cp_async_commit();

  uint32_t qf[D / 16][4];
  float o[D / 8][4];
#pragma unroll
  for (int j = 0; j < D / 8; ++j) o[j][0] = o[j][1] = o[j][2] = o[j][3] = 0.0f;
  float m_run[2] = {-INFINITY, -INFINITY}, l_run[2] = {0.0f, 0.0f};  // rows g and g + 8

  for (int t = 0; t < n_tiles; ++t) {
    if (t + 1 < n_tiles) {
      const int st = (t + 1) & 1;
      fa_load_rows<D, kFaKeys>(k, nk, hkv, hk, (t + 1) * kFaKeys, k_stage(st));
      fa_load_rows<D, kFaKeys>(v, nk, hkv, hk, (t + 1) * kFaKeys, v_stage(st));
      cp_async_commit();
      cp_async_wait<1>();
    } else {
      cp_async_wait<0>();
    }
    __syncthreads();
    if (t == 0) {
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk)
        ldmatrix_x4(qf[kk], qs + (warp * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * ld + kk * 16 + (lane / 16) * 8);
    }
    const int k0 = t * kFaKeys;
    // Key tiles wholly after this warp's last query add nothing (the first tile never is).
    if (k0 <= past + row0 + 15) {
      const __nv_bfloat16* ks = k_stage(t & 1);
      const __nv_bfloat16* vs = v_stage(t & 1);
      float s[kFaKeys / 8][4];
#pragma unroll
      for (int j = 0; j < kFaKeys / 8; ++j) s[j][0] = s[j][1] = s[j][2] = s[j][3] = 0.0f;
#pragma unroll
      for (int kk = 0; kk < D / 16; ++kk) {
#pragma unroll
        for (int j = 0; j < kFaKeys / 8; j += 2) {
          uint32_t b[4];  // keys 8j..8j+15 by dims 16kk..16kk+15
          ldmatrix_x4(b, ks + (j * 8 + (lane % 8) + (lane / 16) * 8) * ld + kk * 16 + ((lane / 8) % 2) * 8);
          mma_bf16(s[j], qf[kk], b[0], b[1]);
          mma_bf16(s[j + 1], qf[kk], b[2], b[3]);
        }
      }
      // Causal and length mask, only where the tile reaches past this warp's first query.
      if (k0 + kFaKeys - 1 > past + row0 || k0 + kFaKeys > nk) {
#pragma unroll
        for (int j = 0; j < kFaKeys / 8; ++j)
#pragma unroll
          for (int e = 0; e < 4; ++e) {
            const int key = k0 + j * 8 + t4 * 2 + (e & 1), qi = row0 + g + (e >> 1) * 8;
            if (key > past + qi || key >= nk) s[j][e] = -INFINITY;
          }
      }
      float m_new[2], alpha[2];  // m_new: the running max in log2 units
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        float m = m_run[r];
#pragma unroll
        for (int j = 0; j < kFaKeys / 8; ++j) m = fmaxf(m, fmaxf(s[j][2 * r], s[j][2 * r + 1]));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 1));
        m = fmaxf(m, __shfl_xor_sync(0xffffffffu, m, 2));
        m_new[r] = m * scale_log2;  // finite: every row sees key 0 in the first tile
        alpha[r] = fast_exp2(m_run[r] * scale_log2 - m_new[r]);
        m_run[r] = m;
      }
      float psum[2] = {0.0f, 0.0f};
      uint32_t pf[kFaKeys / 16][4];  // P as the A operand of PV, straight from the S layout
#pragma unroll
      for (int j = 0; j < kFaKeys / 8; ++j) {
        // One FFMA and one ex2 per logit: the scale is folded into the exponent.
        const float p0 = fast_exp2(fmaf(s[j][0], scale_log2, -m_new[0]));
        const float p1 = fast_exp2(fmaf(s[j][1], scale_log2, -m_new[0]));
        const float p2 = fast_exp2(fmaf(s[j][2], scale_log2, -m_new[1]));
        const float p3 = fast_exp2(fmaf(s[j][3], scale_log2, -m_new[1]));
        psum[0] += p0 + p1;
        psum[1] += p2 + p3;
        pf[j / 2][(j % 2) * 2] = pack_bf16(p0, p1);
        pf[j / 2][(j % 2) * 2 + 1] = pack_bf16(p2, p3);
      }
#pragma unroll
      for (int r = 0; r < 2; ++r) {
        psum[r] += __shfl_xor_sync(0xffffffffu, psum[r], 1);
        psum[r] += __shfl_xor_sync(0xffffffffu, psum[r], 2);
        l_run[r] = l_run[r] * alpha[r] + psum[r];
      }
#pragma unroll
      for (int j = 0; j < D / 8; ++j) {
        o[j][0] *= alpha[0];
        o[j][1] *= alpha[0];
        o[j][2] *= alpha[1];
        o[j][3] *= alpha[1];
      }
#pragma unroll
      for (int kk = 0; kk < kFaKeys / 16; ++kk) {
#pragma unroll
        for (int j = 0; j < D / 8; j += 2) {
          uint32_t b[4];  // keys 16kk..16kk+15 by dims 8j..8j+15
          ldmatrix_x4_trans(b, vs + (kk * 16 + (lane % 8) + ((lane / 8) % 2) * 8) * ld + j * 8 + (lane / 16) * 8);
          mma_bf16(o[j], pf[kk], b[0], b[1]);
          mma_bf16(o[j + 1], pf[kk], b[2], b[3]);
        }
      }
    }
    __syncthreads();  // this stage is refilled by the next iteration's prefetch
  }

#pragma unroll
  for (int r = 0; r < 2; ++r) {
    const int qi = row0 + g + r * 8;
    if (qi >= n) continue;
    const float inv = 1.0f / l_run[r];
    float* dst = out + (size_t(qi) * hq + h) * D + t4 * 2;
#pragma unroll
    for (int j = 0; j < D / 8; ++j)
      *reinterpret_cast<float2*>(dst + j * 8) = make_float2(o[j][2 * r] * inv, o[j][2 * r + 1] * inv);
    if (t4 == 0) lse[size_t(h) * n + qi] = m_run[r] * scale + logf(l_run[r]);
  }
}

// One block per (64 keys, query head): walks the query tiles from the first query at or after the
// keys, recomputes the probabilities exp(s - lse) and sums them per key over the n queries (positions
// past..past+n-1; colsum[hq, past + n]). Fixed summation order: deterministic.
template <int D>
__global__ void __launch_bounds__(kWarps * 32) colsum_kernel(const float* q, const float* k, const float* lse, int n,
                                                             int past, int hq, int hkv, float scale, float* colsum) {
  using L = Smem<D>;
  extern __shared__ __align__(16) unsigned char smem[];
  auto* qs = reinterpret_cast<__nv_bfloat16*>(smem + L::q);
  auto* ks = reinterpret_cast<__nv_bfloat16*>(smem + L::k);
  auto* ss = reinterpret_cast<float*>(smem + L::s);
  float* warp_cols = reinterpret_cast<float*>(smem + L::o);  // [kWarps, 64]

  const int k0 = blockIdx.x * kTile;
  const int h = blockIdx.y, hk = h / (hq / hkv);
  const int warp = threadIdx.x / 32, lane = threadIdx.x % 32;
  const int nk = past + n;
  load_tile<D>(k, nk, hkv, hk, k0, ks);
  float col0 = 0, col1 = 0;  // this lane's two columns, summed over this warp's rows
  for (int q0 = max(0, k0 - past); q0 < n; q0 += kTile) {
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
      if (k0 + c0 <= past + qi) col0 += __expf(srow[c0] * scale - l);
      if (k0 + c1 <= past + qi) col1 += __expf(srow[c1] * scale - l);
    }
    __syncwarp();
  }
  warp_cols[warp * kTile + lane] = col0;
  warp_cols[warp * kTile + lane + 32] = col1;
  __syncthreads();
  if (threadIdx.x < kTile && k0 + int(threadIdx.x) < nk) {
    float total = 0;
    for (int w = 0; w < kWarps; ++w) total += warp_cols[w * kTile + threadIdx.x];
    colsum[size_t(h) * nk + k0 + threadIdx.x] = total;
  }
}

template <int D>
void launch_prefill(const float* q, const float* k, const float* v, int n, int past, int hq, int hkv, float* out,
                    float* lse, uint16_t* scratch, cudaStream_t s) {
  const size_t nk = size_t(past) + n;
  auto* qb = reinterpret_cast<__nv_bfloat16*>(scratch);
  auto* kb = qb + size_t(n) * hq * D;
  auto* vb = kb + nk * hkv * D;
  f32_to_bf16(q, reinterpret_cast<uint16_t*>(qb), size_t(n) * hq * D, s);
  f32_to_bf16(k, reinterpret_cast<uint16_t*>(kb), nk * hkv * D, s);
  f32_to_bf16(v, reinterpret_cast<uint16_t*>(vb), nk * hkv * D, s);
  const size_t smem = FaSmem<D>::bytes;
  check(cudaFuncSetAttribute(flash_prefill_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize,
                             static_cast<int>(smem)),
        "attention_prefill shared memory");
  const float scale = rsqrtf(static_cast<float>(D));
  const dim3 grid(hq, (n + kFaRows - 1) / kFaRows);
  flash_prefill_kernel<D>
      <<<grid, kFaWarps * 32, smem, s>>>(qb, kb, vb, n, past, hq, hkv, scale * 1.4426950408889634f, scale, out, lse);
  check(cudaGetLastError(), "attention_prefill");
}

template <int D>
void launch_colsum(const float* q, const float* k, const float* lse, int n, int past, int hq, int hkv, float* colsum,
                   cudaStream_t s) {
  const size_t smem = Smem<D>::bytes;
  check(cudaFuncSetAttribute(colsum_kernel<D>, cudaFuncAttributeMaxDynamicSharedMemorySize, static_cast<int>(smem)),
        "attention_colsum shared memory");
  const dim3 grid((past + n + kTile - 1) / kTile, hq);
  colsum_kernel<D><<<grid, kWarps * 32, smem, s>>>(q, k, lse, n, past, hq, hkv, rsqrtf(static_cast<float>(D)), colsum);
  check(cudaGetLastError(), "attention_colsum");
}

}  // namespace

bool attention_prefill_supports(int d) { return d == 64 || d == 128; }

size_t attention_prefill_scratch_bytes(int n, int past, int hq, int hkv, int d) {
  return sizeof(uint16_t) * (size_t(n) * hq + (size_t(past) + n) * 2 * hkv) * d;
}

void attention_prefill(const float* q, const float* k, const float* v, int n, int past, int hq, int hkv, int d,
                       float* out, float* lse, uint16_t* scratch, cudaStream_t s) {
  if (d == 64) return launch_prefill<64>(q, k, v, n, past, hq, hkv, out, lse, scratch, s);
  if (d == 128) return launch_prefill<128>(q, k, v, n, past, hq, hkv, out, lse, scratch, s);
  check(cudaErrorInvalidValue, "attention_prefill: head dim must be 64 or 128");
}

void attention_colsum(const float* q, const float* k, const float* lse, int n, int past, int hq, int hkv, int d,
                      float* colsum, cudaStream_t s) {
  if (d == 64) return launch_colsum<64>(q, k, lse, n, past, hq, hkv, colsum, s);
  if (d == 128) return launch_colsum<128>(q, k, lse, n, past, hq, hkv, colsum, s);
  check(cudaErrorInvalidValue, "attention_colsum: head dim must be 64 or 128");
}

}  // namespace kvb::cuda
