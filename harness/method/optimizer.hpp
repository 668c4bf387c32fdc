#pragma once
// What the offline training steps share (DynaKV's maps, MatryoshkaKV's projections): AdamW on fp32
// parameters and a learning-rate schedule of linear warm-up then cosine decay.
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

// A training run's checkpoint at `path` when it exists (null otherwise): JSON whose "options" must equal
// `options`, so that a rerun resumes only the run it continues. Errors say how to start over.
nlohmann::json read_checkpoint(const std::string& path, const nlohmann::json& options);

}  // namespace kvb
