// H2O (Zhang et al. 2023). Default: the one-shot prefill variant the PyramidKV/HeadKV baselines run,
// keeping the T - w tokens with the largest attention accumulated over all prompt queries plus the
// last w. With decode_eviction=true, also the original decode-time policy: scores keep accumulating
// each new token's attention, and when a head holds more than T tokens the lowest-scoring one outside
// the recent window is evicted.
#include <algorithm>
#include <cmath>

#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {
namespace {

class H2O final : public Method {
 public:
  PrefillNeeds needs() const override { return {0, false, true}; }
  bool acts_on_decode() const override { return params().get_bool("decode_eviction"); }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const int w = static_cast<int>(params().get_int("window"));
    const HeadScores s = reduce_for_gqa(accumulated_attention_scores(v, w), v.n_kv_heads, gqa());
    const auto keep = select_with_window(s, b.tokens - w, v.n_tokens, w);
    if (acts_on_decode()) {
      // Running scores start from the prompt's accumulated attention of every kept token.
      const HeadScores all = reduce_for_gqa(accumulated_attention_scores(v, 0), v.n_kv_heads, gqa());
      auto& layer = running(v.layer);
      layer.assign(keep.size(), {});
      for (size_t h = 0; h < keep.size(); ++h)
        for (int32_t p : keep[h]) layer[h].push_back(all[h][p]);
    }
    return gather(v, gqa(), keep);
  }

  void on_decode(LayerCache& cache, const DecodeView& dv) override {
    const int w = static_cast<int>(params().get_int("window"));
    const int d = cache.head_dim(), group = cache.n_query_heads() / cache.n_cache_heads();
    auto& layer = running(dv.layer);
    if (layer.empty()) layer.assign(cache.n_cache_heads(), {});
    for (int s = 0; s < cache.n_cache_heads(); ++s) {
      auto& segs = cache.segments(s);
      if (segs.size() != 1 || segs[0]->format() != "dense")
        fail("h2o decode_eviction needs a single dense segment per head, found {}", segs.size());
      auto& seg = static_cast<DenseSegment&>(*segs[0]);
      auto& score = layer[s];
      score.resize(seg.size(), 0.0f);  // the new token, and the prompt when it was not compressed
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
  std::vector<std::vector<float>>& running(int layer) {
    if (static_cast<int>(running_.size()) <= layer) running_.resize(layer + 1);
    return running_[layer];
  }
  std::vector<std::vector<std::vector<float>>> running_;  // [layer][stored head][token]
};

const bool registered = register_method(
    {"h2o", "heavy hitters by accumulated attention + recent window",
     {ParamSpec::integer("window", 32, 0, 4096, "recent tokens always kept"),
      ParamSpec::boolean("decode_eviction", false, "keep evicting during decoding so each head holds at most T")},
     [] { return std::make_unique<H2O>(); }});

}  // namespace
}  // namespace kvb
