// KVCrush (Jha et al. 2025, README.md §1-§7): an add-on to any eviction method. A share `ratio` of
// each head's budget leaves the base method and goes to representatives of the tokens the base
// evicts. Every prompt token gets a binary fingerprint, one bit per query head saying whether that
// head ranks it in its top half; tokens are ordered by the Hamming distance of their fingerprint to
// one anchor vector (O(S), no clustering), and representatives are picked evenly along that order,
// so the cache still covers the different kinds of context the base dropped.
//
// The base is any selector (`base=snapkv|pyramidkv|h2o|headkv`, its parameters as base.NAME). Its
// per-query-head scores, before GQA reduction, are the fingerprints' scores (the paper's w_h(t), read
// as the attention a token receives: its Alg. 1 row sum would be constant). In native GQA mode each
// KV head picks its own representatives among its own candidates, with the layer's shared
// fingerprints (the vLLM port's shortcut of one shared set filtered by KV head 0 is not copied).
#include <algorithm>
#include <cmath>

#include "harness/method/compose.hpp"
#include "harness/method/parts.hpp"
#include "methods/kvcrush/fingerprints.hpp"

namespace kvb {
namespace {

class KVCrush final : public WrapperMethod {
 public:
  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const Selection sel = base_select(v, b);
    const int S = v.n_tokens, E = S - sel.window, hq = static_cast<int>(sel.query_scores.size());
    const double ratio = params().get_float("ratio");
    // Each stored head's total T_h is what the base keeps; round(ratio T_h) of it (Python's round,
    // half to even) goes to representatives, never the window's share.
    std::vector<int> reps(sel.keep.size()), base_tokens(sel.keep.size());
    for (size_t h = 0; h < sel.keep.size(); ++h) {
      const int T = static_cast<int>(sel.keep[h].size());
      reps[h] = std::min(static_cast<int>(std::nearbyint(ratio * T)), std::max(0, T - sel.window));
      base_tokens[h] = T - reps[h];
    }
    auto keep = shrink_keep(sel, base_tokens, S);
    const auto prints = fingerprints(sel.query_scores, E, marked_counts(sel, hq, E));
    long picked_total = 0, unused = 0;
    for (size_t h = 0; h < keep.size(); ++h) {
      if (reps[h] == 0) continue;
      std::vector<int32_t> cand;  // the evictable prefix the base part left out, ascending
      size_t k = 0;
      for (int32_t j = 0; j < E; ++j) {
        while (k < keep[h].size() && keep[h][k] < j) ++k;
        if (k == keep[h].size() || keep[h][k] != j) cand.push_back(j);
      }
      const Bits a = anchor_fingerprint(params().get("anchor"), prints, cand, hq,
                                        static_cast<uint64_t>(params().get_int("seed")), v.layer, static_cast<int>(h));
      const auto picked =
          pick_representatives(params().get("group"), prints, order_by_distance(prints, cand, a), reps[h]);
      picked_total += static_cast<long>(picked.size());
      unused += reps[h] - static_cast<long>(picked.size());
      keep[h].insert(keep[h].end(), picked.begin(), picked.end());
      std::sort(keep[h].begin(), keep[h].end());
    }
    stats_ = {{"layer", v.layer}, {"representatives", picked_total}, {"unused", unused}};
    return gather(v, gqa(), keep);
  }

  nlohmann::json layer_stats() const override { return stats_; }

 private:
  // How many prefix tokens each query head marks 1. threshold=share: the share `bits` of the prefix
  // (the Intel implementations' top half); threshold=budget: the paper's rule, the tokens the head
  // retains at the run's compression, its stored head's T_h - w prefix slots before the split.
  std::vector<int> marked_counts(const Selection& sel, int hq, int E) const {
    if (params().get("threshold") == "share") return share_counts(hq, E, params().get_float("bits"));
    const int group = hq / static_cast<int>(sel.keep.size());  // 1 in repeat mode
    std::vector<int> m(static_cast<size_t>(hq));
    for (int i = 0; i < hq; ++i) m[size_t(i)] = static_cast<int>(sel.keep[size_t(i / group)].size()) - sel.window;
    return m;
  }

  nlohmann::json stats_;
};

const bool registered = register_method(
    {.name = "kvcrush",
     .summary = "representatives of the tokens a base method evicts, grouped by binary head fingerprints",
     .params = {base_method_param(),
                ParamSpec::real("ratio", 0.25, 0.0, 0.99, "share of each head's budget given to representatives"),
                ParamSpec::choice("anchor", "alternate", {"alternate", "mean", "random", "zeros", "ones", "inv_mean"},
                                  "the anchor fingerprint distances are measured from"),
                ParamSpec::choice("threshold", "share", {"share", "budget"},
                                  "each head's fingerprint threshold: its top share `bits` of the evictable tokens "
                                  "(Intel's implementations), or the tokens it retains at the run's compression "
                                  "(the paper)")
                    .added_later(),
                ParamSpec::real("bits", 0.5, 0.001, 1.0, "with threshold=share: the share q each head marks 1"),
                ParamSpec::choice("group", "sorted_stride", {"sorted_stride", "floor_stride", "bucket_centroid"},
                                  "picks along the distance order: evenly spaced ends included, OpenVINO's "
                                  "floor(C/n) stride from the nearest, or one per bucket nearest its centroid"),
                ParamSpec::integer("seed", 42, 0, 2147483647, "seed of the random anchor")},
     .make = [] { return std::make_unique<KVCrush>(); },
     .composition = Composition::Wrapper});

}  // namespace
}  // namespace kvb
