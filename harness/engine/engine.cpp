#include "harness/engine/engine.hpp"

#include <algorithm>
#include <chrono>
#include <cmath>
#include <numeric>

#include "harness/engine/rope_freqs.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/error.hpp"

namespace kvb {

struct Engine::Norm {
  Buffer w, b;  // b empty for RMSNorm
};

struct Engine::Matrices {
  Weight wq, wk, wv, wo, w_gate, w_up, w_down;  // w_gate empty without a gated MLP
  Weight& operator[](Matrix m) {
    switch (m) {
      case Matrix::Q:
        return wq;
      case Matrix::K:
        return wk;
      case Matrix::V:
        return wv;
      case Matrix::O:
        return wo;
      case Matrix::Gate:
        return w_gate;
      case Matrix::Up:
        return w_up;
      case Matrix::Down:
        break;
    }
    return w_down;
  }
};

struct Engine::Layer {
  Norm attn_norm, ffn_norm;  // ffn_norm empty where the MLP reads attn_norm's output
  Buffer bq, bk, bv, q_norm, k_norm;
  Matrices w;
};

const char* matrix_name(Matrix m) {
  constexpr const char* names[] = {"q", "k", "v", "o", "gate", "up", "down"};
  return names[static_cast<int>(m)];
}

const char* matrix_input_name(MatrixInput s) {
  constexpr const char* names[] = {"attention", "attention_output", "mlp", "mlp_hidden"};
  return names[static_cast<int>(s)];
}

MatrixInput input_of(Matrix m) {
  switch (m) {
    case Matrix::Q:
    case Matrix::K:
    case Matrix::V:
      return MatrixInput::Attention;
    case Matrix::O:
      return MatrixInput::AttentionOutput;
    case Matrix::Gate:
    case Matrix::Up:
      return MatrixInput::Mlp;
    case Matrix::Down:
      break;
  }
  return MatrixInput::MlpHidden;
}

std::string matrix_tensor(int l, Matrix m) {
  constexpr const char* names[] = {"attn_q", "attn_k", "attn_v", "attn_output", "ffn_gate", "ffn_up", "ffn_down"};
  return fmt::format("blk.{}.{}.weight", l, names[static_cast<int>(m)]);
}

namespace {

// Weights are dequantized once, at load: vectors to fp32, matrices to the backend's weight format.
Buffer load(Backend& b, const ModelFile& m, const std::string& name, size_t& bytes) {
  const auto v = m.load_f32(name);
  Buffer buf(b, v.size());
  b.upload(buf, v);
  bytes += v.size() * sizeof(float);
  return buf;
}

Weight load_matrix(Backend& b, const ModelFile& m, const std::string& name, size_t& bytes) {
  const TensorRef& t = m.tensor(name);
  const int rows = static_cast<int>(t.ne[1]), cols = static_cast<int>(t.ne[0]);
  Weight w = b.stores_blocks(t.type) ? Weight(b, t.type, t.data, rows, cols) : Weight(b, m.load_f32(name), rows, cols);
  bytes += w.bytes();
  return w;
}

}  // namespace

Engine::Engine(const ModelFile& model, const EngineOptions& opt)
    : model_(model), cfg_(model.config()), backend_(make_backend(opt.backend, opt.threads)), opt_(opt) {
  model.validate_tensors();
  Backend& b = *backend_;
  if (opt.weights) b.set_weight_format(*opt.weights);
  b.set_rope(rope_inv_freq(cfg_), cfg_.rope_layout == RopeLayout::Interleaved);
  auto load_norm = [&](const std::string& name) {
    Norm n{load(b, model, name + ".weight", weight_bytes_), {}};
    if (cfg_.layer_norm) n.b = load(b, model, name + ".bias", weight_bytes_);
    return n;
  };
  tok_embd_ = load_matrix(b, model, "token_embd.weight", weight_bytes_);
  out_norm_ = std::make_unique<Norm>(load_norm("output_norm"));
  if (!cfg_.tied_embeddings) output_ = load_matrix(b, model, "output.weight", weight_bytes_);
  layers_.resize(cfg_.n_layers);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    const std::string p = fmt::format("blk.{}.", l);
    Layer& L = layers_[l];
    L.attn_norm = load_norm(p + "attn_norm");
    if (cfg_.mlp_norm) L.ffn_norm = load_norm(p + mlp_norm_name(cfg_));
    for (Matrix m : kMatrices)
      if (m != Matrix::Gate || cfg_.gated_mlp) L.w[m] = load_matrix(b, model, matrix_tensor(l, m), weight_bytes_);
    if (cfg_.qkv_bias) {
      L.bq = load(b, model, p + "attn_q.bias", weight_bytes_);
      L.bk = load(b, model, p + "attn_k.bias", weight_bytes_);
      L.bv = load(b, model, p + "attn_v.bias", weight_bytes_);
    }
    if (cfg_.qk_norm) {
      L.q_norm = load(b, model, p + "attn_q_norm.weight", weight_bytes_);
      L.k_norm = load(b, model, p + "attn_k_norm.weight", weight_bytes_);
    }
  }
  reset_caches();
}

Engine::~Engine() = default;

void Engine::norm(const Norm& w, const Buffer& x, int n, Buffer& y, size_t x_row) {
  const int H = cfg_.hidden;
  const auto eps = static_cast<float>(cfg_.norm_eps);
  if (cfg_.layer_norm)
    backend_->layernorm(x, w.w, w.b, n, H, eps, y, x_row * H);
  else
    backend_->rmsnorm(x, w.w, n, H, eps, y, x_row * H);
}

const Engine::Norm& Engine::mlp_norm(const Layer& L) const { return cfg_.mlp_norm ? L.ffn_norm : L.attn_norm; }

void Engine::linear(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y,
                    bool apart) {
  if (apart)
    backend_->linear_tokens(x, w, bias, n, in, out, y);
  else
    backend_->linear(x, w, bias, n, in, out, y);
}

void Engine::linears(const Buffer& x, std::span<const Backend::Product> ps, int n, int in, bool apart) {
  if (apart) return backend_->linear_tokens_shared(x, ps, n, in);
  for (const Backend::Product& p : ps) backend_->linear(x, *p.w, p.bias, n, in, p.out, *p.y);
}

void Engine::mlp(int l, Buffer& in, int n, Buffer& gate, Buffer& up, Buffer& act, Buffer& out, bool apart) {
  Backend& b = *backend_;
  const int H = cfg_.hidden, F = cfg_.intermediate;
  const Matrices& w = matrices(l);
  change_inputs(l, MatrixInput::Mlp, in, n, H);
  if (cfg_.gated_mlp) {
    const Backend::Product ps[] = {{&w.w_up, nullptr, F, &up}, {&w.w_gate, nullptr, F, &gate}};
    linears(in, ps, n, H, apart);
    b.swiglu(gate, up, size_t(n) * F, act);
  } else {
    linear(in, w.w_up, nullptr, n, H, F, up, apart);
    b.gelu(up, size_t(n) * F, act);
  }
  change_inputs(l, MatrixInput::MlpHidden, act, n, F);
  linear(act, w.w_down, nullptr, n, F, H, out, apart);
}

void Engine::project_qkv(int l, Buffer& h, int n, Buffer& q, Buffer& k, Buffer& v, bool apart) {
  Backend& b = *backend_;
  const int H = cfg_.hidden, d = cfg_.head_dim, Q = cfg_.n_heads * d, KV = cfg_.n_kv_heads * d;
  const bool bias = cfg_.qkv_bias;
  const Layer& L = layers_[size_t(l)];
  const Matrices& w = matrices(l);
  change_inputs(l, MatrixInput::Attention, h, n, H);
  const Backend::Product ps[] = {{&w.wq, bias ? &L.bq : nullptr, Q, &q},
                                 {&w.wk, bias ? &L.bk : nullptr, KV, &k},
                                 {&w.wv, bias ? &L.bv : nullptr, KV, &v}};
  linears(h, ps, n, H, apart);
  if (cfg_.qk_norm) {  // each head's row normalised in place (rmsnorm reads a row before writing it)
    const auto eps = static_cast<float>(cfg_.norm_eps);
    b.rmsnorm(q, L.q_norm, n * cfg_.n_heads, d, eps, q);
    b.rmsnorm(k, L.k_norm, n * cfg_.n_kv_heads, d, eps, k);
  }
}

size_t Sequence::kv_bytes() const {
  size_t b = 0;
  for (const auto& c : caches_) b += c.bytes();
  return b;
}

size_t Engine::kv_bytes() const { return seq_.kv_bytes(); }

size_t Engine::decode_buffer_bytes() const {
  const size_t H = cfg_.hidden, F = cfg_.intermediate, Q = size_t(cfg_.n_heads) * cfg_.head_dim,
               KV = size_t(cfg_.n_kv_heads) * cfg_.head_dim, V = cfg_.vocab_size;
  // x, h, proj, mlp_out and the head's norm; q, attn and the observer's host copy; k, v and their host
  // copies; gate, up, act; the logits in backend memory and on the host.
  return sizeof(float) * (5 * H + 3 * Q + 4 * KV + 3 * F + 2 * V);
}

size_t Engine::full_kv_bytes(size_t tokens) const {
  return tokens * size_t(cfg_.n_layers) * cfg_.n_kv_heads * cfg_.head_dim * 2 * kv_dtype_bytes(opt_.kv_dtype);
}

std::vector<float> Engine::logits_of_last(const Buffer& x, int n) {
  Backend& b = *backend_;
  const int H = cfg_.hidden, V = cfg_.vocab_size;
  Buffer h(b, H), logits(b, V);
  norm(*out_norm_, x, 1, h, size_t(n - 1));
  b.linear(h, cfg_.tied_embeddings ? tok_embd_ : output_, nullptr, 1, H, V, logits);
  std::vector<float> out(V);
  b.download(logits, out);
  return out;
}

std::vector<std::vector<float>> Engine::logits_of_rows(const Buffer& x, int n, Buffer& h, Buffer& logits) {
  Backend& b = *backend_;
  const int H = cfg_.hidden, V = cfg_.vocab_size;
  norm(*out_norm_, x, n, h);
  b.linear_tokens(h, cfg_.tied_embeddings ? tok_embd_ : output_, nullptr, n, H, V, logits);
  std::vector<std::vector<float>> out(static_cast<size_t>(n), std::vector<float>(static_cast<size_t>(V)));
  for (int r = 0; r < n; ++r) b.download(logits, out[size_t(r)], size_t(r) * V);
  return out;
}

double log_softmax_at(std::span<const float> logits, int32_t target) {
  if (target < 0 || size_t(target) >= logits.size()) fail("token {} is outside the vocabulary", target);
  const float top = *std::max_element(logits.begin(), logits.end());
  double sum = 0;
  for (float x : logits) sum += std::exp(double(x) - double(top));
  return double(logits[size_t(target)]) - double(top) - std::log(sum);
}

std::vector<double> Engine::next_token_logprobs(const Buffer& x, std::span<const int32_t> ids) {
  Backend& b = *backend_;
  const int n = static_cast<int>(ids.size()), H = cfg_.hidden, V = cfg_.vocab_size;
  // Rows per chunk: the logits of a chunk are chunk x vocabulary floats.
  const int chunk = std::max(1, std::min(n - 1, 64));
  Buffer h(b, size_t(chunk) * H), logits(b, size_t(chunk) * V);
  std::vector<float> host(size_t(chunk) * V);
  std::vector<double> out;
  out.reserve(size_t(n > 0 ? n - 1 : 0));
  for (int t0 = 0; t0 < n - 1; t0 += chunk) {
    const int rows = std::min(chunk, n - 1 - t0);
    norm(*out_norm_, x, rows, h, size_t(t0));
    b.linear(h, cfg_.tied_embeddings ? tok_embd_ : output_, nullptr, rows, H, V, logits);
    b.download(logits, std::span<float>(host.data(), size_t(rows) * V));
    for (int r = 0; r < rows; ++r)
      out.push_back(
          log_softmax_at(std::span<const float>(host.data() + size_t(r) * V, size_t(V)), ids[size_t(t0 + r + 1)]));
  }
  return out;
}

std::vector<float> Engine::prefill(std::span<const int32_t> ids, PrefillObserver* observer,
                                   std::vector<double>* next_logprobs) {
  return run_prefill(ids, observer, next_logprobs, nullptr);
}

void Engine::prefill_layers(std::span<const int32_t> ids, int first, int last, std::vector<float>& hidden,
                            PrefillObserver* observer) {
  if (first < 0 || last <= first || last > cfg_.n_layers)
    fail("prefill_layers: layers [{}, {}) asked of a model with {} layers", first, last, cfg_.n_layers);
  if (first > 0 && hidden.size() != ids.size() * size_t(cfg_.hidden))
    fail("prefill_layers: {} hidden-state numbers for {} tokens of width {}", hidden.size(), ids.size(), cfg_.hidden);
  if (observer && observer->reads_whole_prompt())
    fail("prefill_layers: an observer that reads the whole prompt needs every layer");
  run_prefill(ids, observer, nullptr, nullptr, {first, last, &hidden});
}

std::vector<float> Engine::run_prefill(std::span<const int32_t> ids, PrefillObserver* observer,
                                       std::vector<double>* next_logprobs, const PrefillCapture* past) {
  return run_prefill(ids, observer, next_logprobs, past, {0, cfg_.n_layers, nullptr});
}

std::vector<float> Engine::run_prefill(std::span<const int32_t> ids, PrefillObserver* observer,
                                       std::vector<double>* next_logprobs, const PrefillCapture* past,
                                       const LayerRange& range) {
  if (ids.empty()) fail("prefill: empty prompt");
  const int n = static_cast<int>(ids.size());
  if (n > cfg_.context_length)
    fail("prompt of {} tokens exceeds the model's context length {}", n, cfg_.context_length);
  if (cfg_.sliding_window > 0 && n > cfg_.sliding_window)
    fail(
        "prompt of {} tokens is longer than the model's sliding attention window ({} tokens), which kvbench does not "
        "implement: attention over the whole prompt would differ from the model's",
        n, cfg_.sliding_window);
  for (auto id : ids)
    if (id < 0 || id >= cfg_.vocab_size) fail("prefill: token id {} outside the vocabulary", id);
  if (observer && observer->reads_whole_prompt())
    return resume(prefill_capture(ids, observer->needs(), next_logprobs), observer);
  Backend& b = *backend_;
  const int H = cfg_.hidden, F = cfg_.intermediate, d = cfg_.head_dim;
  const int hq = cfg_.n_heads, hkv = cfg_.n_kv_heads, Q = hq * d, KV = hkv * d;
  const PrefillNeeds needs = observer ? observer->needs() : PrefillNeeds{};
  const int window = std::min(needs.window, n);
  // A continued prefill computes only the rows after `past` (n0 of them kept); the views still cover
  // the whole prompt.
  const int n0 = past ? past->n_tokens : 0, n1 = n - n0;
  const int past_window = std::max(0, window - n1);  // window rows that come from the past's queries
  if (past) {
    if (n1 < 1 || !std::equal(past->ids.begin(), past->ids.end(), ids.begin()))
      fail("internal: a prefill continues only a capture of a proper prefix of its prompt");
    if (past_window > past->window || (needs.k_pre_rope && !past->needs.k_pre_rope) ||
        (needs.attn_colsum && !past->needs.attn_colsum) ||
        (observer && (observer->kv_transform() || observer->linear_transform())) || next_logprobs ||
        !b.continues_prefill())
      fail("internal: this prefill cannot continue the capture it was given");
  }

  reset_caches();
  b.forget_caches();
  seq_.transform_ = observer ? observer->kv_transform() : nullptr;
  seq_.linear_ = observer ? observer->linear_transform() : nullptr;
  KvTransform* const transforms[1] = {seq_.transform_};
  use_linear_transforms({&seq_.linear_, 1});
  std::vector<int32_t> pos(n);
  std::iota(pos.begin(), pos.end(), 0);
  const std::span<const int32_t> new_pos = std::span<const int32_t>(pos).subspan(size_t(n0));

  Buffer x(b, size_t(n1) * H), h(b, size_t(n1) * H), q(b, size_t(n1) * Q), k(b, size_t(n1) * KV), v(b, size_t(n1) * KV),
      attn(b, size_t(n1) * Q), proj(b, size_t(n1) * H);
  const int mc = std::min(n1, opt_.mlp_chunk);
  Buffer gate(b, size_t(mc) * F), up(b, size_t(mc) * F), act(b, size_t(mc) * F), mlp_in(b, size_t(mc) * H),
      mlp_out(b, size_t(mc) * H);
  if (range.first > 0)
    b.upload(x, *range.hidden);
  else
    b.embed(tok_embd_, ids.subspan(size_t(n0)), H, x);

  // The host side of a layer (the cache of record, the observer) runs while the backend computes the
  // next layer: layer l's K/V (and whatever the observer asked for) land in staging slot l % 2.
  struct Staged {
    float *k = nullptr, *v = nullptr, *k_pre = nullptr, *q_win = nullptr;
    std::vector<float> colsum;
  };
  Staged staged[2];
  auto finish_layer = [&](int l) {
    Staged& st = staged[l % 2];
    b.wait(l % 2);
    if (!observer) {
      seq_.caches_[l].append_many(st.k, st.v, n, pos.data());
      return;
    }
    if (past && needs.attn_colsum)  // the past queries' share of each past key's sum
      for (int hd = 0; hd < hq; ++hd)
        for (int j = 0; j < n0; ++j) st.colsum[size_t(hd) * n + j] += past->attn_colsum[l][size_t(hd) * n0 + j];
    PrefillView view;
    view.layer = l;
    view.n_tokens = n;
    view.n_heads = hq;
    view.n_kv_heads = hkv;
    view.head_dim = d;
    view.positions = pos.data();
    view.k = st.k;
    view.v = st.v;
    view.k_pre_rope = needs.k_pre_rope ? st.k_pre : nullptr;
    view.attn_colsum = needs.attn_colsum ? st.colsum.data() : nullptr;
    view.window = window;
    view.q_window = window > 0 ? st.q_win : nullptr;
    view.kv_dtype = opt_.kv_dtype;
    observer->on_layer(view, seq_.caches_[l]);
    // Whatever the observer built follows the run's dtype (a MethodRunner has stored it already).
    seq_.caches_[l].store_as(opt_.kv_dtype);
  };

  const size_t kv_elems = size_t(n) * KV, kv_old = size_t(n0) * KV, kv_new = size_t(n1) * KV;
  for (int l = range.first; l < range.last; ++l) {
    Layer& L = layers_[l];
    const int slot = l % 2;
    Staged& st = staged[slot];
    st.k = b.stage(slot, kv_elems * (needs.k_pre_rope ? 3 : 2) + size_t(window) * Q);
    st.v = st.k + kv_elems;
    st.k_pre = needs.k_pre_rope ? st.v + kv_elems : nullptr;
    st.q_win = st.v + kv_elems * (needs.k_pre_rope ? 2 : 1);
    if (past) {
      std::copy_n(past->k[l].data(), kv_old, st.k);
      std::copy_n(past->v[l].data(), kv_old, st.v);
      if (st.k_pre) std::copy_n(past->k_pre_rope[l].data(), kv_old, st.k_pre);
      if (observer && past_window > 0)
        std::copy_n(past->q_window[l].data() + size_t(past->window - past_window) * Q, size_t(past_window) * Q,
                    st.q_win);
    }

    norm(L.attn_norm, x, n1, h);
    project_qkv(l, h, n1, q, k, v);
    transform(l, k, v, new_pos, transforms, false);
    if (observer && needs.k_pre_rope) b.download_async(k, {st.k_pre + kv_old, kv_new});
    b.rope(q, n1, hq, d, new_pos);
    b.rope(k, n1, hkv, d, new_pos);
    transform(l, k, v, new_pos, transforms, true);
    std::vector<float>* colsum = observer && needs.attn_colsum ? &st.colsum : nullptr;
    if (past)  // the staged copies of the past rows: page-locked memory a GPU reads without waiting
      b.attention_prefill_continued(q, k, v, {st.k, st.v, n0}, n1, hq, hkv, d, attn, colsum);
    else
      b.attention_prefill(q, k, v, n1, hq, hkv, d, attn, colsum);
    b.download_async(k, {st.k + kv_old, kv_new});
    b.download_async(v, {st.v + kv_old, kv_new});
    if (observer && window > past_window)
      b.download_async(q, {st.q_win + size_t(past_window) * Q, size_t(window - past_window) * Q},
                       size_t(n1 - (window - past_window)) * Q);
    b.fence(slot);
    change_inputs(l, MatrixInput::AttentionOutput, attn, n1, Q);
    b.linear(attn, matrices(l).wo, nullptr, n1, Q, H, proj);
    // A parallel block's MLP reads the layer's input: the attention joins the stream after it.
    if (!cfg_.parallel_block) b.add(x, proj, size_t(n1) * H);

    for (int t0 = 0; t0 < n1; t0 += mc) {
      const int rows = std::min(mc, n1 - t0);
      norm(mlp_norm(L), x, rows, mlp_in, size_t(t0));
      mlp(l, mlp_in, rows, gate, up, act, mlp_out);
      b.add(x, mlp_out, size_t(rows) * H, size_t(t0) * H);
    }
    if (cfg_.parallel_block) b.add(x, proj, size_t(n1) * H);
    if (l > range.first) finish_layer(l - 1);
  }
  finish_layer(range.last - 1);
  if (range.hidden) {  // a partial pass leaves nothing to decode from
    range.hidden->resize(size_t(n) * H);
    b.download(x, *range.hidden);
    seq_ = Sequence{};
    reset_caches();
    return {};
  }
  seq_.pos_ = n;
  seq_.observer_ = observer && observer->acts_on_decode() ? observer : nullptr;
  if (next_logprobs) *next_logprobs = next_token_logprobs(x, ids);
  return logits_of_last(x, n1);
}

namespace {

// Copies every layer's views into a PrefillCapture; keeps no cache.
class Capturer final : public PrefillObserver {
 public:
  Capturer(PrefillCapture& c, int layers) : c_(c) {
    for (auto* v : {&c_.k, &c_.v, &c_.k_pre_rope, &c_.q_window, &c_.attn_colsum}) v->resize(layers);
  }
  PrefillNeeds needs() const override { return c_.needs; }
  void on_layer(const PrefillView& view, LayerCache&) override {
    const size_t kv = size_t(view.n_tokens) * view.n_kv_heads * view.head_dim;
    auto copy = [](const float* p, size_t n, std::vector<float>& into) {
      if (p) into.assign(p, p + n);
    };
    copy(view.k, kv, c_.k[view.layer]);
    copy(view.v, kv, c_.v[view.layer]);
    copy(view.k_pre_rope, kv, c_.k_pre_rope[view.layer]);
    copy(view.q_window, size_t(view.window) * view.n_heads * view.head_dim, c_.q_window[view.layer]);
    copy(view.attn_colsum, size_t(view.n_heads) * view.n_tokens, c_.attn_colsum[view.layer]);
    c_.window = view.window;
  }

 private:
  PrefillCapture& c_;
};

}  // namespace

void Engine::transform(int l, Buffer& k, Buffer& v, std::span<const int32_t> pos,
                       std::span<KvTransform* const> transforms, bool after_rope) {
  auto applies = [&](const KvTransform* t) { return t && t->after_rope() == after_rope; };
  if (std::none_of(transforms.begin(), transforms.end(), applies)) return;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t row = size_t(cfg_.n_kv_heads) * cfg_.head_dim, kv = pos.size() * row;
  const size_t rows = pos.size() / transforms.size();
  tk_.resize(kv);
  tv_.resize(kv);
  backend_->download(k, tk_);
  backend_->download(v, tv_);
  for (size_t s = 0; s < transforms.size(); ++s)
    if (applies(transforms[s]))
      transforms[s]->apply(l, static_cast<int>(rows), pos.data() + s * rows, tk_.data() + s * rows * row,
                           tv_.data() + s * rows * row);
  backend_->upload(k, tk_);
  backend_->upload(v, tv_);
  transform_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Engine::use_linear_transforms(std::span<LinearTransform* const> ts) {
  linear_pass_.assign(ts.begin(), ts.end());
  auto key = [](const LinearTransform* t) { return t ? t->weights_key() : std::string(); };
  const std::string k = key(ts[0]);
  for (size_t s = 1; s < ts.size(); ++s)
    if (key(ts[s]) != k)
      fail(
          "decode_batch: sequence {} runs the model's weights {} and sequence 0 {}: sequences whose methods change the "
          "weights differently cannot share a step",
          s, key(ts[s]).empty() ? "unchanged" : "as " + key(ts[s]), k.empty() ? "unchanged" : "as " + k);
  changed_active_ = false;
  // One changed set is kept, and only while passes use it: the old one goes before a new one is made, and
  // when a pass runs the model's own (a 7B model's copy is 14-28 GB).
  if (k != changed_key_) {
    changed_.clear();
    changed_key_.clear();
  }
  if (k.empty()) return;
  if (k == changed_key_) {
    changed_active_ = true;
    return;
  }
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<Matrices> made(size_t(cfg_.n_layers));
  std::vector<bool> which(size_t(cfg_.n_layers));
  for (int l = 0; l < cfg_.n_layers; ++l) {
    which[size_t(l)] = ts[0]->changes_layer(l);
    if (!which[size_t(l)]) continue;
    for (Matrix m : kMatrices) {
      if (m == Matrix::Gate && !cfg_.gated_mlp) continue;
      const std::string name = matrix_tensor(l, m);
      const TensorRef& t = model_.tensor(name);
      const int rows = static_cast<int>(t.ne[1]), cols = static_cast<int>(t.ne[0]);
      std::vector<float> w = model_.load_f32(name);
      ts[0]->weights(l, m, w.data(), rows, cols);
      made[size_t(l)][m] = Weight(*backend_, w, rows, cols);
    }
  }
  changed_ = std::move(made);
  changed_layer_ = std::move(which);
  changed_key_ = k;
  changed_active_ = true;
  transform_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

const Engine::Matrices& Engine::matrices(int l) const {
  return changed_active_ && changed_layer_[size_t(l)] ? changed_[size_t(l)] : layers_[size_t(l)].w;
}

void Engine::change_inputs(int l, MatrixInput site, Buffer& x, int n, int cols) {
  if (std::none_of(linear_pass_.begin(), linear_pass_.end(), [](const LinearTransform* t) { return t; })) return;
  const auto t0 = std::chrono::steady_clock::now();
  const size_t all = size_t(n) * cols, rows = size_t(n) / linear_pass_.size();
  tx_.resize(all);
  backend_->download(x, tx_);
  for (size_t s = 0; s < linear_pass_.size(); ++s)
    if (linear_pass_[s]) linear_pass_[s]->inputs(l, site, tx_.data() + s * rows * cols, static_cast<int>(rows), cols);
  backend_->upload(x, tx_);
  transform_seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

void Engine::reset_caches() {
  // A new sequence starts from the model's layout: a method may have left a cache of another shape
  // (one head per query head in GQA repeat mode), and appending the model's KV rows to it would read
  // past them.
  seq_.caches_.clear();
  for (int l = 0; l < cfg_.n_layers; ++l)
    seq_.caches_.emplace_back(cfg_.n_heads, cfg_.n_kv_heads, cfg_.head_dim, opt_.kv_dtype);
  // The last decode's working buffers let go too: a prefill's peak memory does not count them.
  decode_ = {};
}

PrefillCapture Engine::prefill_capture(std::span<const int32_t> ids, const PrefillNeeds& needs,
                                       std::vector<double>* next_logprobs, const PrefillCapture* prefix) {
  PrefillCapture c;
  c.needs = needs;
  c.n_tokens = static_cast<int>(ids.size());
  c.ids.assign(ids.begin(), ids.end());
  c.positions.resize(ids.size());
  std::iota(c.positions.begin(), c.positions.end(), 0);
  Capturer cap(c, cfg_.n_layers);
  c.logits = run_prefill(ids, &cap, next_logprobs, prefix);
  seq_.pos_ = 0;  // the capture holds no cache to decode from
  return c;
}

std::vector<float> Engine::resume(const PrefillCapture& c, PrefillObserver* observer) {
  const PrefillNeeds want = observer ? observer->needs() : PrefillNeeds{};
  if (observer && (observer->kv_transform() || observer->linear_transform()))
    fail("resume: the method changes the model; it needs a prefill of its own, not a capture");
  seq_.transform_ = nullptr;
  seq_.linear_ = nullptr;
  // A capture keeps at most every prompt row (window = min(wanted, n)), which serves any larger want.
  if (std::min(want.window, c.n_tokens) > c.window || (want.k_pre_rope && !c.needs.k_pre_rope) ||
      (want.attn_colsum && !c.needs.attn_colsum))
    fail("resume: the capture lacks what the method needs (window {} of {}, pre-RoPE keys, accumulated attention)",
         want.window, c.window);
  if (observer && observer->reads_whole_prompt()) observer->on_prompt(*this, c.ids);
  backend_->forget_caches();
  reset_caches();
  for (int l = 0; l < cfg_.n_layers; ++l) {
    if (!observer) {
      seq_.caches_[l].append_many(c.k[l].data(), c.v[l].data(), c.n_tokens, c.positions.data());
      continue;
    }
    PrefillView view;
    view.layer = l;
    view.n_tokens = c.n_tokens;
    view.n_heads = cfg_.n_heads;
    view.n_kv_heads = cfg_.n_kv_heads;
    view.head_dim = cfg_.head_dim;
    view.positions = c.positions.data();
    view.k = c.k[l].data();
    view.v = c.v[l].data();
    view.k_pre_rope = want.k_pre_rope ? c.k_pre_rope[l].data() : nullptr;
    view.attn_colsum = want.attn_colsum ? c.attn_colsum[l].data() : nullptr;
    view.window = c.window;
    view.q_window = c.window > 0 ? c.q_window[l].data() : nullptr;
    view.kv_dtype = opt_.kv_dtype;
    observer->on_layer(view, seq_.caches_[l]);
    // Whatever the observer built follows the run's dtype (a MethodRunner has stored it already).
    seq_.caches_[l].store_as(opt_.kv_dtype);
  }
  seq_.pos_ = c.n_tokens;
  seq_.observer_ = observer && observer->acts_on_decode() ? observer : nullptr;
  return c.logits;
}

std::vector<float> Engine::decode(int32_t token) {
  Sequence* const seq[1] = {&seq_};
  return std::move(decode_batch(seq, {&token, 1})[0]);
}

Sequence Engine::detach() {
  Sequence s = std::move(seq_);
  seq_ = Sequence{};
  reset_caches();
  backend_->forget_caches();
  return s;
}

std::vector<std::vector<float>> Engine::decode_batch(std::span<Sequence* const> seqs, std::span<const int32_t> tokens) {
  const size_t n = seqs.size();
  const int B = static_cast<int>(n);
  if (B == 0 || tokens.size() != seqs.size())
    fail("decode_batch: {} sequences and {} tokens; one token per sequence is needed", seqs.size(), tokens.size());
  if (B > 1 && !backend_->decodes_batches())
    fail("the {} backend decodes one sequence at a time, not a batch of {}", backend_->name(), B);
  std::vector<int32_t> pos(n);
  std::vector<KvTransform*> transforms(n);
  std::vector<LinearTransform*> linears(n);
  for (int s = 0; s < B; ++s) {
    const Sequence& sq = *seqs[size_t(s)];
    if (std::find(seqs.begin(), seqs.begin() + s, seqs[size_t(s)]) != seqs.begin() + s)
      fail("decode_batch: sequence {} is in the batch twice", s);
    if (sq.pos_ == 0) fail("decode: no sequence; call prefill first");
    if (cfg_.sliding_window > 0 && sq.pos_ >= cfg_.sliding_window)
      fail(
          "decode: position {} is past the model's sliding attention window ({} tokens), which kvbench does not "
          "implement",
          sq.pos_, cfg_.sliding_window);
    if (tokens[size_t(s)] < 0 || tokens[size_t(s)] >= cfg_.vocab_size)
      fail("decode: token id {} outside the vocabulary", tokens[size_t(s)]);
    pos[size_t(s)] = sq.pos_;
    transforms[size_t(s)] = sq.transform_;
    linears[size_t(s)] = sq.linear_;
  }
  use_linear_transforms(linears);
  Backend& b = *backend_;
  const int H = cfg_.hidden, d = cfg_.head_dim;
  const int hq = cfg_.n_heads, hkv = cfg_.n_kv_heads, Q = hq * d, KV = hkv * d;
  DecodeBuffers& w = decode_buffers(B);
  Buffer &x = w.x, &h = w.h, &q = w.q, &k = w.k, &v = w.v, &attn = w.attn, &proj = w.proj, &mlp_out = w.mlp_out,
         &gate = w.gate, &up = w.up, &act = w.act;
  std::vector<float>&hk = w.hk, &hv = w.hv;
  b.embed(tok_embd_, tokens, H, x);
  // One sequence without a method acting on decoding lets the host caches lag one step: the backend
  // appends to its own copy and the host copies arrive with the step's last download.
  const bool defer = B == 1 && seqs[0]->observer_ == nullptr && seqs[0]->transform_ == nullptr;
  const bool observed = std::any_of(seqs.begin(), seqs.end(), [](const Sequence* sq) { return sq->observer_; });
  constexpr int kDecodeSlot = 2;
  float* staged = defer ? b.stage(kDecodeSlot, size_t(cfg_.n_layers) * 2 * KV) : nullptr;
  std::vector<bool> deferred(cfg_.n_layers, false);
  std::vector<float> hq_rows(observed ? n * Q : 0);
  std::vector<const LayerCache*> layer_caches(n);
  for (int l = 0; l < cfg_.n_layers; ++l) {
    Layer& L = layers_[l];
    norm(L.attn_norm, x, B, h);
    project_qkv(l, h, B, q, k, v, true);
    transform(l, k, v, pos, transforms, false);
    b.rope(q, B, hq, d, pos);
    b.rope(k, B, hkv, d, pos);
    transform(l, k, v, pos, transforms, true);
    if (defer && b.append_on_device(seqs[0]->caches_[l], k, v, hkv)) {
      deferred[l] = true;
      b.download_async(k, {staged + size_t(2 * l) * KV, size_t(KV)});
      b.download_async(v, {staged + size_t(2 * l + 1) * KV, size_t(KV)});
    } else {
      b.download(k, hk);
      b.download(v, hv);
      for (size_t s = 0; s < n; ++s) append_token(seqs[s]->caches_[l], hk.data() + s * KV, hv.data() + s * KV, pos[s]);
    }
    for (size_t s = 0; s < n; ++s) layer_caches[s] = &seqs[s]->caches_[l];
    b.attention_decode_batch(layer_caches, q, attn);
    if (observed) {
      b.download(q, hq_rows);
      for (size_t s = 0; s < n; ++s)
        if (PrefillObserver* o = seqs[s]->observer_)
          o->on_decode(l, seqs[s]->caches_[l], hq_rows.data() + s * Q, pos[s]);
    }
    change_inputs(l, MatrixInput::AttentionOutput, attn, B, Q);
    linear(attn, matrices(l).wo, nullptr, B, Q, H, proj, true);
    if (!cfg_.parallel_block) b.add(x, proj, n * H);
    norm(mlp_norm(L), x, B, h);
    mlp(l, h, B, gate, up, act, mlp_out, true);
    b.add(x, mlp_out, n * H);
    if (cfg_.parallel_block) b.add(x, proj, n * H);
  }
  for (Sequence* sq : seqs) ++sq->pos_;
  auto logits = logits_of_rows(x, B, w.head_h, w.logits);
  if (defer) {
    b.fence(kDecodeSlot);
    b.wait(kDecodeSlot);
    for (int l = 0; l < cfg_.n_layers; ++l)
      if (deferred[l])
        append_token(seqs[0]->caches_[l], staged + size_t(2 * l) * KV, staged + size_t(2 * l + 1) * KV, pos[0]);
  }
  return logits;
}

Engine::DecodeBuffers& Engine::decode_buffers(int batch) {
  if (decode_.batch == batch) return decode_;
  Backend& b = *backend_;
  const size_t n = size_t(batch), H = size_t(cfg_.hidden), F = size_t(cfg_.intermediate),
               Q = size_t(cfg_.n_heads) * cfg_.head_dim, KV = size_t(cfg_.n_kv_heads) * cfg_.head_dim,
               V = size_t(cfg_.vocab_size);
  decode_ = {};  // the old batch's buffers released before the new ones are made
  decode_.batch = batch;
  for (auto [buffer, width] : {std::pair{&decode_.x, H},
                               {&decode_.h, H},
                               {&decode_.q, Q},
                               {&decode_.k, KV},
                               {&decode_.v, KV},
                               {&decode_.attn, Q},
                               {&decode_.proj, H},
                               {&decode_.mlp_out, H},
                               {&decode_.gate, F},
                               {&decode_.up, F},
                               {&decode_.act, F},
                               {&decode_.head_h, H},
                               {&decode_.logits, V}})
    *buffer = Buffer(b, n * width);
  decode_.hk.assign(n * KV, 0.0f);
  decode_.hv.assign(n * KV, 0.0f);
  return decode_;
}

void Engine::append_token(LayerCache& cache, const float* k, const float* v, int32_t pos) {
  const int hkv = cfg_.n_kv_heads, d = cfg_.head_dim;
  if (cache.n_cache_heads() == hkv) {
    cache.append(k, v, pos);
    return;
  }
  // A cache with one head per query head stores the KV head once for each query head reading it.
  const int rep = cache.n_cache_heads() / hkv;
  rep_k_.resize(size_t(cache.n_cache_heads()) * d);
  rep_v_.resize(rep_k_.size());
  for (int c = 0; c < cache.n_cache_heads(); ++c) {
    std::copy_n(k + size_t(c / rep) * d, d, rep_k_.data() + size_t(c) * d);
    std::copy_n(v + size_t(c / rep) * d, d, rep_v_.data() + size_t(c) * d);
  }
  cache.append(rep_k_.data(), rep_v_.data(), pos);
}

}  // namespace kvb
