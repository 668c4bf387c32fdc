#pragma once
// The backward pass: the mean next-token cross-entropy of a sequence and its gradients with respect
// to any chosen model weights, on the CPU in fp32 (kernels/cpu/backward.*). Offline steps use it:
// KVmix's gradient profile (dL/dW_k, dL/dW_v per layer), and trainers of small extra parameters.
//
// Memory plan: the forward keeps only each layer's input (n x hidden floats per layer); the backward
// recomputes one layer's forward at a time from it (per-layer checkpointing), attention rebuilds its
// probabilities block by block from the saved log-sum-exp (O(block x n)), and the loss head runs in
// chunks of tokens, so the logits never exist for the whole sequence at once. For the default model
// at 4K tokens that is ~0.3 GB of checkpoints and ~0.2 GB of per-layer work besides the weights.
#include <cstdint>
#include <functional>
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "harness/model/config.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

class ModelFile;

// A trainable change of every layer's keys and values before attention (DynaKV's maps, MatryoshkaKV's
// projections). forward replaces a layer's k and v [n, n_kv_heads x head_dim] (keys pre-RoPE, or
// post-RoPE when after_rope()) by what attention reads; backward
// receives d loss / d (what forward returned) and overwrites it with d loss / d (forward's input),
// adding the gradients of the hook's own parameters. The backward pass recomputes each layer's
// forward just before that layer's backward (recompute = true), so a hook need keep only its latest
// forward.
class KvTrainHook {
 public:
  virtual ~KvTrainHook() = default;
  virtual void forward(int layer, int n, float* k, float* v, bool recompute) = 0;
  virtual void backward(int layer, int n, float* dk, float* dv) = 0;
  // False for a hook only applied (evaluation): compute() then runs no backward for it.
  virtual bool trainable() const { return true; }
  virtual bool after_rope() const { return false; }
};

// What compute() minimises besides plain next-token cross-entropy. With teacher logits [n, vocab] the
// loss is (1 - kl_weight) CE + kl_weight KL, KL(teacher || model) per position averaged over all n
// positions as MatryoshkaKV's trainer averages it (CE over the n - 1 with a next token).
struct LossOptions {
  std::span<const float> teacher_logits = {};
  double kl_weight = 0;
  std::vector<float>* logits_out = nullptr;  // receives the model's logits [n, vocab]
  // Position t predicts ids[t + target_offset]. Palu's Fisher step passes already shifted labels to a
  // transformers model, which shifts them again: its loss predicts the token two ahead (2).
  int target_offset = 1;
};

struct LossGradients {
  double loss = 0;    // mean over the targets, natural log
  double ce = 0;      // the cross-entropy part (mean over the targets)
  double kl = 0;      // with teacher logits: KL(teacher || model), mean over the positions
  int n_targets = 0;  // positions with a target (n - target_offset)
  // Gradient of each requested weight, in the weight's own layout (GGUF naming; matrices [rows, cols]
  // row-major as the engine holds them: [out, in]).
  std::map<std::string, std::vector<float>> grads;
};

class ModelGradients {
 public:
  explicit ModelGradients(const ModelFile& model);
  const ModelConfig& config() const { return cfg_; }

  // Every trainable tensor, GGUF names (token_embd.weight, blk.N.attn_k.weight, ...).
  std::vector<std::string> tensor_names() const;
  // The fp32 weight (perturbable, e.g. for finite differences); Error naming the valid names if absent.
  std::vector<float>& weight(const std::string& name);
  // [rows, cols] of a tensor (cols = 1 for vectors).
  std::pair<int, int> shape(const std::string& name) const;

  // Loss of predicting ids[t + 1] from ids[0..t] for every t, and the gradients of the weights named
  // in `want` (empty: the loss alone). The backward stops at the lowest layer anything asks for. With
  // a hook, every layer's keys and values pass through it and the backward runs down to layer 0.
  LossGradients compute(std::span<const int32_t> ids, const std::set<std::string>& want, KvTrainHook* hook = nullptr,
                        const LossOptions& options = {});
  double loss(std::span<const int32_t> ids) { return compute(ids, {}).loss; }

  // Layer-local distortion (DynaKV-LL, teacher forcing): the frozen model runs uncompressed; in each
  // layer l the hook changes a copy of K and V, and D_l = mean_t ||y^_t - y_t||^2 / (mean_t ||y_t||^2 +
  // eps), where y and y^ are the attention outputs (after W_o) with the original and the changed K/V.
  // The hook's backward gets d D_l / d (changed k, v) of each layer in turn. Returns D_l per layer.
  std::vector<double> attention_distortion(std::span<const int32_t> ids, KvTrainHook& hook, double eps = 1e-6);

  // Tokens of the loss head per chunk (the logits of a chunk are chunk x vocab floats).
  void set_loss_chunk(int tokens) { loss_chunk_ = tokens; }

 private:
  struct Tensor {
    std::vector<float> w;
    int rows = 0, cols = 1;
  };
  Tensor& find(const std::string& name);
  const Tensor& find(const std::string& name) const;
  std::string layer_name(int l, const char* what) const;
  // One layer's intermediates, kept for its backward.
  struct Work;
  void check_ids(std::span<const int32_t> ids) const;
  // Layer l's forward from its input x (n tokens): the attention half, and the MLP half (writing the
  // layer's output to next unless null).
  void attention_forward_half(int l, const float* x, Work& w, KvTrainHook* hook, bool recompute);
  // The MLP half of layer l (x: the layer's input, which a parallel block's MLP reads).
  void mlp_forward_half(int l, const float* x, Work& w, std::vector<float>* next);
  // The model's norm `name` (without .weight): RMSNorm, or LayerNorm with its bias.
  void norm(const std::string& name, const float* x, int n, float* y) const;
  // Its backward: dx += ..., the weight's (and bias's) gradients where grad(name) gives them.
  using GradOf = std::function<float*(const std::string&)>;
  void norm_backward(const std::string& name, const float* x, const float* dy, int n, float* dx,
                     const GradOf& grad) const;
  std::string mlp_norm_;  // the MLP's norm: attn_norm where the block shares it

  ModelConfig cfg_;
  std::map<std::string, Tensor> tensors_;
  RopeTable rope_;
  int loss_chunk_ = 256;
};

}  // namespace kvb
