#include "harness/engine/gradients.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <cstdio>
#include <numeric>
#include <utility>

#include "harness/engine/rope_freqs.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/backward.hpp"

namespace kvb {

namespace {

RopeStyle rope_style(const ModelConfig& c) {
  return c.rope_layout == RopeLayout::Interleaved ? RopeStyle::Interleaved : RopeStyle::NeoX;
}

// The names of one layer's tensors, in the order the backward meets them.
constexpr const char* kLayerTensors[] = {"attn_norm.weight", "attn_q.weight", "attn_k.weight", "attn_v.weight",
                                         "attn_q.bias",      "attn_k.bias",   "attn_v.bias",   "attn_output.weight",
                                         "ffn_norm.weight",  "ffn_gate.weight", "ffn_up.weight", "ffn_down.weight"};

}  // namespace

ModelGradients::ModelGradients(const ModelFile& model)
    : cfg_(model.config()), rope_(rope_inv_freq(model.config()), rope_style(model.config())) {
  model.validate_tensors();
  auto load = [&](const std::string& name) {
    const TensorRef& t = model.tensor(name);
    Tensor& x = tensors_[name];
    x.w = model.load_f32(name);
    x.cols = static_cast<int>(t.ne[0]);
    x.rows = t.ne.size() > 1 ? static_cast<int>(t.ne[1]) : 1;
  };
  load("token_embd.weight");
  load("output_norm.weight");
  if (!cfg_.tied_embeddings) load("output.weight");
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (const char* what : kLayerTensors) {
      if (!cfg_.qkv_bias && std::string_view(what).ends_with(".bias")) continue;
      load(layer_name(l, what));
    }
}

std::string ModelGradients::layer_name(int l, const char* what) const { return fmt::format("blk.{}.{}", l, what); }

std::vector<std::string> ModelGradients::tensor_names() const {
  std::vector<std::string> names;
  for (const auto& [name, t] : tensors_) names.push_back(name);
  return names;
}

ModelGradients::Tensor& ModelGradients::find(const std::string& name) {
  return const_cast<Tensor&>(std::as_const(*this).find(name));
}

const ModelGradients::Tensor& ModelGradients::find(const std::string& name) const {
  const auto it = tensors_.find(name);
  if (it == tensors_.end()) {
    std::string some;
    for (const auto& [n, t] : tensors_)
      if (!n.starts_with("blk.") || n.starts_with("blk.0.")) some += (some.empty() ? "" : ", ") + n;
    fail("no model tensor '{}'; the trainable tensors are {} (and the same for every blk.N)", name, some);
  }
  return it->second;
}

std::vector<float>& ModelGradients::weight(const std::string& name) { return find(name).w; }

std::pair<int, int> ModelGradients::shape(const std::string& name) const {
  const Tensor& t = find(name);
  return {t.rows, t.cols};
}

LossGradients ModelGradients::compute(std::span<const int32_t> ids, const std::set<std::string>& want) {
  const int n = static_cast<int>(ids.size());
  if (n < 2) fail("gradients: a sequence of {} tokens has no next-token target; give at least 2", n);
  if (n > cfg_.context_length)
    fail("gradients: {} tokens exceed the model's context length {}", n, cfg_.context_length);
  for (int32_t id : ids)
    if (id < 0 || id >= cfg_.vocab_size) fail("gradients: token id {} outside the vocabulary (0..{})", id, cfg_.vocab_size - 1);
  for (const auto& name : want) (void)find(name);

  const int H = cfg_.hidden, F = cfg_.intermediate, d = cfg_.head_dim, hq = cfg_.n_heads, hkv = cfg_.n_kv_heads;
  const int Q = hq * d, KV = hkv * d, V = cfg_.vocab_size, L = cfg_.n_layers;
  const auto eps = static_cast<float>(cfg_.rms_eps);
  const std::string head_name = cfg_.tied_embeddings ? "token_embd.weight" : "output.weight";

  LossGradients out;
  auto grad = [&](const std::string& name) -> float* {
    if (!want.count(name)) return nullptr;
    auto& g = out.grads[name];
    if (g.empty()) g.assign(find(name).w.size(), 0.0f);
    return g.data();
  };
  auto w = [&](int l, const char* what) { return find(layer_name(l, what)).w.data(); };
  // The lowest layer whose weights (or the embedding below it) are wanted: the backward stops there.
  int lowest = L;
  for (const auto& name : want) {
    if (name == "token_embd.weight") lowest = 0;
    int l = 0;
    if (std::sscanf(name.c_str(), "blk.%d.", &l) == 1) lowest = std::min(lowest, l);
  }

  std::vector<int32_t> pos(static_cast<size_t>(n));
  std::iota(pos.begin(), pos.end(), 0);
  rope_.ensure(n);

  // Forward, keeping each layer's input (checkpoints[l]) and the final residual stream (checkpoints[L]).
  std::vector<std::vector<float>> checkpoints(size_t(L) + 1);
  {
    auto& x = checkpoints[0];
    x.resize(size_t(n) * H);
    const float* table = find("token_embd.weight").w.data();
    for (int t = 0; t < n; ++t) std::copy_n(table + size_t(ids[t]) * H, H, x.data() + size_t(t) * H);
  }
  // One layer's forward from its input x; the intermediates stay in these buffers for its backward.
  std::vector<float> h1(size_t(n) * H), q(size_t(n) * Q), k(size_t(n) * KV), v(size_t(n) * KV), att(size_t(n) * Q),
      lse(size_t(hq) * n), xmid(size_t(n) * H), h2(size_t(n) * H), gate(size_t(n) * F), up(size_t(n) * F),
      act(size_t(n) * F), tmp(size_t(n) * std::max(H, F));
  auto layer_forward = [&](int l, const std::vector<float>& x, std::vector<float>* next) {
    rmsnorm(x.data(), w(l, "attn_norm.weight"), n, H, eps, h1.data());
    const bool b = cfg_.qkv_bias;
    linear(h1.data(), w(l, "attn_q.weight"), b ? w(l, "attn_q.bias") : nullptr, n, H, Q, q.data());
    linear(h1.data(), w(l, "attn_k.weight"), b ? w(l, "attn_k.bias") : nullptr, n, H, KV, k.data());
    linear(h1.data(), w(l, "attn_v.weight"), b ? w(l, "attn_v.bias") : nullptr, n, H, KV, v.data());
    rope_.apply(q.data(), n, hq, d, pos.data());
    rope_.apply(k.data(), n, hkv, d, pos.data());
    attention_forward(q.data(), k.data(), v.data(), n, hq, hkv, d, att.data(), lse.data());
    linear(att.data(), w(l, "attn_output.weight"), nullptr, n, Q, H, xmid.data());
    for (size_t i = 0; i < xmid.size(); ++i) xmid[i] += x[i];
    rmsnorm(xmid.data(), w(l, "ffn_norm.weight"), n, H, eps, h2.data());
    linear(h2.data(), w(l, "ffn_gate.weight"), nullptr, n, H, F, gate.data());
    linear(h2.data(), w(l, "ffn_up.weight"), nullptr, n, H, F, up.data());
    swiglu(gate.data(), up.data(), size_t(n) * F, act.data());
    if (next) {
      next->resize(size_t(n) * H);
      linear(act.data(), w(l, "ffn_down.weight"), nullptr, n, F, H, next->data());
      for (size_t i = 0; i < next->size(); ++i) (*next)[i] += xmid[i];
    }
  };
  for (int l = 0; l < L; ++l) layer_forward(l, checkpoints[l], &checkpoints[size_t(l) + 1]);

  // Loss head in chunks of tokens: final norm, logits, cross-entropy; dx = d loss / d residual stream.
  const bool backward = !want.empty();
  std::vector<float> dx(backward ? size_t(n) * H : 0, 0.0f);
  {
    const auto& xL = checkpoints[size_t(L)];
    const float* norm_w = find("output_norm.weight").w.data();
    const float* head = find(head_name).w.data();
    float* d_head = grad(head_name);
    out.n_targets = n - 1;
    const float scale = 1.0f / static_cast<float>(out.n_targets);
    std::vector<float> hn(size_t(n) * H), dhn(backward ? size_t(n) * H : 0, 0.0f);
    rmsnorm(xL.data(), norm_w, n, H, eps, hn.data());
    const int chunk = std::max(1, loss_chunk_);
    std::vector<float> logits(size_t(std::min(n, chunk)) * V);
    std::vector<int32_t> targets(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) targets[t] = t + 1 < n ? ids[t + 1] : -1;
    double total = 0;
    for (int t0 = 0; t0 < n; t0 += chunk) {
      const int rows = std::min(chunk, n - t0);
      linear(hn.data() + size_t(t0) * H, head, nullptr, rows, H, V, logits.data());
      total += cross_entropy(logits.data(), targets.data() + t0, rows, V, scale, logits.data());
      if (backward)
        linear_backward(hn.data() + size_t(t0) * H, head, logits.data(), rows, H, V, dhn.data() + size_t(t0) * H, d_head,
                        nullptr);
    }
    out.loss = total / out.n_targets;
    if (backward) rmsnorm_backward(xL.data(), norm_w, dhn.data(), n, H, eps, dx.data(), grad("output_norm.weight"));
  }
  if (!backward) return out;

  // Layers from the top down to `lowest`: recompute the layer's forward, then its backward. dx enters
  // as d loss / d (layer output) and leaves as d loss / d (layer input).
  std::vector<float> dmid(size_t(n) * H), dh(size_t(n) * H), dgate(size_t(n) * F), dup(size_t(n) * F),
      dq(size_t(n) * Q), dk(size_t(n) * KV), dv(size_t(n) * KV), datt(size_t(n) * Q);
  for (int l = L - 1; l >= lowest; --l) {
    const auto& x = checkpoints[size_t(l)];
    layer_forward(l, x, nullptr);
    auto g = [&](const char* what) { return grad(layer_name(l, what)); };
    // MLP: x_out = xmid + down(silu(gate(h2)) * up(h2)), h2 = norm(xmid).
    std::fill(tmp.begin(), tmp.begin() + ptrdiff_t(size_t(n) * F), 0.0f);
    linear_backward(act.data(), w(l, "ffn_down.weight"), dx.data(), n, F, H, tmp.data(), g("ffn_down.weight"), nullptr);
    swiglu_backward(gate.data(), up.data(), tmp.data(), size_t(n) * F, dgate.data(), dup.data());
    std::fill(dh.begin(), dh.end(), 0.0f);
    linear_backward(h2.data(), w(l, "ffn_gate.weight"), dgate.data(), n, H, F, dh.data(), g("ffn_gate.weight"), nullptr);
    linear_backward(h2.data(), w(l, "ffn_up.weight"), dup.data(), n, H, F, dh.data(), g("ffn_up.weight"), nullptr);
    dmid = dx;
    rmsnorm_backward(xmid.data(), w(l, "ffn_norm.weight"), dh.data(), n, H, eps, dmid.data(), g("ffn_norm.weight"));
    // Attention: xmid = x + o(attn(rope(q(h1)), rope(k(h1)), v(h1))), h1 = norm(x).
    std::fill(datt.begin(), datt.end(), 0.0f);
    linear_backward(att.data(), w(l, "attn_output.weight"), dmid.data(), n, Q, H, datt.data(), g("attn_output.weight"),
                    nullptr);
    attention_backward(q.data(), k.data(), v.data(), att.data(), lse.data(), datt.data(), n, hq, hkv, d, dq.data(),
                       dk.data(), dv.data());
    // RoPE is a rotation: its backward is the inverse rotation.
    rope_.apply_inverse(dq.data(), n, hq, d, pos.data());
    rope_.apply_inverse(dk.data(), n, hkv, d, pos.data());
    std::fill(dh.begin(), dh.end(), 0.0f);
    const bool b = cfg_.qkv_bias;
    linear_backward(h1.data(), w(l, "attn_q.weight"), dq.data(), n, H, Q, dh.data(), g("attn_q.weight"),
                    b ? g("attn_q.bias") : nullptr);
    linear_backward(h1.data(), w(l, "attn_k.weight"), dk.data(), n, H, KV, dh.data(), g("attn_k.weight"),
                    b ? g("attn_k.bias") : nullptr);
    linear_backward(h1.data(), w(l, "attn_v.weight"), dv.data(), n, H, KV, dh.data(), g("attn_v.weight"),
                    b ? g("attn_v.bias") : nullptr);
    dx = dmid;
    rmsnorm_backward(x.data(), w(l, "attn_norm.weight"), dh.data(), n, H, eps, dx.data(), g("attn_norm.weight"));
  }
  if (lowest == 0)
    if (float* de = grad("token_embd.weight")) embed_backward(ids.data(), n, H, dx.data(), de);
  return out;
}

}  // namespace kvb
