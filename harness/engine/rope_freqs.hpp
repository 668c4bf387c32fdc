#pragma once
// RoPE inverse frequencies of a model: theta, head dimension, and the scaling the config declares
// (linear, Llama 3, or per-frequency factors stored in a GGUF file).
#include <vector>

#include "harness/model/config.hpp"

namespace kvb {

// Computed in float32 with the operation order of Hugging Face's rotary embedding, so that angles
// round the same way as in the reference implementation.
std::vector<float> rope_inv_freq(const ModelConfig& c);

}  // namespace kvb
