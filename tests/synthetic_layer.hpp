#pragma once
// A synthetic layer for method tests: random post-RoPE Q/K/V with window queries and column sums
// computed by the CPU backend, as the engine would hand them to a method.
#include <cmath>
#include <numeric>
#include <random>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/prefill_view.hpp"
#include "harness/engine/rope_freqs.hpp"
#include "harness/model/config.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb::test {

struct SyntheticLayer {
  ModelConfig cfg;
  std::vector<float> q, k, v, colsum, k_pre;
  std::vector<int32_t> pos;
  PrefillView view;

  // Recomputes the column sums after the test edits q or k.
  void refresh_colsum() {
    auto be = make_cpu_backend();
    Buffer qb(*be, q.size()), kb(*be, k.size()), vb(*be, v.size()), ob(*be, q.size());
    be->upload(qb, q);
    be->upload(kb, k);
    be->upload(vb, v);
    be->attention_prefill(qb, kb, vb, view.n_tokens, view.n_heads, view.n_kv_heads, view.head_dim, ob, &colsum);
    view.attn_colsum = colsum.data();
  }

  SyntheticLayer(int S, int hq, int hkv, int d, int window, uint32_t seed, float sharpness = 3.0f) {
    cfg.n_layers = 4;
    cfg.n_heads = hq;
    cfg.n_kv_heads = hkv;
    cfg.head_dim = d;
    std::mt19937 rng(seed);
    std::normal_distribution<float> nd(0.0f, sharpness / std::sqrt(static_cast<float>(d)) * 4);
    q.resize(size_t(S) * hq * d);
    k.resize(size_t(S) * hkv * d);
    v.resize(size_t(S) * hkv * d);
    for (auto& x : q) x = nd(rng);
    for (auto& x : k) x = nd(rng);
    for (auto& x : v) x = nd(rng);
    pos.resize(S);
    std::iota(pos.begin(), pos.end(), 0);
    view.layer = 0;
    view.n_tokens = S;
    view.n_heads = hq;
    view.n_kv_heads = hkv;
    view.head_dim = d;
    view.positions = pos.data();
    view.window = window;
    view.q_window = q.data() + size_t(S - window) * hq * d;
    view.k = k.data();
    view.v = v.data();
    // The pre-RoPE keys the post-RoPE ones came from, under the config's rotary frequencies.
    k_pre = k;
    RopeTable rope(rope_inv_freq(cfg), RopeStyle::NeoX);
    rope.ensure(S + 1);
    rope.apply_inverse(k_pre.data(), S, hkv, d, pos.data());
    view.k_pre_rope = k_pre.data();
    refresh_colsum();
  }
};

inline std::vector<std::vector<int32_t>> kept_positions(const LayerCache& c) {
  std::vector<std::vector<int32_t>> out;
  for (int h = 0; h < c.n_cache_heads(); ++h) {
    std::vector<int32_t> p;
    for (const auto& s : c.segments(h)) p.insert(p.end(), s->positions().begin(), s->positions().end());
    out.push_back(p);
  }
  return out;
}

}  // namespace kvb::test
