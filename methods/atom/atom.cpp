// Atom (Zhao et al., MLSys 2024; efeslab/Atom, model/): low-bit weights, activations and KV cache. Every
// linear product of the decoder layers multiplies quantized activations (per token, groups of channels)
// by quantized weights (groups of input channels, a scale shared by consecutive output rows); each
// product's input channels are first reordered by a calibration statistic so that the outliers come last,
// where `keeper` of them stay at 8 bits. Keys (before RoPE) and values are quantized per token and head,
// asymmetric. Like Atom's evaluation, the quantization is simulated: the engine multiplies the dequantized
// numbers in fp32 (LinearTransform, KvTransform) and the cache charges the codes and their fp16 scales.
// Weights are rounded to nearest (Atom's code without --use_gptq); README.md says what that leaves out.
#include "methods/atom/atom.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <numeric>
#include <utility>

#include "harness/engine/engine.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"

namespace kvb {

void atom_quantize_group(float* x, size_t n, int bits, bool sym, float clip) {
  if (n == 0) return;
  if (sym) {
    const float q_max = float((1 << (bits - 1)) - 1), q_min = -float(1 << (bits - 1));
    float m = 0;
    for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(x[i]));
    m = std::max(m, 1e-5f);
    if (clip < 1.0f) m *= clip;
    const float s = m / q_max;
    // Atom adds and subtracts a zero point of 0 here too, which turns a code of -0 into +0.
    constexpr float base = 0.0f;
    for (size_t i = 0; i < n; ++i) x[i] = (std::clamp(std::nearbyint(x[i] / s) + base, q_min, q_max) - base) * s;
    return;
  }
  const float q_max = float((1 << bits) - 1);
  float hi = x[0], lo = x[0];
  for (size_t i = 1; i < n; ++i) {
    hi = std::max(hi, x[i]);
    lo = std::min(lo, x[i]);
  }
  if (clip < 1.0f) {
    hi *= clip;
    lo *= clip;
  }
  const float s = std::max(hi - lo, 1e-5f) / q_max;
  const float base = std::clamp(std::nearbyint(-lo / s), 0.0f, q_max);
  for (size_t i = 0; i < n; ++i) x[i] = (std::clamp(std::nearbyint(x[i] / s) + base, 0.0f, q_max) - base) * s;
}

namespace {

// The keeper columns [cols - keeper, cols) of each of `rows` rows (`stride` apart), per row at 8 bits,
// saved aside and zeroed in x; put back by restore_keeper.
void take_keeper(float* x, int rows, size_t stride, int cols, const AtomQuant& q, std::vector<float>& saved) {
  const size_t k = size_t(q.keeper);
  saved.resize(size_t(rows) * k);
  for (int r = 0; r < rows; ++r) {
    float* row = x + size_t(r) * stride + size_t(cols) - k;
    float* keep = saved.data() + size_t(r) * k;
    std::copy_n(row, k, keep);
    if (q.keeper_bits < 16) atom_quantize_group(keep, k, q.keeper_bits, true, 1.0f);
    std::fill_n(row, k, 0.0f);
  }
}

void restore_keeper(float* x, int rows, size_t stride, int cols, const AtomQuant& q, const std::vector<float>& saved) {
  const size_t k = size_t(q.keeper);
  for (int r = 0; r < rows; ++r)
    std::copy_n(saved.data() + size_t(r) * k, k, x + size_t(r) * stride + size_t(cols) - k);
}

}  // namespace

void atom_quantize_rows(float* x, int n, int cols, const AtomQuant& q) {
  std::vector<float> saved;
  if (q.keeper > 0) take_keeper(x, n, size_t(cols), cols, q, saved);
  const int g = q.group > 0 ? q.group : cols;
  for (int r = 0; r < n; ++r)
    for (int c = 0; c < cols; c += g) atom_quantize_group(x + size_t(r) * cols + c, size_t(g), q.bits, q.sym, q.clip);
  if (q.keeper > 0) restore_keeper(x, n, size_t(cols), cols, q, saved);
}

void atom_quantize_weight(float* w, int rows, int cols, const AtomQuant& q) {
  std::vector<float> saved;
  if (q.keeper > 0) take_keeper(w, rows, size_t(cols), cols, q, saved);
  if (q.group == 0) {
    // Per output row over all its columns: Atom's per-channel call passes neither the channel groups nor
    // the clip ratio.
    for (int r = 0; r < rows; ++r) atom_quantize_group(w + size_t(r) * cols, size_t(cols), q.bits, q.sym, 1.0f);
  } else {
    // A column block of `channel_group` consecutive rows is one group (Atom reshapes W[:, i1:i2] to
    // [rows / channel_group, channel_group x group]).
    const int cg = q.channel_group, g = q.group;
    std::vector<float> block(size_t(cg) * g);
    for (int c = 0; c < cols; c += g)
      for (int r = 0; r < rows; r += cg) {
        for (int i = 0; i < cg; ++i) std::copy_n(w + size_t(r + i) * cols + c, g, block.data() + size_t(i) * g);
        atom_quantize_group(block.data(), block.size(), q.bits, q.sym, q.clip);
        for (int i = 0; i < cg; ++i) std::copy_n(block.data() + size_t(i) * g, g, w + size_t(r + i) * cols + c);
      }
  }
  if (q.keeper > 0) restore_keeper(w, rows, size_t(cols), cols, q, saved);
}

void atom_quantize_rows_in_order(float* x, int n, int cols, const std::vector<int>& perm, const AtomQuant& q,
                                 std::vector<float>& scratch) {
  if (perm.empty()) return atom_quantize_rows(x, n, cols, q);
  scratch.resize(size_t(n) * cols);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < cols; ++j) scratch[size_t(r) * cols + j] = x[size_t(r) * cols + size_t(perm[size_t(j)])];
  atom_quantize_rows(scratch.data(), n, cols, q);
  for (int r = 0; r < n; ++r)
    for (int j = 0; j < cols; ++j) x[size_t(r) * cols + size_t(perm[size_t(j)])] = scratch[size_t(r) * cols + j];
}

void atom_quantize_weight_in_order(float* w, int rows, int cols, const std::vector<int>& perm, const AtomQuant& q) {
  if (perm.empty()) return atom_quantize_weight(w, rows, cols, q);
  std::vector<float> p(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) p[size_t(r) * cols + j] = w[size_t(r) * cols + size_t(perm[size_t(j)])];
  atom_quantize_weight(p.data(), rows, cols, q);
  for (int r = 0; r < rows; ++r)
    for (int j = 0; j < cols; ++j) w[size_t(r) * cols + size_t(perm[size_t(j)])] = p[size_t(r) * cols + j];
}

int atom_site_width(const ModelConfig& m, MatrixInput s) {
  switch (s) {
    case MatrixInput::AttentionOutput:
      return m.n_heads * m.head_dim;
    case MatrixInput::MlpHidden:
      return m.intermediate;
    default:
      return m.hidden;
  }
}

std::vector<int> atom_order(std::span<const double> stat) {
  std::vector<int> order(stat.size());
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int a, int b) { return stat[size_t(a)] < stat[size_t(b)]; });
  return order;
}

namespace {

constexpr const char* kKind = "atom";
// ---------------------------------------------------------------------------------------------------
// Calibration: the diagonal of each site's Hessian, sum over tokens of x_c^2 (Atom's act_sort_metric
// 'hessian', up to its constant factor 2 / nsamples, which leaves the order alone), then its order.

constexpr const char* kPaperText =
    "Atom calibrates on 128 random windows of 2,048 tokens of WikiText-2's training text";

class SiteStats final : public PrefillObserver, public LinearTransform {
 public:
  explicit SiteStats(const ModelConfig& m) : sums_(size_t(m.n_layers)) {
    for (auto& layer : sums_)
      for (MatrixInput s : kAtomSites) layer[size_t(s)].assign(size_t(atom_site_width(m, s)), 0.0);
  }
  void on_layer(const PrefillView&, LayerCache&) override {}
  LinearTransform* linear_transform() override { return this; }
  std::string weights_key() const override { return ""; }
  void inputs(int layer, MatrixInput site, float* x, int n, int cols) override {
    std::vector<double>& sum = sums_[size_t(layer)][size_t(site)];
    for (int r = 0; r < n; ++r)
      for (int c = 0; c < cols; ++c) sum[size_t(c)] += double(x[size_t(r) * cols + c]) * x[size_t(r) * cols + c];
  }
  const std::vector<double>& sum(int layer, MatrixInput s) const { return sums_[size_t(layer)][size_t(s)]; }

 private:
  std::vector<std::array<std::vector<double>, 4>> sums_;
};

void calibrate(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const FitSequences fit = fit_sequences(ctx, "kvbench calibrate atom", kPaperText);
  size_t total = 0;
  for (const auto& s : fit.seqs) total += s.size();
  SiteStats stats(cfg);
  Progress bar("atom reorder index", total, "tok");
  for (const auto& s : fit.seqs) {
    ctx.engine.prefill(s, &stats);
    bar.advance(s.size());
  }
  bar.finish();
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < cfg.n_layers; ++l) {
    nlohmann::json layer;
    for (MatrixInput s : kAtomSites) {
      const std::vector<int> order = atom_order(stats.sum(l, s));
      layer[matrix_input_name(s)] = order;
    }
    layers.push_back(std::move(layer));
  }
  const std::string out = ctx.out.empty() ? default_artifact_path(kKind, cfg) : ctx.out;
  nlohmann::json body = {{"layers", std::move(layers)}};
  body["header"] = artifact_header(kKind, cfg, ctx.model.path());
  // No timing in the header: a calibration repeated on the same text gives the same file, and so the same
  // digest in results' keys.
  body["header"]["calibration"] = {
      {"text", fit.described},
      {"tokens", total},
      {"sequences", fit.seqs.size()},
      {"seq_len", fit.seq_len},
      {"metric",
       "hessian: per site and channel, the sum over calibration tokens of x^2, fp64; channels in "
       "ascending order, outliers last"}};
  write_artifact(out, body);
  fmt::print("wrote {} ({} tokens)\n", out, total);
}

AtomReorder reorder_from(const LoadedArtifact& a, const ModelConfig& m) {
  const auto& layers = a.body.value("layers", nlohmann::json());
  if (!layers.is_array() || layers.size() != size_t(m.n_layers))
    fail("{}: field 'layers' must be an array of the model's {} layers", a.path, m.n_layers);
  AtomReorder r;
  r.layers.resize(size_t(m.n_layers));
  for (int l = 0; l < m.n_layers; ++l)
    for (MatrixInput s : kAtomSites) {
      const auto& j = layers[size_t(l)].value(matrix_input_name(s), nlohmann::json());
      const size_t width = size_t(atom_site_width(m, s));
      const std::string where = fmt::format("{}: layers[{}].{}", a.path, l, matrix_input_name(s));
      if (!j.is_array() || j.size() != width) fail("{}: expected a permutation of the {} channels", where, width);
      std::vector<int>& perm = r.layers[size_t(l)][size_t(s)];
      std::vector<bool> seen(width, false);
      for (const auto& v : j) {
        if (!v.is_number_integer() || v.get<long>() < 0 || size_t(v.get<long>()) >= width || seen[v.get<size_t>()])
          fail("{}: expected a permutation of the {} channels; {} is not one of them or repeats", where, width,
               v.dump());
        seen[v.get<size_t>()] = true;
        perm.push_back(v.get<int>());
      }
    }
  return r;
}

// ---------------------------------------------------------------------------------------------------
// The cache: the keys and values as attention reads them (dequantized, the keys rotated after), charged
// as Atom stores them: per token and head, b-bit codes with an fp16 scale and zero point each.

class AtomSegment final : public RowSegment {
 public:
  AtomSegment(int head_dim, int bits) : RowSegment(head_dim, KvDtype::F32), d_(head_dim), bits_(bits) {}
  std::string format() const override { return fmt::format("atom(kv{})", bits_); }
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  size_t bytes() const override { return 2 * size() * ((size_t(d_) * bits_ + 7) / 8 + 2 * sizeof(uint16_t)); }
  bool append_token(const float* k, const float* v, int32_t pos) override {
    k_.append(k);
    v_.append(v);
    pos_.push_back(pos);
    return true;
  }
  void store_as(KvDtype) override {}

 private:
  int d_, bits_;
  std::vector<int32_t> pos_;
};

class Atom final : public Method, public KvTransform, public LinearTransform {
 public:
  void setup() override {
    const ModelConfig& m = model();
    const Params& p = params();
    const int wbits = std::stoi(p.get("wbits")), abits = std::stoi(p.get("abits"));
    const int keeper = p.integer("keeper");
    const int keeper_bits = p.get("keeper_precision") == "int8" ? 8 : 16;
    weights_ = {.bits = wbits,
                .group = std::stoi(p.get("weight_group_size")),
                .sym = p.get_bool("w_sym"),
                .clip = float(p.get_float("w_clip_ratio")),
                .keeper = keeper,
                .keeper_bits = keeper_bits,
                .channel_group = p.integer("weight_channel_group")};
    acts_ = {.bits = abits,
             .group = std::stoi(p.get("act_group_size")),
             .sym = p.get_bool("a_sym"),
             .clip = float(p.get_float("a_clip_ratio")),
             .keeper = keeper,
             .keeper_bits = keeper_bits};
    kv_bits_ = p.get_bool("kv_cache") && abits < 16 ? abits : 16;
    kv_clip_ = float(p.get_float("kv_clip_ratio"));
    // Atom's asserts, here before any work: each width divisible by its group, the keeper within it.
    for (MatrixInput s : kAtomSites) {
      const int width = atom_site_width(m, s);
      for (auto [what, group] : {std::pair{"act_group_size", acts_.group}, {"weight_group_size", weights_.group}})
        if (group > 0 && width % group != 0)
          fail(
              "method atom: {} {} does not divide the {} channels entering the {} products ({}); Atom's code asserts "
              "this too: choose a group that divides every input width (hidden {}, attention output {}, MLP hidden "
              "{})",
              what, group, width, matrix_input_name(s), m.name, m.hidden, m.n_heads * m.head_dim, m.intermediate);
      if (keeper > width)
        fail("method atom: keeper {} exceeds the {} channels of {}", keeper, width, matrix_input_name(s));
    }
    for (Matrix mat : kMatrices) {
      const int rows = mat == Matrix::O || mat == Matrix::Down ? m.hidden
                       : mat == Matrix::Q                      ? m.n_heads * m.head_dim
                       : mat == Matrix::K || mat == Matrix::V  ? m.n_kv_heads * m.head_dim
                                                               : m.intermediate;
      if (weights_.group > 0 && rows % weights_.channel_group != 0)
        fail("method atom: weight_channel_group {} does not divide the {} rows of the {} matrices",
             weights_.channel_group, rows, matrix_name(mat));
    }
    if (p.get_bool("reorder")) {
      artifact_ = load_artifact(kKind, p.get("index"), m, "kvbench calibrate atom MODEL");
      reorder_ = reorder_from(artifact_, m);
    } else {
      reorder_.layers.resize(size_t(m.n_layers));
    }
    key_ = fmt::format("atom w{} g{}x{} {} clip {} keeper {}@{} {}", wbits, weights_.group, weights_.channel_group,
                       weights_.sym ? "sym" : "asym", weights_.clip, keeper, keeper_bits,
                       artifact_.path.empty() ? "model order" : "index " + artifact_.digest);
  }

  nlohmann::json artifacts() const override {
    if (artifact_.path.empty()) return nullptr;
    return {{"index", {{"file", artifact_.path}, {"digest", artifact_.digest}}}};
  }

  KvTransform* kv_transform() override { return this; }
  LinearTransform* linear_transform() override { return this; }

  // Keys before RoPE and values, per token and KV head, as Atom's k_quant and v_quant.
  void apply(int, int n, const int32_t*, float* k, float* v) override {
    if (kv_bits_ >= 16) return;
    const int d = model().head_dim, rows = n * model().n_kv_heads;
    for (float* x : {k, v})
      for (int r = 0; r < rows; ++r) atom_quantize_group(x + size_t(r) * d, size_t(d), kv_bits_, false, kv_clip_);
  }

  std::string weights_key() const override { return weights_.bits < 16 ? key_ : ""; }
  void weights(int layer, Matrix m, float* w, int rows, int cols) override {
    const std::vector<int>& perm = reorder_.of(layer, input_of(m));
    if (weights_.channel_group == 1 || weights_.group == 0)  // no row shares a scale with another
      return atom_quantize_weight_in_order(w, rows, cols, perm, weights_);
    // Rows sharing a scale are neighbours in Atom's order of them. gate's and up's rows are reordered as
    // down's input (reorder_model_llama's out_reorder_index) before they are quantized. The others keep the
    // Hugging Face checkpoint's order, which a GGUF changes for q and k: llama.cpp reorders their rows for its
    // interleaved RoPE (GGUF row h d + 2 i + j = HF row h d + j d / 2 + i).
    std::vector<int> row_order;
    const int d = model().head_dim;
    if (m == Matrix::Gate || m == Matrix::Up) {
      row_order = reorder_.of(layer, MatrixInput::MlpHidden);
    } else if ((m == Matrix::Q || m == Matrix::K) && model().rope_layout == RopeLayout::Interleaved) {
      for (int hf = 0; hf < rows; ++hf) row_order.push_back(hf / d * d + 2 * (hf % d % (d / 2)) + hf % d / (d / 2));
    }
    if (row_order.empty()) return atom_quantize_weight_in_order(w, rows, cols, perm, weights_);
    std::vector<float> ordered(size_t(rows) * cols);
    for (int r = 0; r < rows; ++r)
      std::copy_n(w + size_t(row_order[size_t(r)]) * cols, cols, ordered.data() + size_t(r) * cols);
    atom_quantize_weight_in_order(ordered.data(), rows, cols, perm, weights_);
    for (int r = 0; r < rows; ++r)
      std::copy_n(ordered.data() + size_t(r) * cols, cols, w + size_t(row_order[size_t(r)]) * cols);
  }
  void inputs(int layer, MatrixInput site, float* x, int n, int cols) override {
    if (acts_.bits >= 16) return;
    atom_quantize_rows_in_order(x, n, cols, reorder_.of(layer, site), acts_, scratch_);
  }

  LayerCache compress(const PrefillView& v, const Budget&) override {
    const int hkv = v.n_kv_heads, d = v.head_dim, stored = stored_heads(), G = stored / hkv;
    LayerCache cache(v.n_heads, stored, d);
    if (kv_bits_ >= 16) return keep_all(v, gqa());
    for (int s = 0; s < stored; ++s) {
      auto seg = std::make_unique<AtomSegment>(d, kv_bits_);
      for (int t = 0; t < v.n_tokens; ++t) {
        const size_t at = size_t(t) * hkv * d + size_t(s / G) * d;
        seg->append_token(v.k + at, v.v + at, v.positions[t]);
      }
      cache.segments(s).push_back(std::move(seg));
    }
    return cache;
  }

 private:
  AtomQuant weights_, acts_;
  int kv_bits_ = 16;
  float kv_clip_ = 1.0f;
  LoadedArtifact artifact_;
  AtomReorder reorder_;
  std::string key_;
  std::vector<float> scratch_;
};

std::vector<ParamSpec> method_params() {
  const std::vector<std::string> bits = {"2", "3", "4", "8", "16"};
  return {
      ParamSpec::choice("wbits", "4", bits, "weight bits (16: weights as they are)"),
      ParamSpec::choice("abits", "4", bits, "activation bits, also the KV cache's (16: activations as they are)"),
      ParamSpec::boolean("w_sym", true,
                         "symmetric weight quantization (Atom's run scripts; its code's default is off)"),
      ParamSpec::boolean("a_sym", true, "symmetric activation quantization (the same)"),
      ParamSpec::choice("weight_group_size", "128", {"0", "32", "64", "128", "256", "384", "768"},
                        "input channels per weight group (0: per output row)"),
      ParamSpec::integer("weight_channel_group", 2, 1, 64, "consecutive output rows sharing each group's scale"),
      ParamSpec::choice("act_group_size", "128", {"0", "64", "128", "256", "384", "768"},
                        "channels per activation group (0: per token)"),
      ParamSpec::boolean("reorder", true, "reorder each product's input channels by the calibration (outliers last)"),
      ParamSpec::integer("keeper", 128, 0, 1 << 20, "outlier channels, last in the reordered order, kept apart"),
      ParamSpec::choice("keeper_precision", "int8", {"int8", "fp16"},
                        "the outliers' precision (Atom's keeper_precision 3 or 0)"),
      ParamSpec::real("a_clip_ratio", 0.9, 1e-3, 1.0, "activation range clip"),
      ParamSpec::real("w_clip_ratio", 0.85, 1e-3, 1.0, "weight range clip"),
      ParamSpec::real("kv_clip_ratio", 1.0, 1e-3, 1.0, "KV cache range clip"),
      ParamSpec::boolean("kv_cache", true, "quantize the KV cache (keys before RoPE, values; per token and head)"),
      ParamSpec::text("index", "", "reorder index (default: this model's from kvbench calibrate atom)"),
  };
}

const bool registered = register_method(
    {.name = "atom",
     .summary = "Atom's W4A4 with 4-bit KV: every decoder product on quantized weights and activations, outlier "
                "channels reordered last and kept at 8 bits (changes the model; kvbench calibrate atom)",
     .params = method_params(),
     .make = [] { return std::make_unique<Atom>(); },
     .steps = {{.command = "calibrate",
                .summary = "Atom's reorder index: each product's input channels by their Hessian diagonal",
                .options =
                    [] {
                      auto o = calibration_text_options();
                      for (ParamSpec& spec : o)
                        if (spec.name == "seq_len") spec.default_value = "2048";  // Atom's model.seqlen
                      o.push_back(ParamSpec::integer("tokens", 262144, 1, 1L << 40,
                                                     "calibration tokens (Atom: 128 x 2048 = 262,144)"));
                      o.push_back(id_sequences_option());
                      return o;
                    }(),
                .run = calibrate}},
     .budgeted = false,
     .changes_model = true});

}  // namespace
}  // namespace kvb
