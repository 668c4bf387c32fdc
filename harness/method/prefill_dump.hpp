#pragma once
// The views a method sees during prefill, written as .npy files for reference scripts
// (`kvbench dump-prefill`): per chosen layer K (post-RoPE), V and the window queries, and under a
// method the width each stored head keeps each position at (0: evicted).
#include <set>
#include <string>

#include "harness/engine/prefill_view.hpp"

namespace kvb {

class MethodRunner;

// Files per layer l in `dir`: layer<l>.k.npy, .v.npy [n, kv_heads, head_dim], .q_window.npy [window,
// heads, head_dim], and with a runner .widths.npy [stored heads, n]. Without a runner every layer
// keeps its full cache.
class PrefillDumper final : public PrefillObserver {
 public:
  PrefillDumper(std::string dir, std::set<int> layers, int window, MethodRunner* runner);
  PrefillNeeds needs() const override;
  KvTransform* kv_transform() override;
  LinearTransform* linear_transform() override;
  bool reads_whole_prompt() const override;
  void on_prompt(Engine& engine, std::span<const int32_t> ids) override;
  void on_layer(const PrefillView& v, LayerCache& cache) override;

 private:
  std::string dir_;
  std::set<int> layers_;
  int window_;
  MethodRunner* runner_;
};

}  // namespace kvb
