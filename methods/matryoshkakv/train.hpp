#pragma once
// MatryoshkaKV's training through kvbench's backward pass (README.md §4): the base model frozen, every
// layer's post-RoPE keys and values replaced by their projections at ranks drawn per sequence, and the
// Cayley parameters X and the value centres trained on the reference's objective,
// 0.75 CE + 0.25 KL(teacher || student), the teacher being the unmodified model on the same tokens.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <random>
#include <string>
#include <vector>

#include "harness/engine/gradients.hpp"
#include "methods/matryoshkakv/maps.hpp"

namespace kvb {

// Ranks of every projection: [layer][kv head][K/V].
using MatryoshkaRanks = std::vector<std::vector<std::array<int, 2>>>;
// The same rank everywhere.
MatryoshkaRanks matryoshka_uniform_ranks(const MatryoshkaWeights& w, int rank);
// The reference's draw: each rank uniform over {d/8, 2d/8, ..., d}, independently per layer, head and
// kind (d = 128: 16 * randint(1, 9)).
MatryoshkaRanks matryoshka_sample_ranks(const MatryoshkaWeights& w, std::mt19937_64& rng);

// The projections as a KvTrainHook after RoPE. Trainable hooks accumulate d loss / d Q and d loss /
// d mean (values) of every map until reset_grads.
class MatryoshkaHook final : public KvTrainHook {
 public:
  MatryoshkaHook(MatryoshkaWeights& weights, bool trainable);
  void set_ranks(MatryoshkaRanks r) { ranks_ = std::move(r); }
  void reset_grads();
  // [layer][head][K/V]: d loss / d Q; [layer][head]: d loss / d values' mean.
  std::vector<std::vector<std::array<std::vector<double>, 2>>>& q_grads() { return gq_; }
  std::vector<std::vector<std::vector<double>>>& mean_grads() { return gmean_; }

  bool after_rope() const override { return true; }
  void forward(int layer, int n, float* k, float* v, bool recompute) override;
  void backward(int layer, int n, float* dk, float* dv) override;
  bool trainable() const override { return trainable_; }

 private:
  MatryoshkaWeights& w_;
  bool trainable_;
  MatryoshkaRanks ranks_;
  int state_layer_ = -1;
  std::vector<float> xk_, xv_;  // the latest forward's inputs
  std::vector<std::vector<std::array<std::vector<double>, 2>>> gq_;
  std::vector<std::vector<std::vector<double>>> gmean_;
};

struct MatryoshkaTrainOptions {
  int steps = 100;
  int batch = 4;            // sequences per step (the reference: 64)
  int seq_len = 512;        // tokens per sequence (the reference: up to 2,048)
  double lr = 1e-3;         // AdamW, X and the centres (the reference's key_/value_unitary_transform_lr)
  double kl_weight = 0.25;  // loss = (1 - w) CE + w KL
  double clip = 1.0;        // global gradient norm
  int warmup = 10;          // linear warm-up steps, then cosine decay (the reference: 100)
  uint64_t seed = 0;        // of the rank draws
  int checkpoint_every = 10;
  bool progress = true;
  nlohmann::json describe() const;
};

// Held-out cross-entropy of the full model and, per rank ratio, of the projections (CE and KL to the
// full model, per token).
nlohmann::json matryoshka_validate(ModelGradients& mg, MatryoshkaWeights& weights, const std::vector<double>& ratios,
                                   const std::vector<std::vector<int32_t>>& seqs, bool progress);

// Trains `weights` (from the PCA initialisation) on `train`, resuming from `checkpoint` when it exists
// and was made with the same options, and writing it every checkpoint_every steps. Returns the
// artifact's training section (options, history, seconds).
nlohmann::json train_matryoshka(ModelGradients& mg, MatryoshkaWeights& weights, const MatryoshkaTrainOptions& o,
                                const std::vector<std::vector<int32_t>>& train, const std::string& checkpoint);

}  // namespace kvb
