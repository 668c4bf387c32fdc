#include "harness/method/prefill_dump.hpp"

#include <fmt/format.h>

#include "harness/method/method.hpp"
#include "harness/util/error.hpp"
#include "harness/util/npy.hpp"

namespace kvb {

PrefillDumper::PrefillDumper(std::string dir, std::set<int> layers, int window, MethodRunner* runner)
    : dir_(std::move(dir)), layers_(std::move(layers)), window_(window), runner_(runner) {}

PrefillNeeds PrefillDumper::needs() const {
  PrefillNeeds n = runner_ ? runner_->needs() : PrefillNeeds{};
  n.merge({.window = window_});
  return n;
}

// A method that changes the model (DynaKV) must see its keys and values pass through it here too.
KvTransform* PrefillDumper::kv_transform() { return runner_ ? runner_->kv_transform() : nullptr; }
LinearTransform* PrefillDumper::linear_transform() { return runner_ ? runner_->linear_transform() : nullptr; }
bool PrefillDumper::reads_whole_prompt() const { return runner_ && runner_->reads_whole_prompt(); }
void PrefillDumper::on_prompt(Engine& engine, std::span<const int32_t> ids) {
  if (runner_) runner_->on_prompt(engine, ids);
}

void PrefillDumper::on_layer(const PrefillView& v, LayerCache& cache) {
  if (runner_) {
    runner_->on_layer(v, cache);
  } else {
    cache.append_many(v.k, v.v, v.n_tokens, v.positions);
  }
  if (!layers_.count(v.layer)) return;
  const size_t N = size_t(v.n_tokens), hkv = size_t(v.n_kv_heads), d = size_t(v.head_dim);
  const std::string stem = fmt::format("{}/layer{}", dir_, v.layer);
  write_npy(stem + ".k.npy", {v.k, N * hkv * d}, {N, hkv, d});
  write_npy(stem + ".v.npy", {v.v, N * hkv * d}, {N, hkv, d});
  if (v.window < window_) fail("dump-prefill: {} window queries asked, the prefill kept {}", window_, v.window);
  const float* q = v.q_window + size_t(v.window - window_) * v.n_heads * d;
  write_npy(stem + ".q_window.npy", {q, size_t(window_) * v.n_heads * d}, {size_t(window_), size_t(v.n_heads), d});
  if (runner_) {
    const auto w = stored_key_dims(cache, v.n_tokens);
    std::vector<int32_t> flat;
    for (const auto& h : w) flat.insert(flat.end(), h.begin(), h.end());
    write_npy(stem + ".widths.npy", flat, {w.size(), N});
  }
}

}  // namespace kvb
