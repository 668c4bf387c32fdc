#pragma once
// Causal prefill attention on the CPU with grouped K/V heads: q[n, hq, d], k/v[n, hkv, d] row-major,
// out[n, hq, d]; query i sees keys 0..i. `colsum` (hq x n floats, overwritten; null for none): each
// head's attention probabilities summed over the queries, per key, H2O's accumulated attention.
// A continued prefill (`past` > 0) has n queries at positions past..past + n - 1 over past + n keys:
// k/v hold past + n rows, colsum hq x (past + n) floats summed over these n queries only. On the AVX2
// register tiles a query row's numbers do not depend on which other rows are computed with it, so
// continuing a prefill gives each row exactly what the whole prompt's prefill gives it; through BLAS
// they agree to rounding (BLAS may sum a product's rows differently for another row count).
namespace kvb {

// The reference the fused kernel is tested against: per (head, block of 256 queries) one BLAS product
// for the scores of every visible key, a softmax per row, one product with V. The score block (256 x n
// floats per thread) leaves the caches at long contexts and exp runs apart from the products.
void attention_prefill_blockwise(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d,
                                 float* out, float* colsum, int past = 0);

// Flash-style: per (KV head, tile of positions) the query rows of the whole GQA group, so every key
// and value tile serves its group once; scores and exponentials of one key tile at a time with an
// online softmax, causal tiles past the diagonal skipped; nothing n x n. The output does not depend on
// whether column sums are asked for (a cell's numbers must not depend on which other methods share
// its prefill). For them the tiles' exponentials are kept (rows x n floats per thread, like the
// blockwise score block) and rescaled by each row's final max and sum at the end. The two products of
// each tile run on AVX2 register tiles where the CPU has AVX2 and the head size is a multiple of 16,
// otherwise through BLAS (also when force_portable_kernels is on).
void attention_prefill_fused(const float* q, const float* k, const float* v, int n, int hq, int hkv, int d, float* out,
                             float* colsum, int past = 0);

}  // namespace kvb
