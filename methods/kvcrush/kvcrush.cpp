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
#include "harness/method/paging.hpp"
#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"
#include "methods/kvcrush/fingerprints.hpp"

namespace kvb {
namespace {

class KVCrush final : public WrapperMethod {
 public:
  void setup() override {
    WrapperMethod::setup();
    if (!paged()) return;
    if (base().name() != "h2o")
      fail("kvcrush paging: the paged setting runs over paged H2O's scores (base=h2o), not {}", base().name());
    recent_ = base().params().integer("window");
  }
  void check_budget(int tokens) const override {
    if (paged())
      paging_config(tokens);  // T is the evictable middle, the base's window the recent area beside it
    else
      WrapperMethod::check_budget(tokens);
  }
  bool acts_on_decode() const override { return paged(); }
  bool may_exceed_budget() const override { return paged() || WrapperMethod::may_exceed_budget(); }
  bool keeps_whole_prompt(int n_tokens, int budget_tokens) const override {
    return !paged() && WrapperMethod::keeps_whole_prompt(n_tokens, budget_tokens);
  }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    if (paged()) return paged_compress(v, b);
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

  void on_decode(LayerCache& cache, const DecodeView& dv) override {
    Paged& p = paged_layer(dv.layer);
    const auto heads = paged_heads(cache, "kvcrush paging");
    add_decode_attention(heads, cache.n_query_heads(), dv.q, p.scores, &p.per_head);
    evict_pages(heads, choose_evicted(dv.layer, dv.budget_tokens), paging_config(dv.budget_tokens).page, p.scores,
                &p.per_head);
  }

 private:
  // Paged KVCrush (README.md §8): paged H2O's layer-wide page scores keep the best (1 - ratio) share of
  // the evictable middle; the rest of it goes to representative pages among those H2O would evict, each
  // page's fingerprint the concatenation of its tokens' per-head bits.
  struct Paged {
    PageScores scores;
    HeadSlotScores per_head;
  };
  bool paged() const { return params().integer("paging") > 0; }
  PagingConfig paging_config(int budget) const {
    return PagingConfig::from(params(), recent_, budget, "kvcrush paging");
  }
  Paged& paged_layer(int layer) {
    if (static_cast<int>(paged_.size()) <= layer) paged_.resize(size_t(layer) + 1);
    return paged_[size_t(layer)];
  }

  LayerCache paged_compress(const PrefillView& v, const Budget& b) {
    Paged& p = paged_layer(v.layer);
    p.scores = prefill_page_scores(v, &p.per_head);
    const auto gone = choose_evicted(v.layer, b.tokens);
    const int P = paging_config(b.tokens).page;
    evict_pages({}, gone, P, p.scores, &p.per_head);
    return gather(v, gqa(), keep_outside_pages(gone, P, v.n_tokens, stored_heads()));
  }

  // The pages to evict now (ascending): none while the layer is within start + T + recent + P - 1;
  // otherwise every evictable page but the best H2O share by score and the representatives chosen among
  // the rest.
  std::vector<int> choose_evicted(int layer, int budget) {
    const PagingConfig c = paging_config(budget);
    Paged& p = paged_layer(layer);
    if (!c.over_limit(p.scores.score.size())) return {};
    const int pages = c.middle / c.page;
    const int reps = std::min(pages, static_cast<int>(std::nearbyint(params().get_float("ratio") * pages)));
    PagingConfig h2o = c;
    h2o.middle = (pages - reps) * c.page;
    const auto [first_page, last_page] = c.evictable_pages(p.scores.score.size());
    std::vector<int> cand;
    if (h2o.middle > 0) {
      cand = p.scores.to_evict(h2o);
    } else {
      for (int pg = first_page; pg < last_page; ++pg) cand.push_back(pg);
    }
    if (reps == 0) return cand;
    // Per head, the top `bits` share of the evictable range's slots by that head's accumulated score.
    const int P = c.page, first = first_page * P, last = last_page * P;
    const int hq = static_cast<int>(p.per_head.size()), N = last - first;
    HeadScores range(static_cast<size_t>(hq), std::vector<float>(static_cast<size_t>(N)));
    for (int h = 0; h < hq; ++h)
      for (int t = 0; t < N; ++t)
        range[size_t(h)][size_t(t)] = static_cast<float>(p.per_head[size_t(h)][size_t(first + t)]);
    const auto token_bits = fingerprints(range, N, share_counts(hq, N, params().get_float("bits")));
    // A page's fingerprint: its P tokens' head bits one after the other.
    std::vector<Bits> prints(p.scores.score.size() / size_t(P), Bits(size_t(P * hq + 63) / 64, 0));
    std::vector<int32_t> cand_pages(cand.begin(), cand.end());
    for (int pg : cand) {
      for (int i = 0; i < P; ++i)
        for (int h = 0; h < hq; ++h)
          if (test_bit(token_bits[size_t(pg * P + i - first)], h)) set_bit(prints[size_t(pg)], i * hq + h);
    }
    const Bits a = anchor_fingerprint(params().get("anchor"), prints, cand_pages, P * hq,
                                      static_cast<uint64_t>(params().get_int("seed")), layer,
                                      static_cast<int>(p.scores.score.size()));
    const auto kept = pick_representatives(params().get("group"), prints, order_by_distance(prints, cand_pages, a),
                                           std::min(reps, static_cast<int>(cand_pages.size())));
    std::vector<int> gone;
    for (int pg : cand)
      if (std::find(kept.begin(), kept.end(), pg) == kept.end()) gone.push_back(pg);
    return gone;
  }
  std::vector<Paged> paged_;
  int recent_ = 0;  // paged: the base's window, the recent area

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

std::vector<ParamSpec> params() {
  std::vector<ParamSpec> p = {
      base_method_param(),
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
      ParamSpec::integer("seed", 42, 0, 2147483647, "seed of the random anchor")};
  for (auto& q : paging_params()) p.push_back(std::move(q));
  return p;
}

const bool registered = register_method(
    {.name = "kvcrush",
     .summary = "representatives of the tokens a base method evicts, grouped by binary head fingerprints",
     .params = params(),
     .make = [] { return std::make_unique<KVCrush>(); },
     .composition = Composition::Wrapper});

}  // namespace
}  // namespace kvb
