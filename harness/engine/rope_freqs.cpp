#include "harness/engine/rope_freqs.hpp"

#include <cmath>
#include <numbers>

namespace kvb {

std::vector<float> rope_inv_freq(const ModelConfig& c) {
  const int d = c.head_dim;
  std::vector<float> f(d / 2);
  const auto base = static_cast<float>(c.rope_theta);
  for (int i = 0; i < d / 2; ++i) {
    const float expo = static_cast<float>(2 * i) / static_cast<float>(d);
    f[i] = 1.0f / std::pow(base, expo);
  }
  const RopeScaling& s = c.rope_scaling;
  if (s.type == RopeScaling::Type::Linear) {
    for (auto& x : f) x = x / static_cast<float>(s.factor);
  } else if (s.type == RopeScaling::Type::Llama3) {
    // Long wavelengths are divided by the factor, short ones kept, and the band between blended.
    const double old_ctx = static_cast<double>(s.original_context);
    const double low_wavelen = old_ctx / s.low_freq_factor;
    const double high_wavelen = old_ctx / s.high_freq_factor;
    for (auto& x : f) {
      const double wavelen = 2 * std::numbers::pi / x;
      if (wavelen > low_wavelen) {
        x = static_cast<float>(x / s.factor);
      } else if (wavelen >= high_wavelen) {
        const double smooth = (old_ctx / wavelen - s.low_freq_factor) / (s.high_freq_factor - s.low_freq_factor);
        x = static_cast<float>((1 - smooth) * x / s.factor + smooth * x);
      }
    }
  }
  if (!c.rope_freq_factors.empty())
    for (int i = 0; i < d / 2; ++i) f[i] = f[i] / c.rope_freq_factors[i];
  return f;
}

}  // namespace kvb
