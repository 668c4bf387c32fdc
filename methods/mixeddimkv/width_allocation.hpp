#pragma once
// MixedDimKV's shared parts (README.md §1-§8): each prefix token of each stored head is kept at
// one of a few widths (fractions of the head dimension) in the head's own uncentered-PCA bases of the
// prompt's keys and values. A scorer estimates, for every token and width, how far the attention
// outputs of the observation window would move (Algorithm 1 of the paper); an allocator picks the
// widths that minimise the summed loss under a budget by Lagrangian relaxation and bisection; the
// cache keeps full-width tokens dense and each intermediate width as one low-rank segment.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/cache/lowrank_segment.hpp"
#include "harness/engine/prefill_view.hpp"
#include "harness/method/method.hpp"

namespace kvb {

// The parameters MixedDimKV and MixedDimKV-H share: window, widths, top_up.
std::vector<ParamSpec> mixed_dim_params();

// Candidate widths: ratios rho (ascending, 0 and 1 included) and the dimensions they give.
struct WidthSet {
  std::vector<double> rho;
  std::vector<int> dims;
  int r_max = 0;  // widest reduced dimension (0 when there is none): the rank of the stored bases
};
// Parses "0,0.125,0.25,1". Ratios times head_dim are rounded down to a multiple of 8 (README.md §2) and
// must stay distinct and positive; 0 and 1 must be present. Errors name `param`.
WidthSet parse_widths(const std::string& text, int head_dim, const std::string& param = "widths");

// Loss of each prefix token of one stored head at each width: loss[t * widths + j].
struct HeadLosses {
  int tokens = 0, widths = 0;
  std::vector<double> loss;
};

// Keys, values and window queries of one stored head.
struct HeadSlice {
  const float* k = nullptr;  // row t at k + t * stride (post-RoPE)
  const float* v = nullptr;
  int stride = 0;
  std::vector<const float*> q;  // window query rows (all G heads of a group in native mode)
  std::vector<int> q_pos;       // the prompt index each query row sits at (causal mask)
};

// The stored heads of a layer as slices: KV heads with their G query heads' window rows (native), or
// one slice per query head over its repeated KV head (repeat). `window` rows from the view's end.
std::vector<HeadSlice> head_slices(const PrefillView& v, GqaMode mode, int window);

// Algorithm 1 for the prefix [0, N - window): rho = 0 costs 2 sum_i P[i,t] |V_t|; rho = 1 costs 0;
// otherwise sum_i |P'[i,t] - P[i,t]| |V_t| + P[i,t] |V_t - V'_t| with P' the attention over all keys
// projected at that width. Window rows are processed in chunks, so memory is O(chunk x N).
HeadLosses width_losses(const HeadSlice& s, int n_tokens, int d, int window, const LowRankBasis* basis,
                        const WidthSet& ws);
// The same from dense reconstructions K P P^T, V P P^T, all in double: the reference.
HeadLosses width_losses_ref(const HeadSlice& s, int n_tokens, int d, int window, const LowRankBasis* basis,
                            const WidthSet& ws);

// Loss tables of several stored heads solved as one problem (items = heads x tokens), or one head.
struct WidthAllocation {
  std::vector<std::vector<int>> width;  // [head][token]: index into the width set
  double lambda = 0;                    // the multiplier the allocation was read at
  double cost = 0;                      // sum of rho (token units)
  double primal = 0;                    // sum of the chosen losses
  double dual = 0;                      // Lagrangian dual at lambda (primal - dual bounds the gap)
};
// Minimises the summed loss subject to sum of rho <= budget: items choose argmin_j loss + lambda rho_j
// (ties to the smaller width); bisection on lambda until the bracket is below 1e-9 relative; the
// allocation at the upper end is feasible. With top_up, items that flip inside the final bracket are
// upgraded greedily by loss saved per unit while the budget allows (restores ties at the cut).
// `allowed` masks widths (e.g. {0, 1} only); a negative budget is an error.
WidthAllocation allocate_widths(const std::vector<const HeadLosses*>& heads, const std::vector<double>& rho,
                                double budget, bool top_up, const std::vector<bool>& allowed = {});

// Cost (sum of rho) of the items' choices at multiplier lambda: non-increasing in lambda.
double width_cost(const std::vector<const HeadLosses*>& heads, const std::vector<double>& rho, double lambda);

// Per stored head: full-width tokens and the window as one dense segment, each intermediate width
// as one low-rank segment sharing the head's basis (charged once, only when some token uses it).
LayerCache build_mixed_cache(const PrefillView& v, GqaMode mode, int window, const WidthSet& ws,
                             const std::vector<std::shared_ptr<const LowRankBasis>>& bases,
                             const std::vector<std::vector<int>>& width);

// The uncentered PCA basis of each stored head of the layer at rank ws.r_max (null when r_max = 0).
std::vector<std::shared_ptr<const LowRankBasis>> head_bases(const PrefillView& v, GqaMode mode, int r_max);

// The MixedDimKV solve shared by the per-layer and per-head variants (README.md §5-§7):
// solves the full problem with its projection charge and the {0, 1} problem without, and keeps the
// one with the lower total loss. `group` lists the stored heads solved together; budgets are in
// token units (window excluded).
struct MixedChoice {
  WidthAllocation alloc;
  bool eviction_only = false;  // the {0, 1} problem won (or the budget could not pay for bases)
};
MixedChoice solve_mixed(const std::vector<const HeadLosses*>& heads, const WidthSet& ws, double budget_with_bases,
                        double budget_without, bool top_up);

// Statistics of a layer's allocation for the record: the width histogram, lambda, the duality gap.
nlohmann::json mixed_stats(const std::vector<MixedChoice>& choices, const WidthSet& ws);

}  // namespace kvb
