// KeyDiff (Park et al. 2025, arXiv:2504.15364), as kvpress's KeyDiffPress runs it (the form the VECTOR
// paper compares against): each KV head keeps the tokens whose keys point furthest from the head's
// mean key direction, with no query and no observation window.
#include <cmath>

#include "harness/method/scorer.hpp"

namespace kvb {
namespace {

class KeyDiff final : public ScorerMethod {
  // Minus the cosine similarity of each post-RoPE key to its KV head's anchor, the mean of the
  // head's L2-normalised keys over the whole prompt (window included), so the most distinctive keys
  // rank first. Every query head of a KV head gets that head's scores.
  HeadScores score(const PrefillView& v) override {
    const int S = v.n_tokens, prefix = S - window(), D = v.head_dim, group = v.n_heads / v.n_kv_heads;
    auto key = [&](int j, int g) { return v.k + (size_t(j) * v.n_kv_heads + g) * D; };
    HeadScores per_kv(size_t(v.n_kv_heads), std::vector<float>(size_t(prefix)));
    std::vector<double> anchor(static_cast<size_t>(D)), norm(static_cast<size_t>(S));
    for (int g = 0; g < v.n_kv_heads; ++g) {
      std::fill(anchor.begin(), anchor.end(), 0.0);
      for (int j = 0; j < S; ++j) {
        const float* k = key(j, g);
        double sq = 0;
        for (int c = 0; c < D; ++c) sq += double(k[c]) * k[c];
        norm[size_t(j)] = std::sqrt(sq);
        // F.normalize: x / max(|x|, 1e-12)
        const double n = std::max(norm[size_t(j)], 1e-12);
        for (int c = 0; c < D; ++c) anchor[size_t(c)] += k[c] / n;
      }
      double anchor_sq = 0;
      for (double& a : anchor) {
        a /= S;
        anchor_sq += a * a;
      }
      const double anchor_norm = std::sqrt(anchor_sq);
      for (int j = 0; j < prefix; ++j) {
        const float* k = key(j, g);
        double ka = 0;
        for (int c = 0; c < D; ++c) ka += k[c] * anchor[size_t(c)];
        // F.cosine_similarity: x.y / max(|x| |y|, 1e-8)
        per_kv[size_t(g)][size_t(j)] = static_cast<float>(-ka / std::max(norm[size_t(j)] * anchor_norm, 1e-8));
      }
    }
    HeadScores scores(size_t(v.n_heads));
    for (int h = 0; h < v.n_heads; ++h) scores[size_t(h)] = per_kv[size_t(h / group)];
    return scores;
  }
};

const bool registered = register_method(
    {.name = "keydiff",
     .summary = "keys least similar to the head's mean key direction (Park et al. 2025, kvpress KeyDiffPress)",
     .params = {ParamSpec::integer("window", 0, 0, 1 << 20,
                                   "last prompt tokens always kept (0, as kvpress: every token is scored)")},
     .make = [] { return std::make_unique<KeyDiff>(); },
     .composition = Composition::Selector});

}  // namespace
}  // namespace kvb
