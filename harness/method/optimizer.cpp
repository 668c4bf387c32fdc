#include "harness/method/optimizer.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <numbers>

#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"

namespace kvb {

double learning_scale(int step, int steps, int warmup) {
  const int warm = std::max(1, warmup);
  if (step < warm) return double(step + 1) / warm;
  const double progress = double(step - warm) / std::max(1, steps - warm);
  return 0.5 * (1 + std::cos(std::numbers::pi * progress));
}

void adamw(std::vector<float>& p, const std::vector<float>& g, Moments& s, double lr, double decay, double gscale,
           int step) {
  constexpr double b1 = 0.9, b2 = 0.999, eps = 1e-8;
  if (s.m.empty()) {
    s.m.assign(p.size(), 0.0f);
    s.v.assign(p.size(), 0.0f);
  }
  const double c1 = 1 - std::pow(b1, step), c2 = 1 - std::pow(b2, step);
  for (size_t i = 0; i < p.size(); ++i) {
    const double gi = double(g[i]) * gscale;
    s.m[i] = static_cast<float>(b1 * s.m[i] + (1 - b1) * gi);
    s.v[i] = static_cast<float>(b2 * s.v[i] + (1 - b2) * gi * gi);
    const double upd = (s.m[i] / c1) / (std::sqrt(s.v[i] / c2) + eps);
    p[i] = static_cast<float>(p[i] * (1 - lr * decay) - lr * upd);
  }
}

nlohmann::json read_checkpoint(const std::string& path, const nlohmann::json& options) {
  if (path.empty() || !std::filesystem::exists(path)) return nullptr;
  std::ifstream in(path);
  nlohmann::json ck;
  try {
    ck = nlohmann::json::parse(std::string((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>()));
  } catch (const nlohmann::json::exception& e) {
    fail("{}: checkpoint is not valid JSON ({}); delete it to start over", path, e.what());
  }
  const nlohmann::json saved = ck.is_object() ? ck.value("options", nlohmann::json()) : nlohmann::json();
  if (saved != options) {
    if (options.contains("inputs") && saved.is_object() && !saved.contains("inputs"))
      fail(
          "{}: a checkpoint from a kvbench that did not record a run's inputs (model, starting parameters, text), so "
          "it cannot tell whether this run continues it; delete it to start over",
          path);  // The options and inputs that differ, by name (inputs.train_tokens: another training text).
    std::vector<std::string> differ;
    for (const auto& [key, value] : options.items()) {
      const nlohmann::json old = saved.is_object() && saved.contains(key) ? saved[key] : nlohmann::json();
      if (old == value) continue;
      if (value.is_object() && old.is_object()) {
        for (const auto& [sub, v] : value.items())
          if (!old.contains(sub) || old[sub] != v) differ.push_back(key + "." + sub);
      } else {
        differ.push_back(key);
      }
    }
    fail(
        "{}: a checkpoint of another training run ({} differ); delete it to start over, or give the same options "
        "and inputs to resume it",
        path, differ.empty() ? std::string("its options") : fmt::format("{}", fmt::join(differ, ", ")));
  }
  return ck;
}

namespace {

std::string sequences_digest(const std::vector<std::vector<int32_t>>& seqs) {
  uint64_t h = fnv1a("");
  for (const auto& s : seqs) {
    h = fnv1a(std::string_view(reinterpret_cast<const char*>(s.data()), s.size() * sizeof(int32_t)), h);
    h = fnv1a("|", h);
  }
  return fmt::format("{:016x}", h);
}

}  // namespace

nlohmann::json training_inputs(const std::string& model_fingerprint, const nlohmann::json& initial,
                               const std::vector<std::vector<int32_t>>& train,
                               const std::vector<std::vector<int32_t>>& held) {
  return {{"model", model_fingerprint},
          {"initial", fmt::format("{:016x}", fnv1a(initial.dump()))},
          {"train_tokens", sequences_digest(train)},
          {"held_tokens", sequences_digest(held)}};
}

}  // namespace kvb
