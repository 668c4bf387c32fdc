// H2O (Zhang et al. 2023). Default: the one-shot prefill variant the PyramidKV/HeadKV baselines run,
// keeping the T - w tokens with the largest attention accumulated over all prompt queries plus the
// last w. mask=legacy_window_only reproduces the paper-era KVCache-Factory scoring (commit ffac160),
// whose causal mask covered only the last w x w block, so earlier queries also saw future keys
// (README.md §2). With decode_eviction=true, also the original decode-time policy: scores
// keep accumulating each new token's attention, and when a head holds more than T tokens the
// lowest-scoring one outside the recent window is evicted. With paging=P, page-level eviction
// (harness/method/paging.hpp; README.md §4): the paged H2O of the KVCrush paper's Table 2.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <limits>
#include <numeric>

#include "harness/method/paging.hpp"
#include "harness/method/parts.hpp"
#include "harness/method/scorer.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {
namespace {

// The attention each prefix key received summed over all S queries (causal), from the column sums the
// engine gathered during prefill.
HeadScores accumulated_attention_scores(const PrefillView& v, int w) {
  if (!v.attn_colsum) fail("internal: the prefill did not gather accumulated attention");
  if (w < 0 || w >= v.n_tokens) fail("recent window {} must be below the prompt length {}", w, v.n_tokens);
  const int S = v.n_tokens;
  HeadScores out(v.n_heads);
  for (int h = 0; h < v.n_heads; ++h)
    out[h].assign(v.attn_colsum + size_t(h) * S, v.attn_colsum + size_t(h) * S + (S - w));
  return out;
}

class H2O final : public ScorerMethod {
 public:
  // Paged, T is the evictable middle: the recent window is kept beside it, and T must hold whole pages.
  void check_budget(int tokens) const override {
    if (paged())
      paging(tokens);
    else
      ScorerMethod::check_budget(tokens);
  }
  void setup() override {
    if (paged() && (legacy() || params().get_bool("decode_eviction")))
      fail(
          "h2o: paging evicts during decoding by itself and scores with the causal mask; drop decode_eviction and "
          "mask=legacy_window_only");
  }
  PrefillNeeds needs() const override {
    // The legacy scoring recomputes attention from every query; the causal one reuses the prefill's.
    if (legacy()) return {.window = std::numeric_limits<int>::max()};
    return {.attn_colsum = true};
  }
  bool acts_on_decode() const override { return paged() || params().get_bool("decode_eviction"); }
  // Paged, the KV size is the evictable middle: the start, the recent pages and the filling page come on top.
  bool may_exceed_budget() const override { return paged(); }
  // Evicting during decoding, the method starts its scores at every prompt, also one that fits (select()).
  bool keeps_whole_prompt(int n_tokens, int budget_tokens) const override {
    return !acts_on_decode() && ScorerMethod::keeps_whole_prompt(n_tokens, budget_tokens);
  }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    if (!paged()) return ScorerMethod::compress(v, b);
    const PagingConfig c = paging(b.tokens);
    PageScores& ps = pages(v.layer);
    ps = prefill_page_scores(v, nullptr);
    const auto gone = ps.to_evict(c);
    ps.erase_pages(gone, c.page);
    return gather(v, gqa(), keep_outside_pages(gone, c.page, v.n_tokens, stored_heads()));
  }

  std::optional<Selection> select(const PrefillView& v, const Budget& b) override {
    if (!acts_on_decode()) return ScorerMethod::select(v, b);
    // Running scores start from the prompt's accumulated attention of every kept token, at every
    // prompt: a prompt that fits keeps all its tokens with their scores (the authors' cache scores
    // the prefill whatever its length), and no earlier prompt's scores carry over.
    Selection sel;
    if (v.n_tokens <= b.tokens) {
      std::vector<int32_t> all_positions(size_t(v.n_tokens));
      std::iota(all_positions.begin(), all_positions.end(), 0);
      sel.keep.assign(size_t(stored_heads()), all_positions);
    } else {
      sel = *ScorerMethod::select(v, b);
    }
    const HeadScores all = reduce_for_gqa(scores(v, 0), v.n_kv_heads, gqa());
    auto& layer = running(v.layer);
    layer.assign(sel.keep.size(), {});
    for (size_t h = 0; h < sel.keep.size(); ++h)
      for (int32_t p : sel.keep[h]) layer[h].push_back(all[h][p]);
    return sel;
  }

  void on_decode(LayerCache& cache, const DecodeView& dv) override {
    if (paged()) return paged_decode(cache, dv);
    const int w = window();
    const int d = cache.head_dim(), group = cache.n_query_heads() / cache.n_cache_heads();
    auto& layer = running(dv.layer);
    if (static_cast<int>(layer.size()) != cache.n_cache_heads())
      fail("internal: h2o decode_eviction has no running scores for layer {}", dv.layer);
    for (int s = 0; s < cache.n_cache_heads(); ++s) {
      auto& segs = cache.segments(s);
      if (segs.size() != 1 || segs[0]->format() != "dense")
        fail("h2o decode_eviction needs a single dense segment per head, found {}", segs.size());
      auto& seg = static_cast<DenseSegment&>(*segs[0]);
      auto& score = layer[s];
      score.resize(seg.size(), 0.0f);  // the new token
      // Attention of this step's queries (those reading head s) over the head, averaged over them.
      std::vector<float> logits(seg.size());
      for (int i = 0; i < group; ++i) {
        seg.logits(dv.q + size_t(s * group + i) * d, logits.data());
        for (auto& x : logits) x /= std::sqrt(static_cast<float>(d));
        softmax_inplace(logits.data(), static_cast<int>(logits.size()));
        for (size_t t = 0; t < logits.size(); ++t) score[t] += logits[t] / static_cast<float>(group);
      }
      if (static_cast<int>(seg.size()) > dv.budget_tokens) {
        const auto end = score.end() - std::min<std::ptrdiff_t>(w, static_cast<std::ptrdiff_t>(score.size()));
        const auto victim = static_cast<size_t>(std::min_element(score.begin(), end) - score.begin());
        seg.erase(victim);
        score.erase(score.begin() + static_cast<std::ptrdiff_t>(victim));
      }
    }
  }

 private:
  bool legacy() const { return params().get("mask") == "legacy_window_only"; }
  bool paged() const { return params().integer("paging") > 0; }
  PagingConfig paging(int budget) const { return PagingConfig::from(params(), window(), budget, "h2o paging"); }
  PageScores& pages(int layer) {
    if (static_cast<int>(pages_.size()) <= layer) pages_.resize(size_t(layer) + 1);
    return pages_[size_t(layer)];
  }

  // A decode step of the paged cache: the new token's attention over every slot, summed over the query
  // heads, joins the slots' scores, then the layer evicts pages if it has outgrown its limit.
  void paged_decode(LayerCache& cache, const DecodeView& dv) {
    const PagingConfig c = paging(dv.budget_tokens);
    PageScores& ps = pages(dv.layer);
    const auto heads = paged_heads(cache, "h2o paging");
    add_decode_attention(heads, cache.n_query_heads(), dv.q, ps, nullptr);
    evict_pages(heads, ps.to_evict(c), c.page, ps, nullptr);
  }
  HeadScores score(const PrefillView& v) override { return scores(v, window()); }

  HeadScores scores(const PrefillView& v, int w) const {
    if (!legacy()) return accumulated_attention_scores(v, w);
    // Rows before the last w see all S keys; the last w rows are causal.
    const int S = v.n_tokens, d = v.head_dim, hq = v.n_heads, G = hq / v.n_kv_heads;
    const int w_mask = window();
    if (v.window < S) fail("internal: h2o legacy scoring needs all {} queries, got {}", S, v.window);
    HeadScores out(hq, std::vector<float>(S - w, 0.0f));
    constexpr int kRows = 256;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
#pragma omp parallel
    {
      std::vector<float> z(size_t(kRows) * S);
#pragma omp for schedule(dynamic, 1)
      for (int h = 0; h < hq; ++h)
        for (int r0 = 0; r0 < S; r0 += kRows) {
          const int rows = std::min(kRows, S - r0);
          cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, rows, S, d, scale,
                      v.q_window + (size_t(r0) * hq + h) * d, hq * d, v.k + size_t(h / G) * d, v.n_kv_heads * d, 0.0f,
                      z.data(), S);
          for (int r = 0; r < rows; ++r) {
            const int i = r0 + r, visible = i < S - w_mask ? S : i + 1;
            float* row = z.data() + size_t(r) * S;
            softmax_inplace(row, visible);
            for (int j = 0; j < std::min(visible, S - w); ++j) out[h][j] += row[j];
          }
        }
    }
    return out;
  }

  std::vector<std::vector<float>>& running(int layer) {
    if (static_cast<int>(running_.size()) <= layer) running_.resize(layer + 1);
    return running_[layer];
  }
  std::vector<std::vector<std::vector<float>>> running_;  // [layer][stored head][token]
  std::vector<PageScores> pages_;                         // [layer], paged
};

std::vector<ParamSpec> params() {
  std::vector<ParamSpec> p = {
      ParamSpec::integer("window", 32, 0, 4096, "recent tokens always kept (with paging: the recent area)"),
      ParamSpec::boolean("decode_eviction", false,
                         "keep evicting during decoding so each head holds at most T (not with a wrapper)"),
      ParamSpec::choice("mask", "causal", {"causal", "legacy_window_only"},
                        "causal scoring, or the paper-era code's mask covering only the last w rows")};
  for (auto& q : paging_params()) p.push_back(std::move(q));
  return p;
}

const bool registered = register_method({.name = "h2o",
                                         .summary = "heavy hitters by accumulated attention + recent window",
                                         .params = params(),
                                         .make = [] { return std::make_unique<H2O>(); },
                                         .composition = Composition::Selector});

}  // namespace
}  // namespace kvb
