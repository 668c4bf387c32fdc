#pragma once
// Rows of keys or values stored at a chosen precision (fp32, bf16 or fp16), and the two products
// decode attention takes over them: q . row_t for every row, and sum_t p_t row_t. The papers count
// the uncompressed cache in fp16; storing rows at 16 bits halves what a decode step reads.
//
// Each product has a plain reference (`*_ref`: widen each element, multiply in fp32, sum in double)
// and the fast version the cache uses: BLAS for fp32, and for 16-bit rows an AVX2/F16C kernel picked
// at run time when the processor has it (a portable loop otherwise).
#include <cstddef>
#include <cstdint>
#include <string>
#include <vector>

namespace kvb {

enum class KvDtype : uint8_t { F32, BF16, F16 };

size_t kv_dtype_bytes(KvDtype t);
const char* kv_dtype_name(KvDtype t);  // "fp32", "bf16", "fp16"
// Parses a name of kv_dtype_name; an error lists the valid ones and names `where`.
KvDtype parse_kv_dtype(const std::string& name, const std::string& where);

// dst (n elements of dtype t) from src, round to nearest even.
void kv_encode(KvDtype t, const float* src, size_t n, void* dst);
// dst (n floats) from src stored at dtype t; exact.
void kv_decode(KvDtype t, const void* src, size_t n, float* dst);
// x rounded to dtype t and widened back (x itself for fp32).
float kv_round(KvDtype t, float x);

// out[i] = q . row_i for n rows of d elements. With g > 1, for g queries at once (q [g, d], out [g, ldo],
// ldo = n when 0: the query heads of a GQA group), each row read and widened once for all of them. A
// row's sum does not depend on the others, only on its position modulo 4 (cut runs of rows at multiples
// of 4 and the parts give the whole's numbers).
void kv_rows_dot(KvDtype t, const void* rows, size_t n, int d, const float* q, float* out, int g = 1, size_t ldo = 0);
void kv_rows_dot_ref(KvDtype t, const void* rows, size_t n, int d, const float* q, float* out);
// acc[0..d) += sum_i p[i] row_i; with g > 1, for g weight vectors at once (p [g, ldp], ldp = n when 0;
// acc [g, ld]). Rows lie ld apart (ld = d when 0), so that d may be a run of a wider row's channels
// (rows and acc pointing at its first); each channel's sum is the same chain of operations wherever the
// run starts (fp16 and bf16 rows; fp32 goes to BLAS).
void kv_rows_axpy(KvDtype t, const void* rows, size_t n, int d, const float* p, float* acc, int g = 1, size_t ld = 0,
                  size_t ldp = 0);
void kv_rows_axpy_ref(KvDtype t, const void* rows, size_t n, int d, const float* p, float* acc);

// fp32 rows stored for dot products in channel order: blocks of kOrderBlock rows, channel-major inside a
// block (row i's channel c at blocks[(i / kOrderBlock * d + c) * kOrderBlock + i % kOrderBlock]), the last
// block zero-padded, so that a vector load is one channel of a block's rows.
inline constexpr size_t kOrderBlock = 16;
// Appends row x[d] as row n of blocks (growing it by a block when n starts one); row_of_blocks reads it back.
void append_block_row(std::vector<float>& blocks, size_t n, int d, const float* x);
void row_of_blocks(const float* blocks, size_t i, int d, float* x);

// out[j * ldo + i] = q_j . row_i for rows t0 <= i < t1 of blocks, each summed in channel order with a
// rounded product then a rounded sum per channel, from 0 (std::inner_product's numbers), for g queries
// (q [g, d]). The vector paths run a block's rows side by side in the lanes and several blocks at once
// (independent sums hide the adds' latency), so every path gives the reference's numbers bit for bit.
void blocks_dot_in_order(const float* blocks, size_t t0, size_t t1, int d, const float* q, int g, float* out,
                         size_t ldo);
void blocks_dot_in_order_ref(const float* blocks, size_t t0, size_t t1, int d, const float* q, int g, float* out,
                             size_t ldo);

// out[j * ldo + c] = sum_t w[j * ldw + t] rows[t * d + c] for g weight vectors over n fp32 rows of d, each
// sum from 0 over t in order with a rounded product then a rounded sum (no fused multiply-add); with
// skip_zeros the rows a vector weighs 0 add nothing (not even a signed zero). Under AVX-512, at d = 64 or
// 128, the group's sums stay in registers and each row is read once for the group; every path gives the
// reference's numbers bit for bit.
void rows_weighted_in_order(const float* rows, size_t n, int d, const float* w, size_t ldw, int g, bool skip_zeros,
                            float* out, size_t ldo);
void rows_weighted_in_order_ref(const float* rows, size_t n, int d, const float* w, size_t ldw, int g, bool skip_zeros,
                                float* out, size_t ldo);

// Ragged fp32 rows, packed one after another: row i holds its widths[i] leading values, the rest of its
// ld are zero (a latent cache whose tokens keep different numbers of coordinates). For g weight
// vectors (p [g, n], acc [g, ld]): acc_j += sum_i p_j[i] row_i, each row read once for all of them.
// Every path (AVX-512, AVX2, portable) adds the rows in order with one fused multiply-add per value, so
// all give the same numbers; the reference sums in double.
void ragged_rows_axpy(const float* rows, const uint16_t* widths, size_t n, const float* p, int g, float* acc, int ld);
void ragged_rows_axpy_ref(const float* rows, const uint16_t* widths, size_t n, const float* p, int g, float* acc,
                          int ld);

// Whether the hand-written AVX2 kernels run (KV rows, quantized KV, weight GEMVs, prefill attention's
// register tiles): the processor has AVX2, FMA and F16C, and the portable loops are not forced, by
// force_portable_kernels (tests cover both paths on one machine) or by KVBENCH_KERNELS=portable in the
// environment (a whole run on the portable loops, to compare records across processors).
bool cpu_has_avx2();
// Whether the AVX-512 kernels run where a kernel has them (quantized KV): the processor has AVX-512F
// besides cpu_has_avx2, and neither KVBENCH_KERNELS=avx2 (or portable) nor cap_kernels_at_avx2 holds
// the kernels back. Each AVX-512 kernel gives the numbers of its AVX2 twin bit for bit.
bool cpu_has_avx512();
void force_portable_kernels(bool on);
void cap_kernels_at_avx2(bool on);
// The kernel path a run takes, for its records: "avx512", "avx2" or "portable" for the hand-written
// kernels, and the variant the loader picked for the compiler-vectorised loops (target_clones: avx512f,
// avx2 or default), e.g. "avx512, clones avx512f".
std::string cpu_kernel_path();

}  // namespace kvb
