// DynaKV (README.md §1-§11): learned token-adaptive channel truncation of K and V. The learned maps
// (maps.*) change the model: every layer's pre-RoPE keys and values of all KV heads
// are rotated into a basis, a gate picks each token's width, and only the leading coordinates are
// cached. This file holds the method and its offline steps:
//   kvbench calibrate dynakv-pca MODEL [--text FILES]   the PCA basis (uncentred second moment, fp64)
//   kvbench train dynakv MODEL --alpha A [--mode e2e|ll] [--steps N]   the maps, from that basis
// The default text is the Python documentation's prose set-up fetches (data/python-docs); every
// tenth document is held out for validation and never trained or calibrated on.
//
// Inference (method `dynakv`): the method's transform runs inside the engine for every layer, in
// prefill and at each decode step: gate, hard width k = #{m > tau} per token, and the token's own K/V
// replaced by their reconstruction x~[0:k] U^-1[0:k] (README.md §2: the prompt is never attended
// uncompressed). The cache keeps per token the k_K and k_V leading coordinates (ragged, at the run's
// dtype) and two uint16 widths, all charged; keys are reconstructed and rotated by RoPE at attention
// time, values go through the factored path (sum_t p_t pad(x~_t)) U^-1[:, head block]. With
// fixed_rate = r every token keeps round(r d) coordinates of the PCA basis instead (the Palu-like
// fixed-rank baseline at an equal retain rate; no gate).
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <mutex>

#include "harness/engine/engine.hpp"
#include "harness/engine/rope_freqs.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/linalg.hpp"
#include "harness/util/progress.hpp"
#include "kernels/cpu/hadamard.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "methods/dynakv/maps.hpp"
#include "methods/dynakv/train_hook.hpp"

namespace kvb {
namespace {

constexpr const char* kPaperText = "the paper uses RedPajama-V2 and reports rates on WikiText-2";

// Accumulates X^T X of every layer's pre-RoPE K and V rows (all KV heads jointly) in double.
class MomentTap final : public PrefillObserver {
 public:
  MomentTap(int layers, int d) : d_(d), moments_(size_t(layers)) {
    for (auto& m : moments_)
      for (auto& z : m) z.assign(size_t(d) * d, 0.0);
  }
  PrefillNeeds needs() const override { return {.k_pre_rope = true}; }
  void on_layer(const PrefillView& v, LayerCache&) override {
    const size_t n = size_t(v.n_tokens);
    for (int z = 0; z < 2; ++z) {
      const float* x = z == 0 ? v.k_pre_rope : v.v;
      buf_.assign(x, x + n * d_);
      cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, d_, static_cast<int>(n), 1.0, buf_.data(), d_, 1.0,
                  moments_[size_t(v.layer)][size_t(z)].data(), d_);
    }
    tokens_ += v.layer == 0 ? n : 0;
  }
  // The eigenvectors of each layer's moment by descending eigenvalue. With groups > 1 the KV heads
  // split into that many consecutive groups (Palu's G-LRD) and each group's diagonal block of the
  // moment is solved apart; the basis interleaves the groups (column j: group j mod groups, its
  // (j / groups)-th eigenvector, zero outside the group's rows), so that keeping the leading g k
  // coordinates keeps each group's top k, and the eigenvalues follow the same order.
  DynaKvPca solve(int groups = 1) const {
    DynaKvPca pca;
    pca.d = d_;
    const int gd = d_ / groups;
    for (const auto& m : moments_) {
      auto& basis = pca.basis.emplace_back();
      auto& vals = pca.eigenvalues.emplace_back();
      for (int z = 0; z < 2; ++z) {
        basis[size_t(z)].assign(size_t(d_) * d_, 0.0f);
        vals[size_t(z)].assign(size_t(d_), 0.0);
        for (int g = 0; g < groups; ++g) {
          std::vector<double> a(size_t(gd) * gd), gv, vecs;
          for (int i = 0; i < gd; ++i)
            for (int j = 0; j < gd; ++j)
              a[size_t(i) * gd + j] = m[size_t(z)][size_t(g * gd + i) * d_ + g * gd + j] / double(tokens_);
          symmetric_eigen(std::move(a), gd, gv, vecs);
          for (int c = 0; c < gd; ++c) {
            const int col = c * groups + g;
            vals[size_t(z)][size_t(col)] = gv[size_t(c)];
            for (int i = 0; i < gd; ++i)
              basis[size_t(z)][size_t(g * gd + i) * d_ + col] = static_cast<float>(vecs[size_t(i) * gd + c]);
          }
        }
      }
    }
    return pca;
  }
  size_t tokens() const { return tokens_; }

 private:
  int d_;
  std::vector<std::array<std::vector<double>, 2>> moments_;
  std::vector<double> buf_;
  size_t tokens_ = 0;
};

// The basis's groups of KV heads (its calibration's group_size; 1 for a basis of all heads jointly).
int basis_groups(const LoadedArtifact& a, const ModelConfig& m) {
  const auto& h = a.body.value("header", nlohmann::json::object());
  const int g = h.value("calibration", nlohmann::json::object()).value("group_size", m.n_kv_heads);
  if (g < 1 || m.n_kv_heads % g != 0)
    fail("{}: header.calibration.group_size {} does not divide the model's {} KV heads", a.path, g, m.n_kv_heads);
  return m.n_kv_heads / g;
}

// A basis fitted per group of heads (Palu's G-LRD, -o group_size) is block-diagonal with its columns
// interleaved: DynaKV's gates and its fixed_rate assume one basis by descending eigenvalue.
void refuse_grouped(const LoadedArtifact& a, const ModelConfig& m, const std::string& what) {
  if (const int groups = basis_groups(a, m); groups != 1)
    fail(
        "{}: a basis fitted per group of {} KV heads (group_size) serves palu's fixed_ranks only, not {}; "
        "calibrate without group_size",
        a.path, m.n_kv_heads / groups, what);
}

void calibrate_pca(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const std::string command = ctx.command.empty() ? "kvbench calibrate dynakv-pca" : ctx.command;
  const FitSequences fit = fit_sequences(ctx, command, kPaperText);
  const auto& seqs = fit.seqs;
  size_t total = 0;
  for (const auto& s : seqs) total += s.size();
  const int d = cfg.n_kv_heads * cfg.head_dim;
  const int group_size = heads_per_group(ctx.options, cfg.n_kv_heads, command);
  const int groups = cfg.n_kv_heads / group_size;
  MomentTap tap(cfg.n_layers, d);
  Progress bar(command.substr(command.rfind(' ') + 1) + " pca", total, "tok");
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : seqs) {
    ctx.engine.prefill(s, &tap);
    bar.advance(s.size());
  }
  bar.finish();
  const DynaKvPca pca = tap.solve(groups);
  const std::string out = ctx.out.empty() ? default_artifact_path(kDynaKvPcaKind, cfg) : ctx.out;
  nlohmann::json body = dynakv_pca_json(pca);
  body["header"] = artifact_header(kDynaKvPcaKind, cfg, ctx.model.path());
  body["header"]["calibration"] = {
      {"text", fit.described},
      {"tokens", tap.tokens()},
      {"sequences", seqs.size()},
      {"seq_len", fit.seq_len},
      {"moment", groups == 1 ? "uncentred E[x x^T] of pre-RoPE K and of V, all KV heads jointly, fp64"
                             : "uncentred E[x x^T] of pre-RoPE K and of V per group of heads, fp64; basis columns "
                               "interleave the groups"},
      {"group_size", group_size},
      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
  write_artifact(out, body);
  fmt::print("wrote {} ({} tokens, d = {})\n", out, tap.tokens(), d);
}

void train(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const Params& o = ctx.options;
  DynaKvTrainOptions t;
  t.mode = o.get("mode");
  t.alpha = o.get_float("alpha");
  t.steps = o.integer("steps");
  t.batch = o.integer("batch");
  t.seq_len = o.integer("seq_len");
  t.lr = o.get_float("lr");
  t.lr_basis = o.get_float("lr_basis");
  t.weight_decay = o.get_float("weight_decay");
  t.clip = o.get_float("clip");
  const std::string basis = o.get("train_basis");
  t.train_basis = basis == "auto" ? t.mode == "e2e" : basis == "true";
  t.init_rate = o.get_float("init_rate");
  t.tau = o.get_float("tau");
  t.checkpoint_every = o.integer("checkpoint_every");
  t.progress = ctx.progress;

  const LoadedArtifact pa = load_artifact(kDynaKvPcaKind, o.get("pca"), cfg, "kvbench calibrate dynakv-pca MODEL");
  refuse_grouped(pa, cfg, "DynaKV's training");
  DynaKvWeights weights = dynakv_init(dynakv_pca_from(pa, cfg), t.init_rate, t.tau);
  const CalibrationText docs = calibration_text(o.get("text"), ctx.data_dir, "kvbench train dynakv", kPaperText);
  const auto fit = token_sequences(ctx.tokenizer, docs.split.fit, t.seq_len, size_t(t.steps) * t.batch * t.seq_len,
                                   "kvbench train dynakv: steps x batch x seq_len (batches reuse sequences)");
  const auto held = token_sequences(ctx.tokenizer, docs.split.held, t.seq_len,
                                    static_cast<size_t>(o.get_int("held_tokens")), "kvbench train dynakv: held_tokens");
  if (held.empty()) fail("kvbench train dynakv: the held-out documents give no sequence of {} tokens", t.seq_len);

  const std::string out = !ctx.out.empty() ? ctx.out
                                           : (std::filesystem::path(artifacts_dir()) / kDynaKvKind /
                                              fmt::format("{}.{}-a{:g}.json", cfg.fingerprint, t.mode, t.alpha))
                                                 .string();
  ModelGradients mg(ctx.model);
  DynaKvWeights pca_basis = weights;  // the starting point: the fixed-rank baseline's basis
  nlohmann::json training = train_dynakv(mg, weights, t, fit, held, out + ".ckpt");
  // The fixed-rank baseline at the retain rate just measured: every token keeps the same number of
  // leading PCA coordinates (method dynakv with fixed_rate), on the same held-out text.
  const double rate = training["validation"]["hard_rate"].get<double>();
  const int width = std::clamp(static_cast<int>(std::lround(rate * weights.d)), 1, weights.d);
  const DynaKvValidation fixed = dynakv_validate(mg, pca_basis, DynaKvPath::Fixed, width, held, false, ctx.progress);
  training["fixed_rank_baseline"] = {
      {"width", width}, {"rate", double(width) / weights.d}, {"ce", fixed.ce_hard}, {"ppl", std::exp(fixed.ce_hard)}};
  training["text"] = docs.described;
  training["pca"] = {{"file", pa.path}, {"digest", pa.digest}};
  nlohmann::json body = dynakv_weights_json(weights);
  body["header"] = artifact_header(kDynaKvKind, cfg, ctx.model.path());
  body["header"]["training"] = training;
  write_artifact(out, body);
  const auto& v = training["validation"];
  fmt::print(
      "wrote {}\n  held-out ({} tokens): hard retain rate {:.4f}, soft {:.4f}; perplexity {:.3f} (full cache "
      "{:.3f}, fixed-rank PCA at {}/{} coordinates {:.3f}); {} training tokens in {:.0f} s\n",
      out, v["tokens"].get<size_t>(), v["hard_rate"].get<double>(), v["soft_rate"].get<double>(),
      v["ppl_hard"].get<double>(), v["ppl_full"].get<double>(), width, weights.d, std::exp(fixed.ce_hard),
      training["train_tokens"].get<size_t>(), training["seconds"].get<double>());
}

std::vector<ParamSpec> pca_options() {
  auto p = calibration_text_options();
  p.push_back(ParamSpec::integer("tokens", 262144, 1, 1L << 40, "calibration tokens (the spec recommends >= 1M)"));
  p.push_back(id_sequences_option());
  p.push_back(group_size_option());
  return p;
}

std::vector<ParamSpec> train_options() {
  auto p = calibration_text_options();
  p.push_back(ParamSpec::choice("mode", "e2e", {"e2e", "ll"},
                                "e2e: CE + alpha R^2 through the model (the paper); ll: layer-local distortion + alpha "
                                "R_l (DynaKV-LL)"));
  p.push_back(ParamSpec::real("alpha", 1.0, 0.0, 1e6, "rate penalty (ll: price per layer)"));
  p.push_back(ParamSpec::integer("steps", 100, 1, 1L << 30, "optimizer steps"));
  p.push_back(ParamSpec::integer("batch", 4, 1, 4096, "sequences per step"));
  p.push_back(ParamSpec::real("lr", 1e-2, 0.0, 10.0, "AdamW learning rate of the gates (W, b)"));
  p.push_back(ParamSpec::real("lr_basis", 1e-4, 0.0, 10.0, "AdamW learning rate of the bases U"));
  p.push_back(ParamSpec::real("weight_decay", 0.0, 0.0, 10.0, "AdamW decoupled weight decay of W and U"));
  p.push_back(ParamSpec::real("clip", 1.0, 0.0, 1e9, "global gradient-norm clip"));
  p.push_back(ParamSpec::choice("train_basis", "auto", {"auto", "true", "false"},
                                "train U (auto: in e2e, not in ll, which keeps the PCA basis)"));
  p.push_back(ParamSpec::real("init_rate", 0.9, 0.0, 1.0, "initial soft retain rate (gate bias ramp, W = 0)"));
  p.push_back(ParamSpec::real("tau", 0.1, -1.0, 1.0, "inference threshold stored with the weights"));
  p.push_back(ParamSpec::integer("checkpoint_every", 10, 1, 1L << 30, "steps between checkpoints (OUT.ckpt)"));
  p.push_back(ParamSpec::integer("held_tokens", 16384, 1, 1L << 40, "held-out tokens of the validation pass"));
  p.push_back(ParamSpec::text("pca", "", "PCA artifact (default: this model's from kvbench calibrate dynakv-pca)"));
  return p;
}

// ---------------------------------------------------------------------------------------------------
// Inference

// One layer's cache in DynaKV's form, shared by the segments of its KV heads (the latent mixes them).
struct LatentStore {
  const DynaKvMap* key_map = nullptr;
  const DynaKvMap* value_map = nullptr;
  std::shared_ptr<const RopeTable> rope;
  std::vector<float> k, v;  // packed: token t's k_K (k_V) leading coordinates after token t-1's
  std::vector<uint16_t> k_width, v_width;
  std::vector<int32_t> pos;
  KvDtype dtype = KvDtype::F32;
  int head_dim = 0;
  // A decode step's token, from the transform, until the layer's segments take it (append_token).
  std::vector<float> next_k, next_v;
  int32_t next_pos = -1;

  void add(const float* lk, int wk, const float* lv, int wv, int32_t p) {
    k.insert(k.end(), lk, lk + wk);
    v.insert(v.end(), lv, lv + wv);
    for (auto it = k.end() - wk; it != k.end(); ++it) *it = kv_round(dtype, *it);
    for (auto it = v.end() - wv; it != v.end(); ++it) *it = kv_round(dtype, *it);
    k_width.push_back(static_cast<uint16_t>(wk));
    v_width.push_back(static_cast<uint16_t>(wv));
    pos.push_back(p);
  }
  size_t quant_bits = 0;  // a token's stored bits, K and V, where the latent is quantized (README.md §4b)

  size_t bytes() const {
    const size_t latent =
        quant_bits ? (pos.size() * quant_bits + 7) / 8 : (k.size() + v.size()) * kv_dtype_bytes(dtype);
    return latent + 2 * sizeof(uint16_t) * pos.size();
  }
  // The tokens at the given indices (ascending), in a new store with the same maps.
  std::shared_ptr<LatentStore> subset(const std::vector<size_t>& keep) const {
    auto out = std::make_shared<LatentStore>();
    out->key_map = key_map;
    out->value_map = value_map;
    out->rope = rope;
    out->dtype = dtype;
    out->head_dim = head_dim;
    out->quant_bits = quant_bits;
    std::vector<size_t> k_off(pos.size() + 1, 0), v_off(pos.size() + 1, 0);
    for (size_t t = 0; t < pos.size(); ++t) {
      k_off[t + 1] = k_off[t] + k_width[t];
      v_off[t + 1] = v_off[t] + v_width[t];
    }
    for (size_t t : keep) out->add(k.data() + k_off[t], k_width[t], v.data() + v_off[t], v_width[t], pos[t]);
    return out;
  }
  void store_as(KvDtype t) {
    if (t == dtype) return;
    dtype = t;
    for (float& x : k) x = kv_round(t, x);
    for (float& x : v) x = kv_round(t, x);
    std::lock_guard lock(keys_mu);
    keys_built = kNone;
  }

  // Every head's keys, reconstructed from the latent and rotated, rebuilt in full whenever the store
  // has grown, so every step pays the reconstruction as DynaKV's attention does; scratch reused
  // between steps, not cache, and not charged. Row i is token key_order[i]'s [n_kv_heads x head_dim]:
  // tokens go in order of width, so that the GEMM tiles of dynakv_expand_rows are hardly padded. The
  // engine's append_token builds them outside the parallel attention, over all threads; a segment
  // read first (as in the tests) builds them on its own thread.
  const float* rebuilt_keys() const {
    std::lock_guard lock(keys_mu);
    const size_t n = pos.size();
    if (keys_built == n) return keys.data();
    const int d = key_map->d;
    std::vector<size_t> off(n + 1, 0), count(size_t(d) + 2, 0);
    for (size_t t = 0; t < n; ++t) {
      off[t + 1] = off[t] + k_width[t];
      ++count[size_t(k_width[t]) + 1];
    }
    for (size_t w = 1; w < count.size(); ++w) count[w] += count[w - 1];  // first row of each width
    key_order.resize(n);
    for (size_t t = 0; t < n; ++t) key_order[count[k_width[t]]++] = static_cast<uint32_t>(t);
    std::vector<const float*> rows(n);
    std::vector<int> widths(n);
    std::vector<int32_t> order_pos(n);
    for (size_t i = 0; i < n; ++i) {
      const size_t t = key_order[i];
      rows[i] = k.data() + off[t];
      widths[i] = k_width[t];
      order_pos[i] = pos[t];
    }
    keys.resize(n * size_t(d));
    // Tile by tile over the threads, each rotated while it is in cache.
    const auto tiles = static_cast<int64_t>((n + kDynaKvExpandTile - 1) / kDynaKvExpandTile);
#pragma omp parallel for schedule(dynamic, 4) if (tiles > 1)
    for (int64_t tile = 0; tile < tiles; ++tile) {
      const size_t t0 = size_t(tile) * kDynaKvExpandTile, m = std::min(kDynaKvExpandTile, n - t0);
      float* out = keys.data() + t0 * d;
      dynakv_expand_rows(*key_map, std::span(rows).subspan(t0, m), std::span(widths).subspan(t0, m), 0, d, out);
      rope->apply(out, static_cast<int>(m), d / head_dim, head_dim, order_pos.data() + t0);
    }
    keys_built = n;
    return keys.data();
  }
  static constexpr size_t kNone = ~size_t(0);
  mutable std::mutex keys_mu;
  mutable std::vector<float> keys;
  mutable std::vector<uint32_t> key_order;
  mutable size_t keys_built = kNone;
};

// The view of one KV head onto its layer's LatentStore; the store is charged once, by head 0.
class LatentSegment final : public Segment {
 public:
  LatentSegment(std::shared_ptr<LatentStore> store, int head, int head_dim)
      : s_(std::move(store)), head_(head), d_(head_dim) {}
  std::string format() const override { return "dynakv-latent"; }
  size_t size() const override { return s_->pos.size(); }
  std::span<const int32_t> positions() const override { return s_->pos; }
  size_t bytes() const override { return head_ == 0 ? s_->bytes() : 0; }
  void logits(const float* q, float* scores) const override {
    const float* keys = s_->rebuilt_keys();
    const size_t n = size();
    thread_local std::vector<float> by_width;
    by_width.resize(n);
    cblas_sgemv(CblasRowMajor, CblasNoTrans, static_cast<int>(n), d_, 1.0f, keys + size_t(head_) * d_, s_->key_map->d,
                q, 1, 0.0f, by_width.data(), 1);
    for (size_t i = 0; i < n; ++i) scores[s_->key_order[i]] = by_width[i];
  }
  void accumulate(const float* p, float* acc) const override { accumulate_group(p, 1, d_, acc); }
  // Values through the factored path, each latent row read once for the group's query heads:
  // pooled_j = sum_t p_jt x~_t (each token's kept coordinates), then acc_j += pooled_j U^-1[:, head].
  void accumulate_group(const float* p, int g, int, float* acc) const override {
    const int dkv = s_->value_map->d;
    const size_t n = size();
    std::vector<float> pooled(size_t(g) * dkv, 0.0f), out(static_cast<size_t>(d_));
    ragged_rows_axpy(s_->v.data(), s_->v_width.data(), n, p, g, pooled.data(), dkv);
    for (int j = 0; j < g; ++j) {
      dynakv_expand(*s_->value_map, pooled.data() + size_t(j) * dkv, dkv, head_ * d_, d_, out.data());
      for (int c = 0; c < d_; ++c) acc[size_t(j) * d_ + c] += out[size_t(c)];
    }
  }
  void store_as(KvDtype t) override { s_->store_as(t); }
  // The engine appends a decoded token head by head; the first head commits the transform's latent
  // and rebuilds the keys for the step.
  bool append_token(const float*, const float*, int32_t p) override {
    if (s_->next_pos != p) return !s_->pos.empty() && s_->pos.back() == p;
    s_->add(s_->next_k.data(), static_cast<int>(s_->next_k.size()), s_->next_v.data(),
            static_cast<int>(s_->next_v.size()), p);
    s_->next_pos = -1;
    s_->rebuilt_keys();
    return true;
  }

 private:
  std::shared_ptr<LatentStore> s_;
  int head_, d_;
};

// fixed_ranks: one entry per layer and K/V separated by '/' (a comma would end the value in `bench
// --method NAME:k=v,...`), each a width or, on a grouped basis, the groups' ranks joined by '+'.
std::vector<std::vector<long>> parse_ranks(const std::string& text) {
  std::vector<std::vector<long>> out(1);
  const char* p = text.data();
  const char* end = p + text.size();
  while (true) {
    long v = 0;
    const auto [next, ec] = std::from_chars(p, end, v);
    if (ec != std::errc() || (next != end && *next != '/' && *next != '+'))
      fail(
          "method dynakv: fixed_ranks '{}': expected integers separated by '/' (k0/v0/k1/v1/...), a grouped "
          "basis's groups joined by '+'",
          text);
    out.back().push_back(v);
    if (next == end) return out;
    if (*next == '/') out.emplace_back();
    p = next + 1;
  }
}

// On an interleaved grouped basis (column j: group j mod G, its (j div G)-th vector), group g keeping
// ranks[g]: those columns first, each set in its order, so that a width of their sum keeps exactly them.
// Returns the group of each column after the move.
std::vector<int> keep_group_columns(std::vector<float>& basis, std::vector<double>& eigenvalues, int d,
                                    const std::vector<long>& ranks) {
  const int G = static_cast<int>(ranks.size());
  std::vector<int> order, group;
  for (int pass = 0; pass < 2; ++pass)
    for (int j = 0; j < d; ++j)
      if ((j / G < ranks[size_t(j % G)]) == (pass == 0)) order.push_back(j);
  const std::vector<float> b = basis;
  const std::vector<double> e = eigenvalues;
  for (int c = 0; c < d; ++c) {
    eigenvalues[size_t(c)] = e[size_t(order[size_t(c)])];
    for (int i = 0; i < d; ++i) basis[size_t(i) * d + c] = b[size_t(i) * d + order[size_t(c)]];
    group.push_back(order[size_t(c)] % G);
  }
  return group;
}

// Palu's latent quantization on the fixed-rank path (README.md §4b), one head group of one layer's K or
// V: the group's kept columns and, per column, sqrt of its singular value over the calibration
// (s = sqrt(eigenvalue x tokens)): Palu's factors scale its latent coordinate c by 1 / that.
struct LatentGroupPlan {
  std::vector<int> cols;
  std::vector<double> root_s;
};

// Each column of the basis turned so that its entry of largest magnitude (the first of equal ones) is
// positive: the SVD leaves the signs open, and quantizing a rotated latent depends on them.
void orient_columns(std::vector<float>& basis, int d) {
  for (int c = 0; c < d; ++c) {
    int top = 0;
    for (int i = 1; i < d; ++i)
      if (std::abs(basis[size_t(i) * d + c]) > std::abs(basis[size_t(top) * d + c])) top = i;
    if (basis[size_t(top) * d + c] < 0)
      for (int i = 0; i < d; ++i) basis[size_t(i) * d + c] = -basis[size_t(i) * d + c];
  }
}

class DynaKV final : public Method, public KvTransform {
 public:
  explicit DynaKV(bool snap) : snap_(snap) {}
  void setup() override {
    const ModelConfig& m = model();
    d_ = m.n_kv_heads * m.head_dim;
    tau_ = params().get_float("tau");
    const double rate = params().get_float("fixed_rate");
    const std::string ranks = params().get("fixed_ranks");
    if (!snap_) quant_ = latent_quant_of(params());
    if (quant_.on() && rate <= 0 && ranks.empty())
      fail("method dynakv: latent_bits quantizes the fixed-rank latent (Palu's); give fixed_rate or fixed_ranks");
    if (rate > 0 || !ranks.empty()) {
      const LoadedArtifact a =
          load_artifact(kDynaKvPcaKind, params().get("pca"), m, "kvbench calibrate dynakv-pca MODEL");
      if (ranks.empty()) refuse_grouped(a, m, "fixed_rate");
      DynaKvPca pca = dynakv_pca_from(a, m);
      const int uniform = std::clamp(static_cast<int>(std::lround(rate * d_)), 1, d_);
      fixed_.assign(size_t(m.n_layers), {uniform, uniform});
      std::vector<std::array<std::vector<int>, 2>> column_group(size_t(m.n_layers));
      for (auto& kinds : column_group)
        for (auto& g : kinds) g.assign(size_t(d_), 0);
      if (!ranks.empty()) {
        if (rate > 0) fail("method dynakv: give fixed_rate or fixed_ranks, not both");
        const auto r = parse_ranks(ranks);
        if (r.size() != 2 * size_t(m.n_layers))
          fail("method dynakv: fixed_ranks holds {} entries; expected 2 per layer (K, V) for {} layers: {}", r.size(),
               m.n_layers, 2 * m.n_layers);
        const int groups = basis_groups(a, m), gd = d_ / groups;
        for (size_t i = 0; i < r.size(); ++i) {
          if (const int n = static_cast<int>(r[i].size()); n != groups)
            fail(
                "method dynakv: fixed_ranks[{}] gives {} group ranks; the basis {} was fitted on groups of {} KV heads "
                "(one rank per group){}",
                i, n, a.path, m.n_kv_heads / groups,
                m.n_kv_heads % n == 0 ? fmt::format("; {} group ranks need a basis calibrated with -o group_size={}", n,
                                                    n == 1 ? 0 : m.n_kv_heads / n)
                                      : "");
          long width = 0;
          for (long x : r[i]) {
            if (x < 1 || x > gd)
              fail("method dynakv: fixed_ranks[{}] = {} outside 1..{} (the {} K/V dimensions)", i, x, gd,
                   groups > 1 ? "group's" : "layer's");
            width += x;
          }
          if (groups > 1)
            column_group[i / 2][i % 2] =
                keep_group_columns(pca.basis[i / 2][i % 2], pca.eigenvalues[i / 2][i % 2], d_, r[i]);
          fixed_[i / 2][i % 2] = static_cast<int>(width);
        }
      }
      if (quant_.on()) plan_quantization(a, pca, column_group);
      weights_ = dynakv_init(pca, 0.5, tau_);
      artifacts_ = {{"pca", {{"file", a.path}, {"digest", a.digest}}}};
    } else {
      if (params().get("weights").empty())
        fail(
            "method dynakv: give weights=FILE (made by kvbench train dynakv MODEL --alpha A) or fixed_rate=R (the "
            "PCA truncation baseline)");
      const LoadedArtifact a = load_artifact(kDynaKvKind, params().get("weights"), m, "kvbench train dynakv MODEL");
      weights_ = dynakv_weights_from(a, m);
      artifacts_ = {{"weights", {{"file", a.path}, {"digest", a.digest}}}};
    }
    rope_ = std::make_shared<RopeTable>(
        rope_inv_freq(m), m.rope_layout == RopeLayout::Interleaved ? RopeStyle::Interleaved : RopeStyle::NeoX);
    rope_->ensure(m.context_length);
    stores_.resize(size_t(m.n_layers));
  }
  KvTransform* kv_transform() override { return this; }
  bool keeps_sequence_state() const override { return true; }  // stores_: the sequence's latent cache
  nlohmann::json artifacts() const override { return artifacts_; }

  void apply(int layer, int n, const int32_t* pos, float* k, float* v) override {
    const auto& maps = weights_.layers[size_t(layer)];
    if (pos[0] == 0) {  // a new sequence: this layer's prompt goes to a fresh store
      auto s = std::make_shared<LatentStore>();
      s->key_map = &maps[0];
      s->value_map = &maps[1];
      s->rope = rope_;
      s->head_dim = model().head_dim;
      if (quant_.on()) s->quant_bits = quant_bits_[size_t(layer)];
      stores_[size_t(layer)] = s;
    }
    LatentStore& s = *stores_[size_t(layer)];
    std::array<std::vector<int>, 2> width;
    std::array<std::vector<float>, 2> xt;
    for (int z = 0; z < 2; ++z) {
      float* x = z == 0 ? k : v;
      const DynaKvMap& map = maps[size_t(z)];
      auto& w = width[size_t(z)];
      if (!fixed_.empty()) {
        xt[size_t(z)].resize(size_t(n) * d_);
        dynakv_rotate(map, x, n, xt[size_t(z)].data());
        w.assign(size_t(n), fixed_[size_t(layer)][size_t(z)]);
        if (quant_.on()) quantize_latent(plans_[size_t(layer)][size_t(z)], xt[size_t(z)].data(), n);
      } else {
        dynakv_gate(map, x, n, gate_);
        xt[size_t(z)] = std::move(gate_.xt);
        for (int t = 0; t < n; ++t) w.push_back(dynakv_width(gate_.m.data() + size_t(t) * d_, d_, tau_));
      }
      // What attention reads, this token included: the reconstruction of the kept coordinates.
      std::vector<const float*> rows(static_cast<size_t>(n));
      for (int t = 0; t < n; ++t) rows[size_t(t)] = xt[size_t(z)].data() + size_t(t) * d_;
      dynakv_expand_rows(map, rows, w, 0, d_, x);
    }
    if (pos[0] == 0) {
      for (int t = 0; t < n; ++t)
        s.add(xt[0].data() + size_t(t) * d_, width[0][size_t(t)], xt[1].data() + size_t(t) * d_, width[1][size_t(t)],
              pos[t]);
    } else {
      if (n != 1) fail("internal: dynakv transform of {} tokens after the prompt", n);
      rope_->ensure(pos[0]);  // decoding may go on past the context length, as transformers' does
      s.next_k.assign(xt[0].begin(), xt[0].begin() + width[0][0]);
      s.next_v.assign(xt[1].begin(), xt[1].begin() + width[1][0]);
      s.next_pos = pos[0];
    }
  }

  PrefillNeeds needs() const override { return {.window = snap_ ? params().integer("window") : 0}; }

  LayerCache compress(const PrefillView& view, const Budget& budget) override {
    auto s = stores_[size_t(view.layer)];
    if (!s || s->pos.size() != size_t(view.n_tokens))
      fail(
          "dynakv: layer {}'s keys and values did not pass through its transform; DynaKV changes the model and "
          "runs only inside the engine's own prefill",
          view.layer);
    if (snap_) s = s->subset(admit(view, *s, budget));
    stores_[size_t(view.layer)] = s;  // decoded tokens go where the cache reads
    LayerCache cache(view.n_heads, view.n_kv_heads, view.head_dim);
    for (int h = 0; h < view.n_kv_heads; ++h)
      cache.segments(h).push_back(std::make_unique<LatentSegment>(s, h, view.head_dim));
    // For the record: the hard retain rates of the tokens kept (K and V apart: the paper's gates differ
    // per kind, and a mean hides which one compresses), and how many were kept.
    double kept_k = 0, kept_v = 0;
    for (size_t t = 0; t < s->pos.size(); ++t) {
      kept_k += s->k_width[t];
      kept_v += s->v_width[t];
    }
    const double slots = s->pos.empty() ? 0.0 : d_ * double(s->pos.size());
    auto rate = [&](double kept) { return slots > 0 ? kept / slots : 0.0; };
    stats_ = {{"layer", view.layer},
              {"retain_rate", slots > 0 ? (kept_k + kept_v) / (2.0 * slots) : 0.0},
              {"k_retain_rate", rate(kept_k)},
              {"v_retain_rate", rate(kept_v)},
              {"tokens", s->pos.size()}};
    return cache;
  }
  nlohmann::json layer_stats() const override { return stats_; }

 private:
  // DynaKV + SnapKV (README.md §5, a budgeted extension not in the paper): every head's pooled window scores summed,
  // since the latent mixes the heads, then tokens admitted while the layer's bytes stay within
  // T x 2 d numbers: the window first (newest first), then the prefix by score. Returns the kept
  // indices, ascending.
  std::vector<size_t> admit(const PrefillView& view, const LatentStore& s, const Budget& budget) const {
    const int n = view.n_tokens, w = std::min(n, params().integer("window"));
    const size_t b = kv_dtype_bytes(view.kv_dtype);
    const size_t limit = size_t(budget.tokens) * 2 * d_ * b;
    auto cost = [&](size_t t) { return (size_t(s.k_width[t]) + s.v_width[t]) * b + 2 * sizeof(uint16_t); };
    std::vector<size_t> order;
    for (int t = n - 1; t >= n - w; --t) order.push_back(size_t(t));
    if (n > w) {
      const HeadScores heads = pooled_window_scores(view, params());
      std::vector<float> total(size_t(n - w), 0.0f);
      for (const auto& h : heads)
        for (size_t j = 0; j < total.size(); ++j) total[j] += h[j];
      for (size_t j = 0; j < total.size(); ++j) order.push_back(j);
      // Highest score first, ties to the lower position.
      std::stable_sort(order.begin() + w, order.end(), [&](size_t x, size_t y) { return total[x] > total[y]; });
    }
    std::vector<size_t> keep;
    size_t used = 0;
    for (size_t t : order)
      if (used + cost(t) <= limit) {
        used += cost(t);
        keep.push_back(t);
      }
    std::sort(keep.begin(), keep.end());
    return keep;
  }

  // Per layer, K and V, each head group's plan (README.md §4b); the basis's columns oriented first.
  void plan_quantization(const LoadedArtifact& a, DynaKvPca& pca,
                         const std::vector<std::array<std::vector<int>, 2>>& column_group) {
    const auto& cal = a.body.value("header", nlohmann::json::object()).value("calibration", nlohmann::json::object());
    const double tokens = cal.value("tokens", 1.0);
    const int groups = basis_groups(a, model());
    plans_.assign(fixed_.size(), {});
    quant_bits_.assign(fixed_.size(), 0);
    for (size_t l = 0; l < fixed_.size(); ++l)
      for (int z = 0; z < 2; ++z) {
        orient_columns(pca.basis[l][size_t(z)], d_);
        auto& plan = plans_[l][size_t(z)];
        plan.assign(size_t(groups), {});
        for (int c = 0; c < fixed_[l][size_t(z)]; ++c) {
          LatentGroupPlan& g = plan[size_t(column_group[l][size_t(z)][size_t(c)])];
          g.cols.push_back(c);
          const double e = pca.eigenvalues[l][size_t(z)][size_t(c)];
          g.root_s.push_back(e > 0 ? std::pow(e * tokens, 0.25) : 0.0);
        }
        for (const LatentGroupPlan& g : plan) {
          const int r = static_cast<int>(g.cols.size());
          if (quant_.group_size > 0 && r % quant_.group_size != 0)
            fail("method dynakv: latent_group_size {} does not divide layer {}'s {} rank {}", quant_.group_size, l,
                 z == 0 ? "K" : "V", r);
          const int K = hadamard_order(r);
          if (quant_.hadamard && K == 0)
            fail("method dynakv: latent_hadamard: no Hadamard matrix of order {} in Palu's code (layer {}'s {} rank)",
                 r, l, z == 0 ? "K" : "V");
          if (quant_.hadamard && !hadamard_buildable(K))
            fail(
                "method dynakv: latent_hadamard: Palu's code rotates a rank of {} (layer {}'s {}) by a stored order-{} "
                "matrix that kvbench does not build (kernels/cpu/hadamard.hpp)",
                r, l, z == 0 ? "K" : "V", K);
          quant_bits_[l] += quant_.stored_bits(r);
        }
      }
  }
  // Each token's kept coordinates, group by group: in Palu's scale, rotated, quantized and dequantized,
  // rotated back.
  void quantize_latent(const std::vector<LatentGroupPlan>& plan, float* xt, int n) const {
    std::vector<float> buf;
    for (int t = 0; t < n; ++t) {
      float* row = xt + size_t(t) * d_;
      for (const LatentGroupPlan& g : plan) {
        const int r = static_cast<int>(g.cols.size());
        buf.resize(size_t(r));
        for (int i = 0; i < r; ++i)
          buf[size_t(i)] =
              g.root_s[size_t(i)] > 0 ? static_cast<float>(row[g.cols[size_t(i)]] / g.root_s[size_t(i)]) : 0;
        if (quant_.hadamard) hadamard_rotate(buf.data(), r);
        fake_quantize(buf.data(), r, quant_);
        if (quant_.hadamard) hadamard_rotate(buf.data(), r, true);
        for (int i = 0; i < r; ++i) row[g.cols[size_t(i)]] = static_cast<float>(buf[size_t(i)] * g.root_s[size_t(i)]);
      }
    }
  }

  bool snap_;
  int d_ = 0;
  std::vector<std::array<int, 2>> fixed_;  // per layer, K and V: the fixed-rank baseline's widths; empty: the gate
  LatentQuant quant_;
  std::vector<std::array<std::vector<LatentGroupPlan>, 2>> plans_;  // per layer, K and V
  std::vector<size_t> quant_bits_;                                  // per layer: a token's stored bits, K and V
  double tau_ = 0.1;
  DynaKvWeights weights_;
  std::shared_ptr<RopeTable> rope_;
  std::vector<std::shared_ptr<LatentStore>> stores_;
  DynaKvGate gate_;
  nlohmann::json artifacts_, stats_;
};

// The parameters of both methods; dynakv's add Palu's latent quantization of the fixed-rank path.
std::vector<ParamSpec> shared_params() {
  return {ParamSpec::text("weights", "", "trained maps (kvbench train dynakv MODEL --alpha A writes them)"),
          ParamSpec::real("tau", 0.1, -1.0, 1.0, "hard threshold: keep coordinates whose mask exceeds it"),
          ParamSpec::real("fixed_rate", 0.0, 0.0, 1.0,
                          "> 0: keep round(rate d) PCA coordinates per token instead (fixed-rank baseline)"),
          ParamSpec::text("fixed_ranks", "",
                          "instead of fixed_rate, each layer's K and V widths: k0/v0/k1/v1/... (Palu's per-layer "
                          "ranks); on a basis fitted per group of heads, each entry a+b+c gives every group's rank")
              .added_later(""),
          ParamSpec::text("pca", "", "PCA artifact for fixed_rate or fixed_ranks (default: this model's)")};
}

std::vector<ParamSpec> method_params() { return with_latent_quant(shared_params()); }

std::vector<ParamSpec> snap_params() {
  auto p = shared_params();
  for (auto& w : window_scorer_params()) p.push_back(std::move(w));
  return p;
}

const bool method_registered = register_method(
    {.name = "dynakv",
     .summary = "learned per-token channel truncation of K and V (changes the model; kvbench train dynakv)",
     .params = method_params(),
     .make = [] { return std::make_unique<DynaKV>(false); },
     .steps = {{.command = "calibrate",
                .name = "dynakv-pca",
                .summary = "DynaKV's PCA basis per layer, K and V (uncentred second moment, fp64)",
                .options = pca_options(),
                .run = calibrate_pca},
               {.command = "train",
                .summary = "DynaKV's maps (U, W, b per layer, K and V) from the PCA basis, base model frozen",
                .options = train_options(),
                .run = train}},
     .budgeted = false,
     .changes_model = true});

const bool snap_registered = register_method(
    {.name = "dynakv-snapkv",
     .summary = "DynaKV + SnapKV: tokens evicted for all heads at once by summed window scores, within KV size T",
     .params = snap_params(),
     .make = [] { return std::make_unique<DynaKV>(true); },
     .changes_model = true});

}  // namespace

}  // namespace kvb
