#pragma once
// Random-weight models with the exact shapes of real ones, written as GGUF on the fly: kernels and
// speed can then be tested at 7-8B scale where the real weights are not available. The weights are
// seeded uniform noise scaled by 1/sqrt(fan-in), so activations stay in a realistic range.
#include <cstdint>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"

namespace kvb {

struct ModelShape {
  std::string name;
  // llama, qwen2 (q/k/v bias), qwen3 (q/k norms), falcon (LayerNorm with bias, GELU MLP, parallel
  // block, fused attn_qkv) or phi3 (fused attn_qkv and gate/up)
  std::string arch = "llama";
  int layers = 0, hidden = 0, heads = 0, kv_heads = 0, ffn = 0, vocab = 0, context = 0;
  double rope_theta = 10000.0;
  float rms_eps = 1e-5f;
  bool tied_embeddings = false;
  int head_dim = 0;  // 0: hidden / heads (Qwen3-0.6B's is 128 with 16 heads over 1024)
};

// Llama-3.1-8B, Mistral-7B-v0.2, Qwen2-7B, Qwen3-0.6B/8B/14B, SmolLM2-135M, Falcon-7B and
// Phi-3-mini-4k shapes.
const std::vector<ModelShape>& known_model_shapes();
// Error listing the known names if absent.
const ModelShape& model_shape(const std::string& name);

// Writes a GGUF with `shape`'s tensors in `type` drawn from `seed`: F32, F16, BF16, or Q4_K for the
// types of a Q4_K_M file (Q6_K for attn_v, ffn_down and the output head; every row length a multiple
// of 256). Norm weights are F32.
void write_random_model(const std::string& path, const ModelShape& shape, DType type, uint64_t seed);

}  // namespace kvb
