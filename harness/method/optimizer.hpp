#pragma once
// What the offline training steps share (DynaKV's maps, MatryoshkaKV's projections): AdamW on fp32
// parameters and a learning-rate schedule of linear warm-up then cosine decay.
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

namespace kvb {

// AdamW state of one tensor.
struct Moments {
  std::vector<float> m, v;
};

// One AdamW step (beta 0.9, 0.999, eps 1e-8; decoupled decay) on p with gradient g * gscale; `step`
// counts from 1 (bias correction).
void adamw(std::vector<float>& p, const std::vector<float>& g, Moments& s, double lr, double decay, double gscale,
           int step);

// The learning rate's factor at `step` (from 0) of `steps`: linear warm-up over `warmup` steps (at
// least 1), then a cosine from 1 to 0.
double learning_scale(int step, int steps, int warmup);

// What a training run starts from, as digests: the model (fingerprint), the initial parameters (their
// JSON) and the token sequences it trains and validates on. Part of a checkpoint's "options", so that
// another model, basis or text starts over instead of resuming weights trained on the old ones.
nlohmann::json training_inputs(const std::string& model_fingerprint, const nlohmann::json& initial,
                               const std::vector<std::vector<int32_t>>& train,
                               const std::vector<std::vector<int32_t>>& held);

// A training run's checkpoint at `path` when it exists (null otherwise): JSON whose "options" must equal
// `options`, so that a rerun resumes only the run it continues. Errors name what differs and say how to
// start over.
nlohmann::json read_checkpoint(const std::string& path, const nlohmann::json& options);

}  // namespace kvb
