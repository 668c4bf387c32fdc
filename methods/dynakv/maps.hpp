#pragma once
// DynaKV's learned maps (the model-side half of the method; methods/dynakv/dynakv.cpp is the cache side).
// Per layer, separately for keys and values, the pre-RoPE vector x of all KV heads concatenated
// (d = n_kv_heads x head_dim numbers, GGUF row order) is rotated into a basis, x~ = x U; a linear gate
// reads x~ and gives a distribution p = softmax(x~ W + b) over cut-off positions, whose reverse
// cumulative sum m[i] = sum_{j >= i} p[j] is a monotone keep-mask (m[0] = 1). Training multiplies x~
// by m and maps back, x_bar = (x~ . m) U^-1; inference keeps the k = #{i : m[i] > tau} leading
// coordinates of x~ (README.md §1: reverse cumsum, so p[j] is the probability that exactly j + 1 are kept).
//
// Row-vector convention throughout: matrices are row-major [d, d] and act on the right.
#include <array>
#include <nlohmann/json.hpp>
#include <span>
#include <string>
#include <vector>

#include "harness/model/config.hpp"

namespace kvb {

struct LoadedArtifact;

struct DynaKvMap {
  int d = 0;
  std::vector<float> U, U_inv, W, b;  // [d, d], [d, d], [d, d], [d]
};

// The gate's per-token quantities for n tokens, row-major [n, d].
struct DynaKvGate {
  int n = 0, d = 0;
  std::vector<float> xt, p, m;
};

// x~ = x U for the rows of x[n, d] (xt [n, d]).
void dynakv_rotate(const DynaKvMap& map, const float* x, int n, float* xt);
// x~ = x U, p and m for the rows of x[n, d]: BLAS products; the plain reference in double.
void dynakv_gate(const DynaKvMap& map, const float* x, int n, DynaKvGate& g);
void dynakv_gate_ref(const DynaKvMap& map, const float* x, int n, DynaKvGate& g);

// Soft retain rate of one token: sum(m) / d, the expected kept fraction.
double dynakv_soft_rate(const float* m, int d);
// Hard width of one token: the leading coordinates with m > tau, at least 1; tau < 0 keeps all d.
int dynakv_width(const float* m, int d, double tau);

// Training's soft path: x_bar = (x~ . m) U^-1 for the gate's n tokens.
void dynakv_soft_reconstruct(const DynaKvMap& map, const DynaKvGate& g, float* xbar);
// Inference's hard path for one token: out[0..cols) = lat[0..k) U^-1[0..k, col0 .. col0 + cols).
void dynakv_expand(const DynaKvMap& map, const float* lat, int k, int col0, int cols, float* out);
// The hard path for n tokens at once, rows[t] holding widths[t] coordinates: out[n, cols]. A GEMM per
// tile of kDynaKvExpandTile tokens over the tile's widest row, zero-padded (attention rebuilds every
// cached key each step, so this is where decode over a DynaKV cache spends its time: it gives rows in
// order of width, so that little of a tile is padding, and spreads its tiles over the threads);
// dynakv_expand per row is the reference.
inline constexpr size_t kDynaKvExpandTile = 64;
void dynakv_expand_rows(const DynaKvMap& map, std::span<const float* const> rows, std::span<const int> widths, int col0,
                        int cols, float* out);

// Gradient accumulators of one map (U^-1's gradient is kept apart until fold_inverse_grad).
struct DynaKvGrads {
  std::vector<float> U, U_inv, W, b;
  void reset(int d, bool with_basis);
};

// Backward of the soft path of the gate's n tokens. dxbar = d loss / d x_bar [n, d]; rate_grad =
// d loss / d R_tok, the same for every token. Accumulates W and b's gradients and, when train_basis,
// U's (through x~) and U^-1's (through the reconstruction); overwrites dx = d loss / d x unless null.
void dynakv_backward(const DynaKvMap& map, const float* x, const DynaKvGate& g, const float* dxbar, float rate_grad,
                     bool train_basis, DynaKvGrads& grads, float* dx);
void dynakv_backward_ref(const DynaKvMap& map, const float* x, const DynaKvGate& g, const float* dxbar, float rate_grad,
                         bool train_basis, DynaKvGrads& grads, float* dx);
// U^-1 = inv(U) makes d loss / d U gain -U^-T (d loss / d U^-1) U^-T; adds it and clears grads.U_inv.
void fold_inverse_grad(const DynaKvMap& map, DynaKvGrads& grads);

// Recomputes U^-1 in double and casts it (README.md §10); Error naming `what` when U is singular or the
// cast inverse misses ||U U^-1 - I||_max < tol.
void refresh_inverse(DynaKvMap& map, const std::string& what, double tol = 1e-3);
// ||U U^-1 - I||_max in double.
double inverse_error(const DynaKvMap& map);

// All layers' maps: [layer][0 = keys, 1 = values].
struct DynaKvWeights {
  int d = 0;
  double tau = 0.1;
  std::vector<std::array<DynaKvMap, 2>> layers;
};

// The PCA basis of every layer (`kvbench calibrate dynakv-pca`): U0 with orthonormal columns, by
// descending eigenvalue of the uncentred second moment; eigenvalues kept for reports and tests.
struct DynaKvPca {
  int d = 0;
  std::vector<std::array<std::vector<float>, 2>> basis;         // [layer][K/V] U0 [d, d]
  std::vector<std::array<std::vector<double>, 2>> eigenvalues;  // [layer][K/V] descending
};

// Weights initialised from the PCA basis as README.md §7 sets them: U = U0, U^-1 = U0^T, W = 0 and a
// linear ramp b_j = beta j / (d - 1) with beta set so that the initial soft retain rate is `rate`.
DynaKvWeights dynakv_init(const DynaKvPca& pca, double rate, double tau);
// The ramp height beta giving soft rate `rate` with W = 0 (bisection; rate in (1/d, 1)).
double dynakv_bias_ramp(int d, double rate);

// Artifact bodies (JSON, arrays as base64 float32) and their readers; readers check the model's
// layer count and d, every array's size, and (weights) each U^-1 against its U, naming the file,
// layer and K/V in errors.
nlohmann::json dynakv_pca_json(const DynaKvPca& pca);
DynaKvPca dynakv_pca_from(const LoadedArtifact& a, const ModelConfig& model);
nlohmann::json dynakv_weights_json(const DynaKvWeights& w);
DynaKvWeights dynakv_weights_from(const LoadedArtifact& a, const ModelConfig& model);

// The artifact kinds and where `kvbench train dynakv` writes by default (artifacts/dynakv/<fp>.<tag>.json).
inline constexpr const char* kDynaKvPcaKind = "dynakv-pca";
inline constexpr const char* kDynaKvKind = "dynakv";

}  // namespace kvb
