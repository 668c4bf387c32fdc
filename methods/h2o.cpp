// H2O (Zhang et al. 2023), one-shot prefill variant as the PyramidKV/HeadKV baselines run it: keep the
// T - w tokens with the largest attention accumulated over all prompt queries, plus the last w.
#include "harness/method/parts.hpp"

namespace kvb {
namespace {

class H2O final : public Method {
 public:
  PrefillNeeds needs() const override { return {0, false, true}; }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const int w = static_cast<int>(params().get_int("window"));
    HeadScores s = accumulated_attention_scores(v, w);
    s = reduce_for_gqa(s, v.n_kv_heads, gqa());
    return gather(v, gqa(), select_with_window(s, b.tokens - w, v.n_tokens, w));
  }
};

const bool registered = register_method(
    {"h2o", "heavy hitters by accumulated attention + recent window",
     {ParamSpec::integer("window", 32, 0, 4096, "recent tokens always kept")},
     [] { return std::make_unique<H2O>(); }});

}  // namespace
}  // namespace kvb
