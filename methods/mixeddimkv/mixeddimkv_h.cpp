// MixedDimKV-H (README.md §7): HeadKV's per-head quotas from profiled head importance, and
// MixedDimKV's width allocation inside each head's quota (one problem per head). A head whose quota
// cannot pay for its bases, or does better without them, falls back to plain eviction (README.md §7).
#include "harness/method/head_scores.hpp"
#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"
#include "methods/mixeddimkv/width_allocation.hpp"

namespace kvb {
namespace {

class MixedDimKVH final : public Method {
 public:
  PrefillNeeds needs() const override { return {.window = window()}; }

  void setup() override {
    ws_ = parse_widths(params().get("widths"), model().head_dim);
    importance_ = load_head_importance(params(), model());
  }

  nlohmann::json artifacts() const override {
    return {{"head_scores", {{"file", importance_.source}, {"digest", importance_.digest}}}};
  }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const int w = window();
    const WidthSet& ws = ws_;
    // Single heads whose quota cannot pay for bases fall back to eviction; an average head must.
    if (ws.r_max > 0 && b.tokens - w < ws.r_max)
      fail(
          "mixeddimkv_h: KV size {} leaves {} units per head after the {}-token window, less than the {} units its "
          "PCA bases cost (widths {}); use a larger budget, a smaller window or widths=0,1",
          b.tokens, b.tokens - w, w, ws.r_max, params().get("widths"));
    const auto caps = head_capacities(importance_, params(), v.n_kv_heads, gqa(), b.tokens, w);
    const auto slices = head_slices(v, gqa(), w);
    const auto bases = head_bases(v, gqa(), ws.r_max);
    std::vector<MixedChoice> choices(slices.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int s = 0; s < static_cast<int>(slices.size()); ++s) {
      const HeadLosses l = width_losses(slices[s], v.n_tokens, v.head_dim, w, bases[s].get(), ws);
      const double cap = caps[v.layer][s];
      choices[s] = solve_mixed({&l}, ws, cap - ws.r_max, cap, params().get_bool("top_up"));
    }
    stats_ = mixed_stats(choices, ws);
    std::vector<std::vector<int>> width;
    for (auto& c : choices) width.push_back(std::move(c.alloc.width[0]));
    return build_mixed_cache(v, gqa(), w, ws, bases, width);
  }

  nlohmann::json layer_stats() const override { return stats_; }
  bool may_exceed_budget() const override { return params().get("caps") == "repro"; }

 private:
  int window() const { return params().integer("window"); }
  WidthSet ws_;
  HeadImportance importance_;
  nlohmann::json stats_;
};

std::vector<ParamSpec> mixeddimkv_h_params() {
  auto p = mixed_dim_params();
  for (auto& h : head_budget_params()) p.push_back(std::move(h));
  return p;
}

const bool registered = register_method({.name = "mixeddimkv_h",
                                         .summary = "MixedDimKV's width allocation inside HeadKV's per-head quotas",
                                         .params = mixeddimkv_h_params(),
                                         .make = [] { return std::make_unique<MixedDimKVH>(); }});

}  // namespace
}  // namespace kvb
