#pragma once
// A method's runner as the engine's observer, recording what each layer kept per stored head: how
// the reference tests compare kept sets with the authors' code.
#include <vector>

#include "harness/method/method.hpp"
#include "synthetic_layer.hpp"

namespace kvb::test {

class KeptSets final : public PrefillObserver {
 public:
  explicit KeptSets(MethodRunner& runner) : runner_(runner) {}
  PrefillNeeds needs() const override { return runner_.needs(); }
  bool reads_whole_prompt() const override { return runner_.reads_whole_prompt(); }
  void on_prompt(Engine& engine, std::span<const int32_t> ids) override { runner_.on_prompt(engine, ids); }
  void on_layer(const PrefillView& view, LayerCache& cache) override {
    runner_.on_layer(view, cache);
    kept.push_back(kept_positions(cache));
  }
  std::vector<std::vector<std::vector<int32_t>>> kept;  // [layer][stored head]

 private:
  MethodRunner& runner_;
};

}  // namespace kvb::test
