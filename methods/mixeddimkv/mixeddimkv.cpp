// MixedDimKV (Wang et al. 2026, README.md §1-§6): instead of keeping or evicting each prompt
// token, each prefix token of each KV head is kept at one of a few widths in the head's own PCA bases
// of the prompt's keys and values. Widths are chosen per layer, jointly over heads and tokens, to
// minimise the estimated change of the window's attention outputs under the layer's budget
// (Lagrangian relaxation, bisection on the multiplier); the observation window stays full width.
#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"
#include "methods/mixeddimkv/width_allocation.hpp"

namespace kvb {
namespace {

class MixedDimKV final : public Method {
 public:
  PrefillNeeds needs() const override { return {.window = window()}; }

  void setup() override { ws_ = parse_widths(params().get("widths"), model().head_dim); }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const int w = window(), T = b.tokens;
    const WidthSet& ws = ws_;
    if (ws.r_max > 0 && T - w - ws.r_max < 0)
      fail(
          "mixeddimkv: KV size {} leaves {} units per head after the {}-token window, less than the {} units its "
          "PCA bases cost (widths {}); use a larger budget, a smaller window or widths=0,1",
          T, T - w, w, ws.r_max, params().get("widths"));
    const auto slices = head_slices(v, gqa(), w);
    const auto bases = head_bases(v, gqa(), ws.r_max);
    std::vector<HeadLosses> losses(slices.size());
#pragma omp parallel for schedule(dynamic, 1)
    for (int s = 0; s < static_cast<int>(slices.size()); ++s)
      losses[s] = width_losses(slices[s], v.n_tokens, v.head_dim, w, bases[s].get(), ws);
    std::vector<const HeadLosses*> all;
    for (const auto& l : losses) all.push_back(&l);
    // One problem per layer: every stored head pays for its bases (r_max units) and its window.
    const double heads = static_cast<double>(slices.size());
    const MixedChoice c =
        solve_mixed(all, ws, heads * (T - w - ws.r_max), heads * (T - w), params().get_bool("top_up"));
    stats_ = mixed_stats({c}, ws);
    return build_mixed_cache(v, gqa(), w, ws, bases, c.alloc.width);
  }

  nlohmann::json layer_stats() const override { return stats_; }

 private:
  int window() const { return params().integer("window"); }
  WidthSet ws_;
  nlohmann::json stats_;
};

const bool registered =
    register_method({.name = "mixeddimkv",
                     .summary = "per-token widths in per-head PCA bases, chosen per layer by Lagrangian bisection",
                     .params = mixed_dim_params(),
                     .make = [] { return std::make_unique<MixedDimKV>(); }});

}  // namespace
}  // namespace kvb
