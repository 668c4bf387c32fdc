#pragma once
// Method composition: a wrapper (KVCrush, VECTOR) runs a base selector (H2O, SnapKV, PyramidKV,
// HeadKV) and changes its decision. The base is named by the wrapper's parameter `base`, configured by
// its base.NAME parameters (MethodRegistry::resolve validates them against the base) and runs in the
// wrapper's GQA mode.
#include <memory>

#include "harness/method/method.hpp"

namespace kvb {

// The `base` parameter every wrapper declares.
ParamSpec base_method_param(const std::string& default_base = "snapkv");

class WrapperMethod : public Method {
 public:
  // Creates the base; a wrapper with its own setup calls this first.
  void setup() override;
  PrefillNeeds needs() const override { return base_->needs(); }
  void check_budget(int tokens) const override { base_->check_budget(tokens); }
  nlohmann::json artifacts() const override { return base_->artifacts(); }
  bool may_exceed_budget() const override { return base_->may_exceed_budget(); }
  bool keeps_whole_prompt(int n_tokens, int budget_tokens) const override {
    return base_->keeps_whole_prompt(n_tokens, budget_tokens);
  }
  bool reads_whole_prompt() const override { return base_->reads_whole_prompt(); }
  void on_prompt(Engine& engine, std::span<const int32_t> ids) override { base_->on_prompt(engine, ids); }

 protected:
  Method& base() { return *base_; }
  // The base's decision for this layer at `budget`.
  Selection base_select(const PrefillView& v, const Budget& budget);

 private:
  std::unique_ptr<Method> base_;
};

// The base's kept positions cut down to what it keeps at a per-head budget `tokens[h]` (window
// included): the window and the best-scored of the rest. For top-k selectors this is exactly the base
// run at the smaller budget, head by head (so PyramidKV's and HeadKV's own allocations are kept and
// scaled per layer and head).
std::vector<std::vector<int32_t>> shrink_keep(const Selection& s, const std::vector<int>& tokens, int n_tokens);
// The base's kept positions grown by `extra[h]` more of its best-scored positions per head (window
// included, as kept). Top-k with a strict order (score, then position) is nested, so the result holds
// the base's own choice: VECTOR's relaxed pool, per layer and head.
std::vector<std::vector<int32_t>> extend_keep(const Selection& s, const std::vector<int>& extra, int n_tokens);

}  // namespace kvb
