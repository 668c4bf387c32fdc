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
#include <map>
#include <set>
#include <span>
#include <string>
#include <vector>

#include "harness/model/config.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

class ModelFile;

struct LossGradients {
  double loss = 0;     // mean over the targets, natural log
  int n_targets = 0;   // positions with a next token
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
  // in `want` (empty: the loss alone). The backward stops at the lowest layer anything asks for.
  LossGradients compute(std::span<const int32_t> ids, const std::set<std::string>& want);
  double loss(std::span<const int32_t> ids) { return compute(ids, {}).loss; }

  // Tokens of the loss head per chunk (the logits of a chunk are chunk x vocab floats).
  void set_loss_chunk(int tokens) { loss_chunk_ = tokens; }

 private:
  struct Layer;
  struct Tensor {
    std::vector<float> w;
    int rows = 0, cols = 1;
  };
  Tensor& find(const std::string& name);
  const Tensor& find(const std::string& name) const;
  std::string layer_name(int l, const char* what) const;

  ModelConfig cfg_;
  std::map<std::string, Tensor> tensors_;
  RopeTable rope_;
  int loss_chunk_ = 256;
};

}  // namespace kvb
