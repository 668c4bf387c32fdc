#pragma once
// Training DynaKV's maps with kvbench's own backward pass (README.md §8, §9), base model
// frozen:
//   e2e: the paper's objective, CE + alpha R^2 through the whole model, every layer's K and V replaced
//        by their soft-masked reconstructions; trains W, b and (train_basis) U of every layer.
//   ll:  DynaKV-LL, layer-local: sum over layers of D_l + alpha R_l, where D_l is the relative
//        attention-output distortion of layer l under teacher forcing (ModelGradients::
//        attention_distortion) and alpha the shared per-layer price of the retain rate; U frozen at
//        PCA by default.
// The batch's loss is the mean of its sequences' losses, so R^2 is taken per sequence (R of equal-length
// sequences varies little; the PyTorch reference check uses one sequence, where the two agree).
// AdamW with linear warm-up over 2% of the steps then cosine decay, global gradient-norm clipping,
// U^-1 recomputed in double after every step. Checkpoints (weights, Adam moments, step) are written
// every few steps and a rerun with the same options resumes from the last one.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/engine/gradients.hpp"
#include "methods/dynakv/maps.hpp"

namespace kvb {

// How a hook changes K and V: soft (training's mask), hard (inference's prefix of width
// #{m > tau}), or a fixed width r for every token (PCA truncation, the Palu-like baseline).
enum class DynaKvPath { Soft, Hard, Fixed };

// DynaKV's maps as a KvTrainHook: applies a path to every layer's K and V, gathers the soft and hard
// retain rates of the first forward, and, on the soft path, backpropagates into the maps.
class DynaKvHook final : public KvTrainHook {
 public:
  enum class Objective { E2E, LayerLocal };
  DynaKvHook(DynaKvWeights& weights, DynaKvPath path, int fixed_width = 0);

  // The rate term: e2e adds alpha R^2 (R over the sequence, all layers, K and V); layer-local adds
  // alpha R_l per layer.
  // Makes the hook trainable (soft path only); until then it is only applied.
  void set_objective(Objective o, double alpha);
  void set_train_basis(bool on) { train_basis_ = on; }
  // Gradients since the last reset, [layer][K/V]; U^-1's gradient not yet folded into U's.
  std::vector<std::array<DynaKvGrads, 2>>& grads() { return grads_; }
  void reset_grads();
  // Rates of the forwards since reset_stats (first passes only): means over tokens, layers, K and V.
  void reset_stats();
  double soft_rate() const;
  double hard_rate() const;
  // Mean hard rate of one layer (over K and V and tokens), and per kind.
  double hard_rate(int layer, int kind) const;
  // The soft rate R of the current sequence (e2e's R).
  double sequence_soft_rate() const;
  // Seconds spent in the maps (gate and reconstruction) during forwards.
  double seconds() const { return seconds_; }

  void forward(int layer, int n, float* k, float* v, bool recompute) override;
  void backward(int layer, int n, float* dk, float* dv) override;
  bool trainable() const override { return trainable_; }

 private:
  DynaKvWeights& w_;
  DynaKvPath path_;
  int fixed_;
  Objective objective_ = Objective::E2E;
  double alpha_ = 0;
  bool train_basis_ = false;
  bool trainable_ = false;
  int state_layer_ = -1;
  std::array<std::vector<float>, 2> x_;
  std::array<DynaKvGate, 2> gate_;
  std::vector<std::array<DynaKvGrads, 2>> grads_;
  std::vector<std::array<double, 2>> soft_sum_, hard_sum_;
  size_t tokens_ = 0;    // tokens per layer seen by first passes since reset_stats
  double seq_soft_ = 0;  // sum of soft rates of the current sequence (first pass)
  int seq_tokens_ = 0;
  double seconds_ = 0;
};

struct DynaKvTrainOptions {
  std::string mode = "e2e";  // e2e | ll
  double alpha = 1.0;
  int steps = 100;
  int batch = 4;              // sequences per step
  int seq_len = 512;          // tokens per sequence (BOS + text)
  double lr = 1e-2;           // gates (W, b)
  double lr_basis = 1e-4;     // U
  double weight_decay = 0.0;  // AdamW's decoupled decay on W and U
  double clip = 1.0;          // global gradient norm
  bool train_basis = true;
  double init_rate = 0.9;  // initial soft retain rate (bias ramp)
  double tau = 0.1;
  int checkpoint_every = 10;
  bool progress = true;
  nlohmann::json describe() const;
};

// What a validation pass measured on held-out sequences: cross-entropies (and perplexities) of the
// frozen model, of the soft and hard paths, and the retain rates.
struct DynaKvValidation {
  size_t tokens = 0;
  double ce_full = 0, ce_soft = 0, ce_hard = 0;
  double soft_rate = 0, hard_rate = 0;
  std::vector<std::array<double, 2>> layer_hard_rate;  // [layer][K/V]
  nlohmann::json to_json() const;
};

// Held-out cross-entropy and rates of `weights` on `seqs` under `path`; with compare_full also the
// frozen model's own cross-entropy.
DynaKvValidation dynakv_validate(ModelGradients& mg, DynaKvWeights& weights, DynaKvPath path, int fixed_width,
                                 const std::vector<std::vector<int32_t>>& seqs, bool compare_full, bool progress);

// Trains from `init` (the PCA initialisation) on `train`, validates on `held`, and returns the
// artifact body's training section; `weights` holds the result. Resumes from `checkpoint` when it
// exists and was made with the same options; writes it every checkpoint_every steps.
nlohmann::json train_dynakv(ModelGradients& mg, DynaKvWeights& weights, const DynaKvTrainOptions& o,
                            const std::vector<std::vector<int32_t>>& train,
                            const std::vector<std::vector<int32_t>>& held, const std::string& checkpoint);

}  // namespace kvb
