#pragma once
// Keys and values kept as coefficients in a per-head basis (uncentered PCA, methods/mixeddimkv/README.md §3):
// k ~ c_k P_k^T, v ~ c_v P_v^T. Bases are nested: rank r uses the first r columns of the widest
// basis, which segments of several ranks share and only one of them pays for. Keys are stored
// post-RoPE (MixedDimKV) or pre-RoPE with RoPE re-applied at each key's position (DynaKV).
#include <cstdint>
#include <memory>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

// Orthonormal columns, row-major [head_dim, rank]. Values may have a centre: v ~ v_mean + c_v P_v^T
// with c_v = (v - v_mean) P_v (MatryoshkaKV's trained mean); empty: uncentred.
struct LowRankBasis {
  int head_dim = 0;
  int rank = 0;
  std::vector<float> k, v;
  std::vector<float> v_mean;
  size_t bytes() const { return (k.size() + v.size() + v_mean.size()) * sizeof(float); }
};

class LowRankSegment final : public Segment {
 public:
  // `rope` is required when keys are pre-RoPE (then logits rotate each reconstructed key).
  LowRankSegment(std::shared_ptr<const LowRankBasis> basis, int k_rank, int v_rank, bool charge_basis,
                 std::shared_ptr<const RopeTable> rope = nullptr);

  std::string format() const override;
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  size_t bytes() const override;
  void logits(const float* q, float* scores) const override;
  void accumulate(const float* p, float* acc) const override;
  bool device_form(DeviceUploader& up, cuda::DecodeSegment& d) const override;
  // Rounds the coefficients to t and charges them, and the basis, at t. The shared basis keeps its fp32
  // numbers (other segments read it).
  void store_as(KvDtype t) override;

  // Projects and appends a token: k (post- or pre-RoPE as configured) and v at full head dimension.
  void append(const float* k, const float* v, int32_t pos);
  // Decoded tokens are projected into this segment too (a model whose every K/V is projected), instead
  // of going to a dense tail.
  void take_decoded_tokens() { takes_decoded_ = true; }
  bool append_token(const float* k, const float* v, int32_t pos) override {
    if (!takes_decoded_) return false;
    append(k, v, pos);
    return true;
  }
  // Dense keys (post-RoPE) and values as attention sees them: the reference for the fast paths.
  void reconstruct(std::vector<float>& k, std::vector<float>& v) const;

  // The stored form, for backends that attend over it directly.
  const LowRankBasis& basis() const { return *basis_; }
  int k_rank() const { return rk_; }
  int key_dims(int /*head_dim*/) const override { return rk_; }
  int v_rank() const { return rv_; }
  const RopeTable* rope() const { return rope_.get(); }  // null: keys stored post-RoPE
  const std::vector<float>& k_coefficients() const { return ck_; }
  const std::vector<float>& v_coefficients() const { return cv_; }

 private:
  std::shared_ptr<const LowRankBasis> basis_;
  int rk_, rv_;
  bool charge_basis_;
  bool takes_decoded_ = false;
  KvDtype dtype_ = KvDtype::F32;
  std::shared_ptr<const RopeTable> rope_;
  std::vector<float> ck_, cv_;  // [n, rk], [n, rv]
  std::vector<int32_t> pos_;
};

// Uncentered PCA basis of the rows of k and v ([n, d] each): eigenvectors of X^T X / n by
// descending eigenvalue, the first `rank` of them (second moment by BLAS and LAPACK's symmetric
// eigensolver, in double). Eigenvector signs are arbitrary; compare bases by their projectors.
LowRankBasis pca_basis(const float* k, const float* v, int n, int d, int rank);
// Reference: the moment by plain loops and cyclic Jacobi rotations.
LowRankBasis pca_basis_ref(const float* k, const float* v, int n, int d, int rank);

}  // namespace kvb
