#pragma once
// MatryoshkaKV's per-head orthogonal projections (README.md §1-§4). For one layer, KV head and kind
// (keys or values), Q = A cayley(X) is a d x d orthogonal matrix whose columns are a nested basis: rank
// r keeps the first r. A is the PCA basis the training starts from and X (zero at the start) the trained
// Cayley parameter. A post-RoPE key k (row vector) becomes k Q_r Q_r^T; a value v becomes
// mu + (v - mu) Q_r Q_r^T with the trained centre mu. The key centre of the reference cancels in softmax
// (README.md §2), so keys carry none.
//
// Row-vector convention throughout: matrices are row-major [d, d].
#include <array>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/model/config.hpp"

namespace kvb {

struct LoadedArtifact;

struct MatryoshkaMap {
  int d = 0;
  std::vector<float> X;       // [d, d] the Cayley parameter (only X - X^T matters)
  std::vector<float> anchor;  // [d, d] the PCA basis (columns) the chart is centred on
  std::vector<float> Q;       // [d, d] anchor cayley(X), kept in step with X by matryoshka_refresh
  std::vector<float> mean;    // [d] values' centre; empty for keys
};

// C = (I - S/2)^-1 (I + S/2) with S = X - X^T, in double (the reference's torch.linalg.solve in fp32).
// Error naming `what` when I - S/2 is singular.
void matryoshka_cayley(const std::vector<float>& X, int d, std::vector<float>& C, const std::string& what);
// d loss / d X from d loss / d C (both [d, d]): with B = I - S/2, dC = B^-1 (dS / 2) (C + I), so
// G_S = B^-T G_C (C + I)^T / 2 and G_X = G_S - G_S^T. Adds to gX.
void matryoshka_cayley_backward(const std::vector<float>& X, const std::vector<float>& C, const std::vector<double>& gC,
                                int d, std::vector<double>& gX);
// Q = anchor cayley(X).
void matryoshka_refresh(MatryoshkaMap& m, const std::string& what);
// d loss / d X from d loss / d Q (through C = cayley(X) and Q = anchor C). Adds to gX.
void matryoshka_map_backward(const MatryoshkaMap& m, const std::vector<double>& gQ, std::vector<double>& gX);

// out = mean + (x - mean) Q_r Q_r^T for n rows of x (row t at x + t * stride, d numbers each); mean may
// be null (zero). out may alias x. BLAS products; the reference in double.
void matryoshka_project(const float* x, int n, int stride, const std::vector<float>& Q, int d, int r, const float* mean,
                        float* out);
void matryoshka_project_ref(const float* x, int n, int stride, const std::vector<float>& Q, int d, int r,
                            const float* mean, float* out);
// Backward of matryoshka_project for the n rows of x (its input) and g = d loss / d out (same layout):
// adds d loss / d Q (only columns < r are touched) to gQ and, when mean is non-null, d loss / d mean to
// gmean; overwrites g with d loss / d x = g Q_r Q_r^T.
void matryoshka_project_backward(const float* x, float* g, int n, int stride, const std::vector<float>& Q, int d, int r,
                                 const float* mean, std::vector<double>& gQ, std::vector<double>* gmean);
void matryoshka_project_backward_ref(const float* x, float* g, int n, int stride, const std::vector<float>& Q, int d,
                                     int r, const float* mean, std::vector<double>& gQ, std::vector<double>* gmean);

// Every layer's maps: [layer][kv head][0 = keys, 1 = values].
struct MatryoshkaWeights {
  int head_dim = 0;
  std::vector<std::vector<std::array<MatryoshkaMap, 2>>> layers;
};

// The PCA of `kvbench calibrate matryoshkakv-pca`: per layer, KV head and kind, the mean and the
// eigenvectors (columns, descending eigenvalue) of the covariance of post-RoPE keys / values.
struct MatryoshkaPca {
  int head_dim = 0;
  struct Entry {
    std::vector<float> basis;         // [d, d]
    std::vector<float> mean;          // [d]
    std::vector<double> eigenvalues;  // descending
  };
  std::vector<std::vector<std::array<Entry, 2>>> layers;
};

// Weights at the PCA (the reference's starting point): anchor = each basis, X = 0, values' centre = their
// mean.
MatryoshkaWeights matryoshka_init(MatryoshkaPca pca);

// Artifact bodies (arrays as base64 float32) and their readers, which check the model's layer and KV
// head counts, head_dim and every array's size, naming the file, layer, head and kind.
inline constexpr const char* kMatryoshkaPcaKind = "matryoshkakv-pca";
inline constexpr const char* kMatryoshkaKind = "matryoshkakv";
nlohmann::json matryoshka_pca_json(const MatryoshkaPca& pca);
MatryoshkaPca matryoshka_pca_from(const LoadedArtifact& a, const ModelConfig& model);
nlohmann::json matryoshka_weights_json(const MatryoshkaWeights& w);
MatryoshkaWeights matryoshka_weights_from(const LoadedArtifact& a, const ModelConfig& model);

}  // namespace kvb
