// VECTOR (README.md §1-§7): a plug-in for any eviction method with three tiers instead of two.
// Keys are never approximated (their errors pass through the softmax); values are, by a linear map
// from the token's pre-RoPE key fitted offline per (layer, KV head) by least squares. The base
// selects a pool larger than the budget; in the pool, the tokens whose values the map predicts best
// keep only their key (the value is rebuilt at decode), the rest keep both, so the same bytes hold
// more tokens: P keys + R values = 2n vectors, the cost of n full tokens.
//
// `kvbench calibrate vector MODEL --text FILES [--tokens N]` fits the maps: plain prefill over the
// text, fp64 Gram sums of pre-RoPE keys and values per (layer, KV head) (and over the whole layer,
// the paper's granularity, for its R^2), a Cholesky solve with a tiny ridge, and the held-out R^2 on
// text disjoint from the fitting text.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "harness/engine/engine.hpp"
#include "harness/engine/rope_freqs.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/compose.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/base64.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"
#include "harness/util/text_files.hpp"
#include "methods/vector/approx_value_segment.hpp"
#include "methods/vector/value_map_fit.hpp"

namespace kvb {
namespace {

// ---------------------------------------------------------------------------------------------------
// Calibration

// The calibration documents: the files given (a directory means its *.txt in name order), or the
// NIAH essays set-up fetched. Each file is one document.
std::vector<std::string> read_documents(const std::string& spec, const std::string& data_dir, std::string& described) {
  if (!spec.empty()) {
    described = spec;
    return read_text_files(spec, "text");
  }
  const auto dir = std::filesystem::path(data_dir) / "PaulGrahamEssays";
  if (!std::filesystem::is_directory(dir))
    fail("kvbench calibrate vector: no --text given and {} is missing (scripts/setup.sh fetches it)", dir.string());
  described = "the Paul Graham essays of the NIAH haystack (" + dir.string() + "); the paper fits on C4";
  return read_text_files(dir.string(), "text");
}

// Streams every layer's pre-RoPE keys and values into the fits, or scores the fitted maps on them.
class KvTap final : public PrefillObserver {
 public:
  KvTap(int layers, int hkv, int d) : hkv_(hkv), d_(d) {
    for (int l = 0; l < layers; ++l) {
      head_.emplace_back();
      for (int g = 0; g < hkv; ++g) head_.back().emplace_back(d, d);
      key_head_.emplace_back(std::vector<OlsFit>(size_t(hkv), OlsFit(d, d)));
      key_r2_.emplace_back(std::vector<R2Score>(size_t(hkv), R2Score(d)));
      full_.emplace_back(hkv * d, hkv * d);
      head_r2_.emplace_back(std::vector<R2Score>(size_t(hkv), R2Score(d)));
      full_r2_.emplace_back(hkv * d);
    }
  }
  PrefillNeeds needs() const override { return {.k_pre_rope = true}; }
  void on_layer(const PrefillView& v, LayerCache&) override {
    const size_t N = size_t(v.n_tokens), row = size_t(hkv_) * d_;
    if (!scoring_) {
      for (int g = 0; g < hkv_; ++g) {
        head_[v.layer][g].add(v.k_pre_rope + g * d_, row, v.v + g * d_, row, N);
        key_head_[v.layer][g].add(v.v + g * d_, row, v.k_pre_rope + g * d_, row, N);
      }
      full_[v.layer].add(v.k_pre_rope, row, v.v, row, N);
      return;
    }
    std::vector<double> pred;
    auto score = [&](const std::vector<double>& w, int dim, const float* x, const float* y, R2Score& r2) {
      pred.assign(N * size_t(dim), 0.0);
      for (size_t t = 0; t < N; ++t)
        for (int i = 0; i < dim; ++i) {
          double s = 0;
          const double* wr = w.data() + size_t(i) * dim;
          for (int j = 0; j < dim; ++j) s += wr[j] * x[t * row + j];
          pred[t * dim + i] = s;
        }
      r2.add(pred.data(), y, row, N);
    };
    for (int g = 0; g < hkv_; ++g) {
      score(head_w_[v.layer][g], d_, v.k_pre_rope + g * d_, v.v + g * d_, head_r2_[v.layer][g]);
      score(key_w_[v.layer][g], d_, v.v + g * d_, v.k_pre_rope + g * d_, key_r2_[v.layer][g]);
    }
    score(full_w_[v.layer], int(row), v.k_pre_rope, v.v, full_r2_[v.layer]);
  }

  void solve(double ridge) {
    for (auto& layer : head_) {
      head_w_.emplace_back();
      for (auto& f : layer) head_w_.back().push_back(f.solve(ridge));
    }
    for (auto& f : full_) full_w_.push_back(f.solve(ridge));
    for (auto& layer : key_head_) {
      key_w_.emplace_back();
      for (auto& f : layer) key_w_.back().push_back(f.solve(ridge));
    }
    scoring_ = true;
  }

  std::vector<std::vector<OlsFit>> head_;
  std::vector<OlsFit> full_;
  std::vector<std::vector<std::vector<double>>> head_w_;
  std::vector<std::vector<double>> full_w_;
  std::vector<std::vector<R2Score>> head_r2_;
  std::vector<R2Score> full_r2_;
  // The reverse maps, pre-RoPE keys from values (the K-only ablation).
  std::vector<std::vector<OlsFit>> key_head_;
  std::vector<std::vector<std::vector<double>>> key_w_;
  std::vector<std::vector<R2Score>> key_r2_;

 private:
  int hkv_, d_;
  bool scoring_ = false;
};

nlohmann::json r2_summary(const std::vector<double>& r2) {
  std::vector<double> s = r2;
  std::sort(s.begin(), s.end());
  const size_t n = s.size();
  const double median = n % 2 ? s[n / 2] : 0.5 * (s[n / 2 - 1] + s[n / 2]);
  return {{"mean", std::accumulate(s.begin(), s.end(), 0.0) / double(n)},
          {"median", median},
          {"positive_layers", std::count_if(s.begin(), s.end(), [](double x) { return x > 0; })},
          {"per_layer", r2}};
}

void calibrate_vector(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const Params& o = ctx.options;
  const auto t0 = std::chrono::steady_clock::now();
  std::string described;
  const auto docs = read_documents(o.get("text"), ctx.data_dir, described);
  const auto [fit_docs, held_docs] = split_held_out(docs, o.get_int("heldout_every"), "kvbench calibrate vector",
                                                    "give more files or a lower -o heldout_every");
  const int len = static_cast<int>(std::min<long>(o.get_int("seq_len"), cfg.context_length));
  const auto fit = token_sequences(ctx.tokenizer, fit_docs, len, static_cast<size_t>(o.get_int("tokens")),
                                   "kvbench calibrate vector: tokens");
  const auto held = token_sequences(ctx.tokenizer, held_docs, len, static_cast<size_t>(o.get_int("heldout_tokens")),
                                    "kvbench calibrate vector: heldout_tokens");
  size_t fit_tokens = 0, held_tokens = 0;
  for (const auto& s : fit) fit_tokens += s.size();
  for (const auto& s : held) held_tokens += s.size();

  KvTap tap(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim);
  Progress bar("vector calibration", fit_tokens + held_tokens, "tok");
  const auto f0 = std::chrono::steady_clock::now();
  for (const auto& s : fit) {
    ctx.engine.prefill(s, &tap);
    bar.advance(s.size(), "fitting");
  }
  const double fit_seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - f0).count();
  tap.solve(o.get_float("ridge"));
  for (const auto& s : held) {
    ctx.engine.prefill(s, &tap);
    bar.advance(s.size(), "held-out R2");
  }
  bar.finish();

  std::vector<double> head_r2, full_r2, key_r2;
  nlohmann::json maps = nlohmann::json::array(), full_maps = nlohmann::json::array(),
                 key_maps = nlohmann::json::array();
  for (int l = 0; l < cfg.n_layers; ++l) {
    R2Score layer(cfg.head_dim), key_layer(cfg.head_dim);
    nlohmann::json heads = nlohmann::json::array(), key_heads = nlohmann::json::array();
    for (int g = 0; g < cfg.n_kv_heads; ++g) {
      layer.merge(tap.head_r2_[l][g]);
      key_layer.merge(tap.key_r2_[l][g]);
      const auto& w = tap.head_w_[l][g];
      heads.push_back(floats_to_base64(std::vector<float>(w.begin(), w.end())));
      const auto& kw = tap.key_w_[l][g];
      key_heads.push_back(floats_to_base64(std::vector<float>(kw.begin(), kw.end())));
    }
    head_r2.push_back(layer.r2());
    full_r2.push_back(tap.full_r2_[l].r2());
    key_r2.push_back(key_layer.r2());
    maps.push_back(heads);
    key_maps.push_back(key_heads);
    const auto& w = tap.full_w_[l];
    full_maps.push_back(floats_to_base64(std::vector<float>(w.begin(), w.end())));
  }
  nlohmann::json body;
  body["header"] = artifact_header("vector", cfg, ctx.model.path());
  body["header"]["tokenizer"] = ctx.tokenizer.kind();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  body["header"]["calibration"] = {
      {"maps",
       "per (layer, KV head): v = W k~, k~ the pre-RoPE key; W row-major [head_dim, head_dim], float32 "
       "little-endian in base64, no bias"},
      {"key_maps",
       "per (layer, KV head): k~ = W v, the reverse map of VECTOR's K-only ablation (approximate=keys); same "
       "layout"},
      {"full_maps", o.get_bool("full_layer_map")
                        ? "per layer: all KV heads' values from all their pre-RoPE keys, W row-major "
                          "[n_kv_heads x head_dim]^2, float32 little-endian in base64, no bias"
                        : "not stored (calibrate with -o full_layer_map=true)"},
      {"text", described},
      {"documents", {{"fitting", fit_docs.size()}, {"held_out", held_docs.size()}}},
      {"sequence_length", len},
      {"fitting_tokens", fit_tokens},
      {"held_out_tokens", held_tokens},
      {"ridge", fmt::format("{} x trace(Gkk) / dim", o.get_float("ridge"))},
      {"r2_per_head_maps", r2_summary(head_r2)},
      {"r2_full_layer_map", r2_summary(full_r2)},
      {"r2_key_maps", r2_summary(key_r2)},
      {"fitting_tokens_per_second", double(fit_tokens) / fit_seconds},
      {"seconds", seconds}};
  body["maps"] = maps;
  body["key_maps"] = key_maps;
  if (o.get_bool("full_layer_map")) body["full_maps"] = full_maps;
  const std::string path = ctx.out.empty() ? default_artifact_path("vector", cfg) : ctx.out;
  write_artifact(path, body);
  const auto& c = body["header"]["calibration"];
  fmt::print(
      "vector maps: {} fitting tokens ({:.0f} tok/s), {} held out; held-out R2 mean {:.4f} median {:.4f} "
      "(per-head maps), {:.4f} / {:.4f} (full-layer maps); written to {}\n",
      fit_tokens, c["fitting_tokens_per_second"].get<double>(), held_tokens,
      c["r2_per_head_maps"]["mean"].get<double>(), c["r2_per_head_maps"]["median"].get<double>(),
      c["r2_full_layer_map"]["mean"].get<double>(), c["r2_full_layer_map"]["median"].get<double>(), path);
}

// ---------------------------------------------------------------------------------------------------
// Inference

class Vector final : public WrapperMethod {
 public:
  void setup() override {
    WrapperMethod::setup();
    const ModelConfig& m = model();
    rope_ = std::make_shared<RopeTable>(
        rope_inv_freq(m), m.rope_layout == RopeLayout::Interleaved ? RopeStyle::Interleaved : RopeStyle::NeoX);
    if (params().get_float("p_c") >= 0) (void)approximation_ratio(params().get_float("p_c"));  // fail early
    full_ = params().get_bool("full_layer_map");
    keys_ = params().get("approximate") == "keys";
    if (keys_ && full_) fail("method vector: approximate=keys has per-head maps only (full_layer_map=false)");
    if (full_ && !params().get_bool("materialize"))
      fail(
          "method vector: full_layer_map=true needs materialize=true: decoding cannot rebuild a value from the keys "
          "of heads that evicted the token");
    if (params().get("maps") == "prompt") return;
    const LoadedArtifact a = load_artifact("vector", params().get("maps"), m, "kvbench calibrate vector MODEL");
    digest_ = a.digest;
    source_ = a.path;
    const char* field = keys_ ? "key_maps" : "maps";
    if (keys_ && !a.body.contains(field))
      fail(
          "{}: no field 'key_maps' (approximate=keys needs them): recalibrate with kvbench calibrate vector MODEL, "
          "which now fits them too",
          a.path);
    if (!a.body.contains(field) || !a.body[field].is_array() || a.body[field].size() != size_t(m.n_layers))
      fail("{}: field '{}' must list {} layers", a.path, field, m.n_layers);
    for (int l = 0; l < m.n_layers; ++l) {
      const auto& layer = a.body[field][l];
      if (!layer.is_array() || layer.size() != size_t(m.n_kv_heads))
        fail("{}: field '{}[{}]' must list {} KV heads", a.path, field, l, m.n_kv_heads);
      est_.emplace_back();
      for (int g = 0; g < m.n_kv_heads; ++g) {
        const std::string where = fmt::format("{}: field '{}[{}][{}]'", a.path, field, l, g);
        if (!layer[g].is_string()) fail("{} must be base64 text", where);
        auto w = floats_from_base64(layer[g].get<std::string>(), where);
        if (w.size() != size_t(m.head_dim) * m.head_dim)
          fail("{} holds {} values, expected {} x {}", where, w.size(), m.head_dim, m.head_dim);
        for (float x : w)
          if (!std::isfinite(x)) fail("{} holds a non-finite value", where);
        est_.back().push_back(std::make_shared<AffineValueEstimator>(m.head_dim, std::move(w), std::vector<float>{}));
      }
    }
    if (!full_) return;
    const size_t row = size_t(m.n_kv_heads) * m.head_dim;
    if (!a.body.contains("full_maps"))
      fail(
          "{}: no field 'full_maps' (full_layer_map=true needs them): recalibrate with kvbench calibrate vector MODEL "
          "-o full_layer_map=true",
          a.path);
    const auto& fm = a.body["full_maps"];
    if (!fm.is_array() || fm.size() != size_t(m.n_layers))
      fail("{}: field 'full_maps' must list {} layers", a.path, m.n_layers);
    for (int l = 0; l < m.n_layers; ++l) {
      const std::string where = fmt::format("{}: field 'full_maps[{}]'", a.path, l);
      if (!fm[l].is_string()) fail("{} must be base64 text", where);
      auto w = floats_from_base64(fm[l].get<std::string>(), where);
      if (w.size() != row * row) fail("{} holds {} values, expected {} x {}", where, w.size(), row, row);
      for (float x : w)
        if (!std::isfinite(x)) fail("{} holds a non-finite value", where);
      full_maps_.push_back(std::move(w));
    }
  }

  PrefillNeeds needs() const override {
    PrefillNeeds n = WrapperMethod::needs();
    n.k_pre_rope = true;
    return n;
  }

  nlohmann::json artifacts() const override {
    nlohmann::json a = WrapperMethod::artifacts();
    if (source_.empty()) return a;
    if (a.is_null()) a = nlohmann::json::object();
    a["vector_maps"] = {{"file", source_}, {"digest", digest_}};
    return a;
  }

  // p_a: the parameter, or the paper's Eq. 1 from p_c.
  double approximation_ratio(double pc) const {
    const double pa =
        params().get_float("p_a") >= 0 ? params().get_float("p_a") : std::min(pc / 2, (1 - pc - 1e-3) / 2);
    if (pa >= 1 - pc) fail("method vector: p_a {} must be below 1 - p_c = {}", pa, 1 - pc);
    return pa;
  }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    // Step 1. A run at a compression ratio has n = floor(S (1 - p_c)) and a = round(p_a S); a run at a
    // KV size T has n = T and a = round(p_a / (1 - p_c) T), so that a keeps its ratio to the budget.
    // Where the base gives each layer or head its own n_s (PyramidKV, HeadKV), a scales with it:
    // a_s = round(a n_s / T) (README.md §1). The pool of each stored head is then the base's own choice
    // at n_s plus the next a_s tokens of its ranking. (Rerunning the base at a larger budget instead
    // would let PyramidKV's clamp reshape its pyramid, and a layer could get a > n.)
    const double pc_param = params().get_float("p_c");
    if (b.compression_ratio > 0 && pc_param >= 0 && std::abs(pc_param - b.compression_ratio) > 1e-12)
      fail("method vector: p_c={} but the run asks for compression ratio {}; leave p_c unset (-1) in ratio runs",
           pc_param, b.compression_ratio);
    const double pc = b.compression_ratio > 0 ? b.compression_ratio : pc_param >= 0 ? pc_param : 0.9;
    const double pa = approximation_ratio(pc);
    const double extra_per_token = (b.compression_ratio > 0 ? pa * v.n_tokens : pa / (1 - pc) * b.tokens) / b.tokens;
    if (!v.k_pre_rope) fail("internal: the prefill did not keep the pre-RoPE keys vector asked for");
    const Selection at_n = base_select(v, b);
    std::vector<int> extra(at_n.keep.size());
    for (size_t s = 0; s < extra.size(); ++s)
      extra[s] = static_cast<int>(std::nearbyint(extra_per_token * static_cast<double>(at_n.keep[s].size())));
    Selection pool = at_n;
    pool.keep = extend_keep(at_n, extra, v.n_tokens);
    rope_->ensure(v.n_tokens + 1);
    const int d = v.head_dim, hkv = v.n_kv_heads, stored = static_cast<int>(pool.keep.size());
    const int G = stored / hkv;  // 1 in native mode; query heads per KV head in repeat mode
    const bool protect = params().get_bool("protect_window");
    LayerCache cache(v.n_heads, stored, d);
    long approximated = 0, retained = 0;
    std::vector<float> pred(d);
    const auto estimators = layer_estimators(v);
    const bool materialize = params().get_bool("materialize");
    const size_t row = size_t(hkv) * d;
    const std::vector<float> full_map = full_ ? layer_full_map(v) : std::vector<float>{};
    // v^ of token j in KV head g: from its own pre-RoPE key, or from all heads' with the full-layer map;
    // with approximate=keys, its pre-RoPE key from its value.
    auto predict = [&](int g, int32_t j, float* out) {
      if (keys_) return estimators[g]->predict(v.v + (size_t(j) * hkv + g) * d, out);
      if (!full_) return estimators[g]->predict(v.k_pre_rope + (size_t(j) * hkv + g) * d, out);
      const float* x = v.k_pre_rope + size_t(j) * row;
      for (int i = 0; i < d; ++i) {
        const float* w = full_map.data() + (size_t(g) * d + i) * row;
        out[i] = std::inner_product(w, w + row, x, 0.0f);
      }
    };
    for (int s = 0; s < stored; ++s) {
      const int g = s / G;
      const auto& P = pool.keep[s];
      const int n = static_cast<int>(at_n.keep[s].size());
      const int a = std::max(0, static_cast<int>(P.size()) - n);
      // Reconstruction error of every eligible pool token; the A best-predicted lose their value.
      std::vector<std::pair<double, int32_t>> eps;
      for (int32_t j : P) {
        if (protect && j >= v.n_tokens - pool.window) continue;
        const size_t off = (size_t(j) * hkv + g) * d;
        predict(g, j, pred.data());
        const float* target = keys_ ? v.k_pre_rope + off : v.v + off;
        double e = 0;
        for (int i = 0; i < d; ++i) e += double(target[i] - pred[i]) * (target[i] - pred[i]);
        eps.push_back({e, j});
      }
      const size_t A = std::min<size_t>(size_t(2 * a), eps.size());
      std::partial_sort(eps.begin(), eps.begin() + static_cast<std::ptrdiff_t>(A), eps.end());
      std::vector<char> approx(size_t(v.n_tokens), 0);
      for (size_t i = 0; i < A; ++i) approx[size_t(eps[i].second)] = 1;
      auto seg_a = std::make_unique<ApproxValueSegment>(d, estimators[g], rope_, false);
      auto seg_m = std::make_unique<MaterializedValueSegment>(d, full_ ? "full-layer affine" : "affine", keys_);
      auto seg_d = std::make_unique<DenseSegment>(d);
      for (int32_t j : P) {
        const size_t off = (size_t(j) * hkv + g) * d;
        if (!approx[size_t(j)]) {
          seg_d->append(v.k + off, v.v + off, j);
        } else if (keys_) {
          // The estimated key rotated to the token's position, as attention reads keys.
          predict(g, j, pred.data());
          rope_->apply(pred.data(), 1, 1, d, &j);
          seg_m->append(pred.data(), v.v + off, j);
        } else if (materialize) {
          predict(g, j, pred.data());
          seg_m->append(v.k + off, pred.data(), j);
        } else {
          seg_a->append(v.k + off, j);
        }
      }
      approximated += static_cast<long>(seg_a->size() + seg_m->size());
      retained += static_cast<long>(seg_d->size());
      // Approximated tokens first: decode appends to the dense tail.
      if (seg_a->size()) cache.segments(s).push_back(std::move(seg_a));
      if (seg_m->size()) cache.segments(s).push_back(std::move(seg_m));
      cache.segments(s).push_back(std::move(seg_d));
    }
    stats_ = {{"layer", v.layer},
              {"approximated", approximated},
              {"retained", retained},
              {"position_bytes", (approximated + retained) * long(sizeof(int32_t))}};
    return cache;
  }

  nlohmann::json layer_stats() const override { return stats_; }

 private:
  // The calibrated maps of this layer, or with maps=prompt maps fitted on this prompt's own keys and
  // values (an oracle: what a calibration matched to the prompt could reach); keys from values with
  // approximate=keys.
  std::vector<std::shared_ptr<const ValueEstimator>> layer_estimators(const PrefillView& v) const {
    if (!est_.empty()) return est_[size_t(v.layer)];
    std::vector<std::shared_ptr<const ValueEstimator>> out;
    const size_t row = size_t(v.n_kv_heads) * v.head_dim;
    for (int g = 0; g < v.n_kv_heads; ++g) {
      OlsFit fit(v.head_dim, v.head_dim);
      const float *k = v.k_pre_rope + g * v.head_dim, *val = v.v + g * v.head_dim;
      fit.add(keys_ ? val : k, row, keys_ ? k : val, row, size_t(v.n_tokens));
      const auto w = fit.solve(1e-6);
      out.push_back(std::make_shared<AffineValueEstimator>(v.head_dim, std::vector<float>(w.begin(), w.end()),
                                                           std::vector<float>{}));
    }
    return out;
  }

  // This layer's full map [row x row], row = n_kv_heads x head_dim; with maps=prompt, fitted on the prompt.
  std::vector<float> layer_full_map(const PrefillView& v) const {
    if (!full_maps_.empty()) return full_maps_[size_t(v.layer)];
    const size_t row = size_t(v.n_kv_heads) * v.head_dim;
    OlsFit fit(static_cast<int>(row), static_cast<int>(row));
    fit.add(v.k_pre_rope, row, v.v, row, size_t(v.n_tokens));
    const auto w = fit.solve(1e-6);
    return {w.begin(), w.end()};
  }

  std::vector<std::vector<std::shared_ptr<const ValueEstimator>>> est_;  // [layer][KV head]
  std::vector<std::vector<float>> full_maps_;                            // [layer], with full_layer_map
  bool full_ = false;
  bool keys_ = false;  // approximate=keys: the maps give keys from values
  std::shared_ptr<RopeTable> rope_;
  std::string digest_, source_;
  nlohmann::json stats_;
};

const bool registered = register_method(
    {.name = "vector",
     .summary = "retain / approximate (value rebuilt from the key by a fitted map) / evict over a base selector",
     .params = {base_method_param(),
                ParamSpec::real("p_c", -1.0, -1.0, 0.999,
                                "compression ratio p_c the approximation share is set from (-1: the run's own ratio "
                                "in ratio runs, 0.9 at a KV size)"),
                ParamSpec::real("p_a", -1.0, -1.0, 0.999,
                                "approximation ratio p_a (-1: the paper's Eq. 1, min(p_c/2, (1 - p_c - 1e-3)/2)); "
                                "the pool grows by a = round(p_a S) at a ratio, round(p_a / (1 - p_c) T) at a KV size, "
                                "and 2a tokens lose their value"),
                ParamSpec::boolean("protect_window", false, "never approximate the base's observation window"),
                ParamSpec::boolean("materialize", false,
                                   "accuracy-only runs: estimate the values once at prefill and store them (bytes "
                                   "still counted as keys only; decoding as fast as dense)")
                    .added_later(),
                ParamSpec::boolean("full_layer_map", false,
                                   "estimate each head's values from all KV heads' keys with the per-layer map (needs "
                                   "materialize and an artifact calibrated with -o full_layer_map=true)")
                    .added_later(),
                ParamSpec::choice("approximate", "values", {"values", "keys"},
                                  "what approximated tokens lose: their values (VECTOR), or their keys, rebuilt from "
                                  "the values by the key maps and rotated, stored at prefill (the K-only ablation of "
                                  "Appendix E; bytes counted as values only)")
                    .added_later(),
                ParamSpec::text("maps", "",
                                "map file (default: this model's artifact from kvbench calibrate vector; "
                                "'prompt': maps fitted on each prompt itself, an oracle)")},
     .make = [] { return std::make_unique<Vector>(); },
     .steps = {{.options = {ParamSpec::text("text", "",
                                            "text files or directories, comma-separated; each file one document "
                                            "(default: the NIAH essays; the paper used C4)"),
                            ParamSpec::integer("tokens", 65536, 1, 100000000000L, "fitting tokens"),
                            ParamSpec::integer("heldout_tokens", 16384, 1, 100000000000L, "held-out tokens for R2"),
                            ParamSpec::integer("heldout_every", 10, 2, 1000000, "every n-th document is held out"),
                            ParamSpec::integer("seq_len", 4096, 16, 1000000, "tokens per sequence (BOS + text)"),
                            ParamSpec::real("ridge", 1e-6, 0.0, 1.0, "ridge lambda as a share of trace(Gkk)/dim"),
                            ParamSpec::boolean(
                                "full_layer_map", false,
                                "also store the per-layer maps over all KV heads (the paper's granularity; "
                                "their R2 is reported either way)")},
                .run = calibrate_vector}},
     .composition = Composition::Wrapper});

}  // namespace
}  // namespace kvb
