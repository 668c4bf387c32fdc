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

// The names of one layer's tensors under this config.
std::vector<std::string> layer_tensors(const ModelConfig& c) {
  std::vector<std::string> names;
  auto norm = [&](const std::string& n) {
    names.push_back(n + ".weight");
    if (c.layer_norm) names.push_back(n + ".bias");
  };
  norm("attn_norm");
  for (const char* p : {"attn_q", "attn_k", "attn_v"}) {
    names.push_back(std::string(p) + ".weight");
    if (c.qkv_bias) names.push_back(std::string(p) + ".bias");
  }
  if (c.qk_norm) names.insert(names.end(), {"attn_q_norm.weight", "attn_k_norm.weight"});
  names.push_back("attn_output.weight");
  if (c.mlp_norm) norm(mlp_norm_name(c));
  if (c.gated_mlp) names.push_back("ffn_gate.weight");
  names.insert(names.end(), {"ffn_up.weight", "ffn_down.weight"});
  return names;
}

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
  if (cfg_.layer_norm) load("output_norm.bias");
  if (!cfg_.tied_embeddings) load("output.weight");
  const auto names = layer_tensors(cfg_);
  for (int l = 0; l < cfg_.n_layers; ++l)
    for (const auto& what : names) load(layer_name(l, what.c_str()));
  mlp_norm_ = cfg_.mlp_norm ? mlp_norm_name(cfg_) : "attn_norm";
}

void ModelGradients::norm(const std::string& name, const float* x, int n, float* y) const {
  const float* w = find(name + ".weight").w.data();
  const auto eps = static_cast<float>(cfg_.norm_eps);
  if (cfg_.layer_norm)
    layernorm(x, w, find(name + ".bias").w.data(), n, cfg_.hidden, eps, y);
  else
    rmsnorm(x, w, n, cfg_.hidden, eps, y);
}

void ModelGradients::norm_backward(const std::string& name, const float* x, const float* dy, int n, float* dx,
                                   const GradOf& grad) const {
  const float* w = find(name + ".weight").w.data();
  const auto eps = static_cast<float>(cfg_.norm_eps);
  if (cfg_.layer_norm)
    layernorm_backward(x, w, dy, n, cfg_.hidden, eps, dx, grad(name + ".weight"), grad(name + ".bias"));
  else
    rmsnorm_backward(x, w, dy, n, cfg_.hidden, eps, dx, grad(name + ".weight"));
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

struct ModelGradients::Work {
  int n = 0;
  std::vector<int32_t> pos;
  std::vector<float> h1, q, k, v, att, lse, xmid, h2, gate, up, act, tmp;
  std::vector<float> q_raw, k_raw;  // Qwen3: the projections before the per-head q/k norms
  Work(int n_tokens, const ModelConfig& c) : n(n_tokens), pos(static_cast<size_t>(n_tokens)) {
    const size_t N = size_t(n), H = size_t(c.hidden), F = size_t(c.intermediate), Q = size_t(c.n_heads) * c.head_dim,
                 KV = size_t(c.n_kv_heads) * c.head_dim;
    std::iota(pos.begin(), pos.end(), 0);
    h1.resize(N * H);
    q.resize(N * Q);
    k.resize(N * KV);
    v.resize(N * KV);
    att.resize(N * Q);
    lse.resize(size_t(c.n_heads) * N);
    xmid.resize(N * H);
    h2.resize(N * H);
    gate.resize(N * F);
    up.resize(N * F);
    act.resize(N * F);
    tmp.resize(N * std::max(H, F));
    if (c.qk_norm) {
      q_raw.resize(N * Q);
      k_raw.resize(N * KV);
    }
  }
};

void ModelGradients::check_ids(std::span<const int32_t> ids) const {
  const int n = static_cast<int>(ids.size());
  if (n < 2) fail("gradients: a sequence of {} tokens has no next-token target; give at least 2", n);
  if (n > cfg_.context_length)
    fail("gradients: {} tokens exceed the model's context length {}", n, cfg_.context_length);
  for (int32_t id : ids)
    if (id < 0 || id >= cfg_.vocab_size)
      fail("gradients: token id {} outside the vocabulary (0..{})", id, cfg_.vocab_size - 1);
}

void ModelGradients::attention_forward_half(int l, const float* x, Work& wk, KvTrainHook* hook, bool recompute) {
  const int n = wk.n, H = cfg_.hidden, d = cfg_.head_dim, hq = cfg_.n_heads, hkv = cfg_.n_kv_heads;
  const int Q = hq * d, KV = hkv * d;
  auto w = [&](const char* what) { return find(layer_name(l, what)).w.data(); };
  const bool b = cfg_.qkv_bias;
  this->norm(layer_name(l, "attn_norm"), x, n, wk.h1.data());
  const bool norm = cfg_.qk_norm;
  linear(wk.h1.data(), w("attn_q.weight"), b ? w("attn_q.bias") : nullptr, n, H, Q, (norm ? wk.q_raw : wk.q).data());
  linear(wk.h1.data(), w("attn_k.weight"), b ? w("attn_k.bias") : nullptr, n, H, KV, (norm ? wk.k_raw : wk.k).data());
  linear(wk.h1.data(), w("attn_v.weight"), b ? w("attn_v.bias") : nullptr, n, H, KV, wk.v.data());
  if (norm) {
    const auto eps = static_cast<float>(cfg_.norm_eps);
    rmsnorm(wk.q_raw.data(), w("attn_q_norm.weight"), n * hq, d, eps, wk.q.data());
    rmsnorm(wk.k_raw.data(), w("attn_k_norm.weight"), n * hkv, d, eps, wk.k.data());
  }
  const bool late = hook && hook->after_rope();
  if (hook && !late) hook->forward(l, n, wk.k.data(), wk.v.data(), recompute);
  rope_.apply(wk.q.data(), n, hq, d, wk.pos.data());
  rope_.apply(wk.k.data(), n, hkv, d, wk.pos.data());
  if (late) hook->forward(l, n, wk.k.data(), wk.v.data(), recompute);
  attention_forward(wk.q.data(), wk.k.data(), wk.v.data(), n, hq, hkv, d, wk.att.data(), wk.lse.data());
  linear(wk.att.data(), w("attn_output.weight"), nullptr, n, Q, H, wk.xmid.data());
  for (size_t i = 0; i < size_t(n) * H; ++i) wk.xmid[i] += x[i];
}

void ModelGradients::mlp_forward_half(int l, const float* x, Work& wk, std::vector<float>* next) {
  const int n = wk.n, H = cfg_.hidden, F = cfg_.intermediate;
  auto w = [&](const char* what) { return find(layer_name(l, what)).w.data(); };
  // A parallel block's MLP reads the layer input; a sequential one the stream after attention.
  norm(layer_name(l, mlp_norm_.c_str()), cfg_.parallel_block ? x : wk.xmid.data(), n, wk.h2.data());
  linear(wk.h2.data(), w("ffn_up.weight"), nullptr, n, H, F, wk.up.data());
  if (cfg_.gated_mlp) {
    linear(wk.h2.data(), w("ffn_gate.weight"), nullptr, n, H, F, wk.gate.data());
    swiglu(wk.gate.data(), wk.up.data(), size_t(n) * F, wk.act.data());
  } else {
    gelu(wk.up.data(), size_t(n) * F, wk.act.data());
  }
  if (next) {
    next->resize(size_t(n) * H);
    linear(wk.act.data(), w("ffn_down.weight"), nullptr, n, F, H, next->data());
    for (size_t i = 0; i < next->size(); ++i) (*next)[i] += wk.xmid[i];
  }
}

LossGradients ModelGradients::compute(std::span<const int32_t> ids, const std::set<std::string>& want,
                                      KvTrainHook* hook, const LossOptions& options) {
  check_ids(ids);
  const int n = static_cast<int>(ids.size());
  for (const auto& name : want) (void)find(name);

  const int H = cfg_.hidden, F = cfg_.intermediate, d = cfg_.head_dim, hq = cfg_.n_heads, hkv = cfg_.n_kv_heads;
  const int Q = hq * d, KV = hkv * d, V = cfg_.vocab_size, L = cfg_.n_layers;
  const auto eps = static_cast<float>(cfg_.norm_eps);
  const std::string head_name = cfg_.tied_embeddings ? "token_embd.weight" : "output.weight";

  LossGradients out;
  auto grad = [&](const std::string& name) -> float* {
    if (!want.count(name)) return nullptr;
    auto& g = out.grads[name];
    if (g.empty()) g.assign(find(name).w.size(), 0.0f);
    return g.data();
  };
  auto w = [&](int l, const char* what) { return find(layer_name(l, what)).w.data(); };
  // The lowest layer whose weights (or the embedding below it, or a hook) want gradients: the
  // backward stops there.
  int lowest = hook && hook->trainable() ? 0 : L;
  for (const auto& name : want) {
    if (name == "token_embd.weight") lowest = 0;
    int l = 0;
    if (std::sscanf(name.c_str(), "blk.%d.", &l) == 1) lowest = std::min(lowest, l);
  }
  rope_.ensure(n);

  // Forward, keeping each layer's input (checkpoints[l]) and the final residual stream (checkpoints[L]).
  std::vector<std::vector<float>> checkpoints(size_t(L) + 1);
  {
    auto& x = checkpoints[0];
    x.resize(size_t(n) * H);
    const float* table = find("token_embd.weight").w.data();
    for (int t = 0; t < n; ++t) std::copy_n(table + size_t(ids[t]) * H, H, x.data() + size_t(t) * H);
  }
  Work wk(n, cfg_);
  for (int l = 0; l < L; ++l) {
    attention_forward_half(l, checkpoints[l].data(), wk, hook, false);
    mlp_forward_half(l, checkpoints[l].data(), wk, &checkpoints[size_t(l) + 1]);
  }

  // Loss head in chunks of tokens: final norm, logits, cross-entropy; dx = d loss / d residual stream.
  const bool backward = !want.empty() || (hook && hook->trainable());
  std::vector<float> dx(backward ? size_t(n) * H : 0, 0.0f);
  {
    const auto& xL = checkpoints[size_t(L)];
    const float* head = find(head_name).w.data();
    float* d_head = grad(head_name);
    const int offset = options.target_offset;
    if (offset < 1 || offset >= n)
      fail("gradients: a target offset of {} leaves no target in {} tokens (give 1 to {})", offset, n, n - 1);
    out.n_targets = n - offset;
    const float scale = 1.0f / static_cast<float>(out.n_targets);
    const bool distill = !options.teacher_logits.empty();
    if (distill && options.teacher_logits.size() != size_t(n) * V)
      fail("gradients: teacher logits of {} numbers for {} tokens x {} vocabulary", options.teacher_logits.size(), n,
           V);
    const double kl_w = options.kl_weight;
    if (options.logits_out) options.logits_out->resize(size_t(n) * V);
    std::vector<float> hn(size_t(n) * H), dhn(backward ? size_t(n) * H : 0, 0.0f);
    norm("output_norm", xL.data(), n, hn.data());
    const int chunk = std::max(1, loss_chunk_);
    std::vector<float> logits(size_t(std::min(n, chunk)) * V);
    std::vector<int32_t> targets(static_cast<size_t>(n));
    for (int t = 0; t < n; ++t) targets[t] = t + offset < n ? ids[t + offset] : -1;
    double total = 0, kl = 0;
    for (int t0 = 0; t0 < n; t0 += chunk) {
      const int rows = std::min(chunk, n - t0);
      linear(hn.data() + size_t(t0) * H, head, nullptr, rows, H, V, logits.data());
      if (options.logits_out) std::copy_n(logits.data(), size_t(rows) * V, options.logits_out->data() + size_t(t0) * V);
      if (distill) {
        const auto [c, k] =
            distill_loss(logits.data(), options.teacher_logits.data() + size_t(t0) * V, targets.data() + t0, rows, V,
                         static_cast<float>((1 - kl_w) * scale), static_cast<float>(kl_w / n), logits.data());
        total += c;
        kl += k;
      } else {
        total += cross_entropy(logits.data(), targets.data() + t0, rows, V, scale, logits.data());
      }
      if (backward)
        linear_backward(hn.data() + size_t(t0) * H, head, logits.data(), rows, H, V, dhn.data() + size_t(t0) * H,
                        d_head, nullptr);
    }
    out.ce = total / out.n_targets;
    out.kl = kl / n;
    out.loss = distill ? (1 - kl_w) * out.ce + kl_w * out.kl : out.ce;
    if (backward) norm_backward("output_norm", xL.data(), dhn.data(), n, dx.data(), grad);
  }
  if (!backward) return out;

  // Layers from the top down to `lowest`: recompute the layer's forward, then its backward. dx enters
  // as d loss / d (layer output) and leaves as d loss / d (layer input).
  std::vector<float> dmid(size_t(n) * H), dh(size_t(n) * H), dgate(size_t(n) * F), dup(size_t(n) * F),
      dq(size_t(n) * Q), dk(size_t(n) * KV), dv(size_t(n) * KV), datt(size_t(n) * Q);
  std::vector<float> dq_raw(cfg_.qk_norm ? size_t(n) * Q : 0), dk_raw(cfg_.qk_norm ? size_t(n) * KV : 0);
  for (int l = L - 1; l >= lowest; --l) {
    const auto& x = checkpoints[size_t(l)];
    attention_forward_half(l, x.data(), wk, hook, true);
    mlp_forward_half(l, x.data(), wk, nullptr);
    const auto& pos = wk.pos;
    const auto &h1 = wk.h1, &q = wk.q, &k = wk.k, &v = wk.v, &att = wk.att, &lse = wk.lse, &xmid = wk.xmid, &h2 = wk.h2,
               &gate = wk.gate, &up = wk.up, &act = wk.act;
    auto& tmp = wk.tmp;
    auto g = [&](const char* what) { return grad(layer_name(l, what)); };
    // MLP: x_out = xmid + down(silu(gate(h2)) * up(h2)) (or down(gelu(up(h2)))), h2 = norm'(xmid), or of x
    // in a parallel block.
    std::fill(tmp.begin(), tmp.begin() + ptrdiff_t(size_t(n) * F), 0.0f);
    linear_backward(act.data(), w(l, "ffn_down.weight"), dx.data(), n, F, H, tmp.data(), g("ffn_down.weight"), nullptr);
    std::fill(dh.begin(), dh.end(), 0.0f);
    if (cfg_.gated_mlp) {
      swiglu_backward(gate.data(), up.data(), tmp.data(), size_t(n) * F, dgate.data(), dup.data());
      linear_backward(h2.data(), w(l, "ffn_gate.weight"), dgate.data(), n, H, F, dh.data(), g("ffn_gate.weight"),
                      nullptr);
    } else {
      gelu_backward(up.data(), tmp.data(), size_t(n) * F, dup.data());
    }
    linear_backward(h2.data(), w(l, "ffn_up.weight"), dup.data(), n, H, F, dh.data(), g("ffn_up.weight"), nullptr);
    dmid = dx;
    // Falcon-7B's MLP reads attn_norm's output: its dh joins the attention's below, one norm backward.
    const bool shared_norm = !cfg_.mlp_norm;
    if (!shared_norm)
      norm_backward(layer_name(l, mlp_norm_.c_str()), cfg_.parallel_block ? x.data() : xmid.data(), dh.data(), n,
                    cfg_.parallel_block ? dx.data() : dmid.data(), grad);
    // Attention: xmid = x + o(attn(rope(q(h1)), rope(k(h1)), v(h1))), h1 = norm(x).
    std::fill(datt.begin(), datt.end(), 0.0f);
    linear_backward(att.data(), w(l, "attn_output.weight"), dmid.data(), n, Q, H, datt.data(), g("attn_output.weight"),
                    nullptr);
    attention_backward(q.data(), k.data(), v.data(), att.data(), lse.data(), datt.data(), n, hq, hkv, d, dq.data(),
                       dk.data(), dv.data());
    // RoPE is a rotation: its backward is the inverse rotation. A hook acts on the side of RoPE it
    // acted on in the forward.
    const bool hooked = hook && hook->trainable();
    if (hooked && hook->after_rope()) hook->backward(l, n, dk.data(), dv.data());
    rope_.apply_inverse(dq.data(), n, hq, d, pos.data());
    rope_.apply_inverse(dk.data(), n, hkv, d, pos.data());
    if (hooked && !hook->after_rope()) hook->backward(l, n, dk.data(), dv.data());
    // Qwen3: through the per-head q/k norms to the projections.
    float* dq_in = dq.data();
    float* dk_in = dk.data();
    if (cfg_.qk_norm) {
      std::fill(dq_raw.begin(), dq_raw.end(), 0.0f);
      std::fill(dk_raw.begin(), dk_raw.end(), 0.0f);
      rmsnorm_backward(wk.q_raw.data(), w(l, "attn_q_norm.weight"), dq.data(), n * hq, d, eps, dq_raw.data(),
                       g("attn_q_norm.weight"));
      rmsnorm_backward(wk.k_raw.data(), w(l, "attn_k_norm.weight"), dk.data(), n * hkv, d, eps, dk_raw.data(),
                       g("attn_k_norm.weight"));
      dq_in = dq_raw.data();
      dk_in = dk_raw.data();
    }
    if (!shared_norm) std::fill(dh.begin(), dh.end(), 0.0f);
    const bool b = cfg_.qkv_bias;
    linear_backward(h1.data(), w(l, "attn_q.weight"), dq_in, n, H, Q, dh.data(), g("attn_q.weight"),
                    b ? g("attn_q.bias") : nullptr);
    linear_backward(h1.data(), w(l, "attn_k.weight"), dk_in, n, H, KV, dh.data(), g("attn_k.weight"),
                    b ? g("attn_k.bias") : nullptr);
    linear_backward(h1.data(), w(l, "attn_v.weight"), dv.data(), n, H, KV, dh.data(), g("attn_v.weight"),
                    b ? g("attn_v.bias") : nullptr);
    // d x_in = d xmid (the residual) + the norms' share; in a parallel block d xmid = d x_out, and dx
    // already holds the MLP norm's share.
    if (!cfg_.parallel_block) dx = dmid;
    norm_backward(layer_name(l, "attn_norm"), x.data(), dh.data(), n, dx.data(), grad);
  }
  if (lowest == 0)
    if (float* de = grad("token_embd.weight")) embed_backward(ids.data(), n, H, dx.data(), de);
  return out;
}

std::vector<double> ModelGradients::attention_distortion(std::span<const int32_t> ids, KvTrainHook& hook, double eps) {
  if (hook.after_rope()) fail("gradients: the layer-local distortion takes hooks on pre-RoPE keys only");
  check_ids(ids);
  const int n = static_cast<int>(ids.size());
  const int H = cfg_.hidden, d = cfg_.head_dim, hq = cfg_.n_heads, hkv = cfg_.n_kv_heads;
  const int Q = hq * d, KV = hkv * d, L = cfg_.n_layers;
  rope_.ensure(n);
  std::vector<float> x(size_t(n) * H), next;
  const float* table = find("token_embd.weight").w.data();
  for (int t = 0; t < n; ++t) std::copy_n(table + size_t(ids[t]) * H, H, x.data() + size_t(t) * H);

  // Captures the layer's pre-RoPE K and V as the frozen model computes them, unchanged.
  struct Tap final : KvTrainHook {
    std::vector<float> k, v;
    void forward(int, int, float* kk, float* vv, bool) override {
      std::copy_n(kk, k.size(), k.begin());
      std::copy_n(vv, v.size(), v.begin());
    }
    void backward(int, int, float*, float*) override {}
  } tap;
  tap.k.resize(size_t(n) * KV);
  tap.v.resize(size_t(n) * KV);
  Work wk(n, cfg_);
  std::vector<float> y(size_t(n) * H), att(size_t(n) * Q), lse(size_t(hq) * n), datt(size_t(n) * Q), dq(size_t(n) * Q),
      dk(size_t(n) * KV), dv(size_t(n) * KV), dy(size_t(n) * H);
  std::vector<double> out(static_cast<size_t>(L));
  for (int l = 0; l < L; ++l) {
    const float* wo = find(layer_name(l, "attn_output.weight")).w.data();
    attention_forward_half(l, x.data(), wk, &tap, false);
    // Teacher: the layer's own attention output; wk.q is post-RoPE.
    linear(wk.att.data(), wo, nullptr, n, Q, H, y.data());
    // Student: the same queries over the hook's K and V.
    hook.forward(l, n, tap.k.data(), tap.v.data(), false);
    rope_.apply(tap.k.data(), n, hkv, d, wk.pos.data());
    attention_forward(wk.q.data(), tap.k.data(), tap.v.data(), n, hq, hkv, d, att.data(), lse.data());
    linear(att.data(), wo, nullptr, n, Q, H, dy.data());
    double err = 0, energy = 0;
    for (size_t i = 0; i < y.size(); ++i) {
      const double e = double(dy[i]) - y[i];
      err += e * e;
      energy += double(y[i]) * y[i];
    }
    const double denom = energy / n + eps;
    out[size_t(l)] = err / n / denom;
    const auto scale = static_cast<float>(2.0 / (n * denom));
    for (size_t i = 0; i < y.size(); ++i) dy[i] = (dy[i] - y[i]) * scale;
    std::fill(datt.begin(), datt.end(), 0.0f);
    linear_backward(att.data(), wo, dy.data(), n, Q, H, datt.data(), nullptr, nullptr);
    attention_backward(wk.q.data(), tap.k.data(), tap.v.data(), att.data(), lse.data(), datt.data(), n, hq, hkv, d,
                       dq.data(), dk.data(), dv.data());
    rope_.apply_inverse(dk.data(), n, hkv, d, wk.pos.data());
    hook.backward(l, n, dk.data(), dv.data());
    mlp_forward_half(l, x.data(), wk, &next);
    x.swap(next);
  }
  return out;
}

}  // namespace kvb
