// Atom (Zhao et al., MLSys 2024; efeslab/Atom, model/): low-bit weights, activations and KV cache. Every
// linear product of the decoder layers multiplies quantized activations (per token, groups of channels)
// by quantized weights (groups of input channels, a scale shared by consecutive output rows); each
// product's input channels are first reordered by a calibration statistic so that the outliers come last,
// where `keeper` of them stay at 8 bits. Keys (before RoPE) and values are quantized per token and head,
// asymmetric. Like Atom's evaluation, the quantization is simulated: the engine multiplies the dequantized
// numbers in fp32 (LinearTransform, KvTransform) and the cache charges the codes and their fp16 scales.
// Weights are rounded to nearest (Atom's code without --use_gptq) or, with weights=gptq, by Atom's GPTQ
// (gptq.hpp) from `kvbench calibrate atom-gptq`, layer by layer on the quantized model's activations.
#include "methods/atom/atom.hpp"

#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <array>
#include <cmath>
#include <map>
#include <memory>
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
#include "methods/atom/gptq.hpp"

namespace kvb {

AtomGrid atom_group_grid(const float* x, size_t n, int bits, bool sym, float clip) {
  if (sym) {
    float m = 0;
    for (size_t i = 0; i < n; ++i) m = std::max(m, std::abs(x[i]));
    m = std::max(m, 1e-5f);
    if (clip < 1.0f) m *= clip;
    // Atom adds and subtracts a zero point of 0 here too, which turns a code of -0 into +0.
    return {.scale = m / float((1 << (bits - 1)) - 1),
            .base = 0.0f,
            .lo = -float(1 << (bits - 1)),
            .hi = float((1 << (bits - 1)) - 1)};
  }
  const float q_max = float((1 << bits) - 1);
  float hi = n ? x[0] : 0, lo = hi;
  for (size_t i = 1; i < n; ++i) {
    hi = std::max(hi, x[i]);
    lo = std::min(lo, x[i]);
  }
  if (clip < 1.0f) {
    hi *= clip;
    lo *= clip;
  }
  const float s = std::max(hi - lo, 1e-5f) / q_max;
  return {.scale = s, .base = std::clamp(std::nearbyint(-lo / s), 0.0f, q_max), .lo = 0.0f, .hi = q_max};
}

void atom_quantize_group(float* x, size_t n, int bits, bool sym, float clip) {
  if (n == 0) return;
  const AtomGrid g = atom_group_grid(x, n, bits, sym, clip);
  for (size_t i = 0; i < n; ++i) x[i] = (g.code(x[i]) - g.base) * g.scale;
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

void atom_gather(const float* w, int rows, int cols, std::span<const int> row_order, std::span<const int> col_order,
                 std::vector<float>& out) {
  out.resize(size_t(rows) * cols);
  for (int r = 0; r < rows; ++r) {
    const float* from = w + size_t(row_order.empty() ? r : row_order[size_t(r)]) * cols;
    float* to = out.data() + size_t(r) * cols;
    if (col_order.empty())
      std::copy_n(from, cols, to);
    else
      for (int j = 0; j < cols; ++j) to[j] = from[col_order[size_t(j)]];
  }
}

void atom_scatter(const float* ordered, int rows, int cols, std::span<const int> row_order,
                  std::span<const int> col_order, float* w) {
  for (int r = 0; r < rows; ++r) {
    const float* from = ordered + size_t(r) * cols;
    float* to = w + size_t(row_order.empty() ? r : row_order[size_t(r)]) * cols;
    if (col_order.empty())
      std::copy_n(from, cols, to);
    else
      for (int j = 0; j < cols; ++j) to[col_order[size_t(j)]] = from[j];
  }
}

std::vector<int> atom_row_order(const ModelConfig& m, const AtomReorder& reorder, int layer, Matrix mat) {
  if (mat == Matrix::Gate || mat == Matrix::Up) return reorder.of(layer, MatrixInput::MlpHidden);
  std::vector<int> order;
  // llama.cpp reorders q's and k's rows for its interleaved RoPE: GGUF row h d + 2 i + j = HF row h d + j d / 2 + i.
  if ((mat == Matrix::Q || mat == Matrix::K) && m.rope_layout == RopeLayout::Interleaved) {
    const int d = m.head_dim, rows = (mat == Matrix::Q ? m.n_heads : m.n_kv_heads) * d;
    for (int hf = 0; hf < rows; ++hf) order.push_back(hf / d * d + 2 * (hf % d % (d / 2)) + hf % d / (d / 2));
  }
  return order;
}

void atom_quantize_rows_in_order(float* x, int n, int cols, const std::vector<int>& perm, const AtomQuant& q,
                                 std::vector<float>& scratch) {
  if (perm.empty()) return atom_quantize_rows(x, n, cols, q);
  atom_gather(x, n, cols, {}, perm, scratch);
  atom_quantize_rows(scratch.data(), n, cols, q);
  atom_scatter(scratch.data(), n, cols, {}, perm, x);
}

void atom_quantize_weight_in_order(float* w, int rows, int cols, std::span<const int> row_order,
                                   std::span<const int> col_order, const AtomQuant& q) {
  std::vector<float> p;
  atom_gather(w, rows, cols, row_order, col_order, p);
  atom_quantize_weight(p.data(), rows, cols, q);
  atom_scatter(p.data(), rows, cols, row_order, col_order, w);
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
constexpr const char* kGptqKind = "atom-gptq";
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

// A decoder matrix's rows (outputs) and columns (inputs).
std::pair<int, int> matrix_shape(const ModelConfig& m, Matrix mat) {
  const int rows = mat == Matrix::O || mat == Matrix::Down ? m.hidden
                   : mat == Matrix::Q                      ? m.n_heads * m.head_dim
                   : mat == Matrix::K || mat == Matrix::V  ? m.n_kv_heads * m.head_dim
                                                           : m.intermediate;
  return {rows, atom_site_width(m, input_of(mat))};
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
    const bool gptq = p.get("weights") == "gptq" && wbits < 16;
    if (!gptq && !p.get("gptq").empty())
      fail("method atom: gptq= is read only with weights=gptq and w_bits below 16 (weights is {}, w_bits {})",
           p.get("weights"), wbits);
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
      const int rows = matrix_shape(m, mat).first;
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
    if (gptq) {
      check_gptq();
      load_gptq();
      key_ += " gptq " + gptq_artifact_.digest;
    }
  }

  // What GPTQ needs besides: Quantizer_GPTQ applies the channel groups per row too, and some columns must be
  // left besides the keeper's.
  void check_gptq() const {
    const ModelConfig& m = model();
    for (Matrix mat : kMatrices) {
      const int rows = matrix_shape(m, mat).first;
      if (rows % weights_.channel_group != 0)
        fail(
            "method atom: weight_channel_group {} does not divide the {} rows of the {} matrices (GPTQ groups them "
            "per row too)",
            weights_.channel_group, rows, matrix_name(mat));
    }
    for (MatrixInput s : kAtomSites)
      if (weights_.keeper >= atom_site_width(m, s))
        fail("method atom: with GPTQ, keeper {} must leave columns of the {} channels of {} to quantize",
             weights_.keeper, atom_site_width(m, s), matrix_input_name(s));
  }

  nlohmann::json artifacts() const override {
    nlohmann::json a = nlohmann::json::object();
    if (!artifact_.path.empty()) a["index"] = {{"file", artifact_.path}, {"digest", artifact_.digest}};
    if (!gptq_artifact_.path.empty()) a["gptq"] = {{"file", gptq_artifact_.path}, {"digest", gptq_artifact_.digest}};
    return a.empty() ? nlohmann::json() : a;
  }

  // What GPTQ's weights depend on: every parameter but the files (the index by its digest) and GQA's layout.
  nlohmann::json gptq_settings() const {
    nlohmann::json s = nlohmann::json::object();
    for (const auto& [name, value] : params().values())
      if (name != "index" && name != "weights" && name != "gptq" && name != "gqa") s[name] = value;
    s["index"] = artifact_.path.empty() ? std::string("model order") : artifact_.digest;
    return s;
  }
  const AtomQuant& weight_quant() const { return weights_; }
  const AtomReorder& reorder() const { return reorder_; }

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
  // Rows sharing a scale are neighbours in Atom's order of them (atom_row_order).
  void weights(int layer, Matrix m, float* w, int rows, int cols) override {
    const std::vector<int> row_order = atom_row_order(model(), reorder_, layer, m);
    const std::vector<int>& perm = reorder_.of(layer, input_of(m));
    if (gptq_.empty()) return atom_quantize_weight_in_order(w, rows, cols, row_order, perm, weights_);
    const AtomGptqWeight& g = gptq_[size_t(layer)][size_t(m)];
    if (g.rows != rows || g.cols != cols)
      fail("{}: layer {} {} holds a {} x {} weight; the model's is {} x {}", gptq_path_, layer, matrix_name(m), g.rows,
           g.cols, rows, cols);
    std::vector<float> ordered(size_t(rows) * cols);
    g.dequantize(ordered.data());
    atom_scatter(ordered.data(), rows, cols, row_order, perm, w);
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
  // The GPTQ weights of the artifact (kvbench calibrate atom-gptq), made with this setting's parameters.
  void load_gptq() {
    const ModelConfig& m = model();
    gptq_artifact_ = load_artifact(kGptqKind, params().get("gptq"), m,
                                   "kvbench calibrate atom-gptq MODEL, with this setting's parameters as -o key=value");
    const std::string& path = gptq_artifact_.path;
    const nlohmann::json& header = gptq_artifact_.body.value("header", nlohmann::json());
    if (!gptq_artifact_.has_header || !header.contains("settings"))
      fail("{}: no header.settings; expected GPTQ weights written by kvbench calibrate atom-gptq", path);
    const nlohmann::json want = gptq_settings(), &got = header["settings"];
    if (got.value("index", "") != want["index"])
      fail(
          "{}: GPTQ weights made on the reorder index {}, but this setting runs {}; make them with kvbench calibrate "
          "atom-gptq MODEL -o index=FILE (this setting's index file) --out FILE and name FILE in the parameter gptq",
          path, got.value("index", std::string("(unset)")), want["index"].get<std::string>());
    for (const auto& [name, value] : want.items())
      if (!got.contains(name) || got[name] != value)
        fail(
            "{}: GPTQ weights made with {} = {}, but this setting has {}; make them for it with kvbench calibrate "
            "atom-gptq MODEL -o {}={} --out FILE and name FILE in the parameter gptq",
            path, name, got.contains(name) ? got[name].dump() : "(unset)", value.dump(), name,
            value.get<std::string>());
    const auto& layers = gptq_artifact_.body.value("layers", nlohmann::json());
    if (!layers.is_array() || layers.size() != size_t(m.n_layers))
      fail("{}: field 'layers' must be an array of the model's {} layers", path, m.n_layers);
    gptq_.resize(size_t(m.n_layers));
    for (int l = 0; l < m.n_layers; ++l)
      for (Matrix mat : kMatrices) {
        if (mat == Matrix::Gate && !m.gated_mlp) continue;
        const std::string where = fmt::format("{}: layers[{}].{}", path, l, matrix_name(mat));
        const auto& j = layers[size_t(l)].value(matrix_name(mat), nlohmann::json());
        const auto [rows, cols] = matrix_shape(m, mat);
        gptq_[size_t(l)][size_t(mat)] = atom_gptq_from_json(j, rows, cols, weights_, where);
      }
    gptq_path_ = path;
    gptq_artifact_.body = {};  // its codes are parsed; the text would double what the weights hold
  }

  AtomQuant weights_, acts_;
  LoadedArtifact gptq_artifact_;
  std::string gptq_path_;
  std::vector<std::array<AtomGptqWeight, 7>> gptq_;  // [layer][Matrix]
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
      ParamSpec::choice("weights", "rtn", {"rtn", "gptq"},
                        "weights rounded to nearest, or by GPTQ (Atom's --use_gptq; kvbench calibrate atom-gptq)")
          .added_later(),
      ParamSpec::text("gptq", "", "GPTQ weights (default: this model's from kvbench calibrate atom-gptq)")
          .added_later(),
  };
}

// ---------------------------------------------------------------------------------------------------
// GPTQ (Atom's quantize_model_gptq_llama): layer by layer, the Hessians of a layer's inputs are taken with
// the layers before it already quantized by GPTQ and every activation and the KV cache quantized as the
// method runs them, the layer's own weights as they are; then each of its matrices goes through GPTQ, and the
// layer runs again on its GPTQ weights to give the next layer's inputs. Like Atom's driver, each window's
// hidden states are kept between layers.

constexpr const char* kGptqPaperText =
    "Atom runs GPTQ on the 128 windows of 2,048 tokens of WikiText-2's training text it calibrates on";

class GptqPass final : public PrefillObserver, public LinearTransform {
 public:
  GptqPass(Atom& atom, const ModelFile& file)
      : atom_(atom), file_(file), m_(file.config()), done_(size_t(m_.n_layers)) {}

  // Layer l's pass taking its Hessians (the model's weights), or running it on its GPTQ weights.
  void begin(int l, bool quantized) {
    layer_ = l;
    quantized_ = quantized;
    if (quantized) return;
    for (MatrixInput s : kAtomSites) {
      const size_t w = size_t(atom_site_width(m_, s));
      hessians_[size_t(s)].assign(w * w, 0.0);
    }
  }
  // GPTQ of each of the layer's matrices on the Hessians of its pass.
  void quantize(double percdamp) {
    for (Matrix mat : kMatrices) {
      if (mat == Matrix::Gate && !m_.gated_mlp) continue;
      const std::vector<float> w = file_.load_f32(matrix_tensor(layer_, mat));
      const auto [rows, cols] = matrix_shape(m_, mat);
      const std::vector<int>& perm = atom_.reorder().of(layer_, input_of(mat));
      std::vector<float> ordered;
      atom_gather(w.data(), rows, cols, atom_row_order(m_, atom_.reorder(), layer_, mat), perm, ordered);
      const std::vector<double>& h = hessians_[size_t(input_of(mat))];
      std::vector<double> hp(size_t(cols) * cols);
      for (int i = 0; i < cols; ++i)
        for (int j = 0; j < cols; ++j) {
          const size_t a = size_t(perm.empty() ? i : perm[size_t(i)]), b = size_t(perm.empty() ? j : perm[size_t(j)]);
          hp[size_t(i) * cols + j] = h[std::min(a, b) * cols + std::max(a, b)];  // the upper triangle
        }
      done_[size_t(layer_)][size_t(mat)] =
          atom_gptq(std::move(ordered), rows, cols, std::move(hp), atom_.weight_quant(), percdamp);
    }
  }
  const AtomGptqWeight& done(int l, Matrix mat) const { return done_[size_t(l)][size_t(mat)]; }

  void on_layer(const PrefillView&, LayerCache&) override {}
  KvTransform* kv_transform() override { return atom_.kv_transform(); }
  LinearTransform* linear_transform() override { return this; }
  // The Hessians' pass runs the model's weights; the other, layer_'s GPTQ weights (the only layer it runs, and
  // the only one the engine copies).
  std::string weights_key() const override {
    return quantized_ ? fmt::format("atom-gptq run {}: layer {} quantized", run_, layer_) : "";
  }
  bool changes_layer(int l) const override { return l == layer_; }
  void weights(int l, Matrix mat, float* w, int rows, int cols) override {
    std::vector<float> ordered(size_t(rows) * cols);
    done_[size_t(l)][size_t(mat)].dequantize(ordered.data());
    atom_scatter(ordered.data(), rows, cols, atom_row_order(m_, atom_.reorder(), l, mat),
                 atom_.reorder().of(l, input_of(mat)), w);
  }
  // The quantized activations, as the method runs them; summed into the site's Hessian while taking them.
  void inputs(int l, MatrixInput site, float* x, int n, int cols) override {
    atom_.inputs(l, site, x, n, cols);
    if (quantized_ || l != layer_) return;
    block_.resize(size_t(cols) * cols);
    cblas_ssyrk(CblasRowMajor, CblasUpper, CblasTrans, cols, n, 1.0f, x, cols, 0.0f, block_.data(), cols);
    std::vector<double>& h = hessians_[size_t(site)];
    for (int i = 0; i < cols; ++i)
      for (int j = i; j < cols; ++j) h[size_t(i) * cols + j] += block_[size_t(i) * cols + j];
  }

 private:
  inline static int runs_ = 0;  // a key of its own per calibration, where an engine runs several
  const int run_ = runs_++;
  Atom& atom_;
  const ModelFile& file_;
  const ModelConfig& m_;
  int layer_ = 0;
  bool quantized_ = false;
  std::array<std::vector<double>, 4> hessians_;  // [MatrixInput], upper triangles, model channel order
  std::vector<std::array<AtomGptqWeight, 7>> done_;
  std::vector<float> block_;
};

// The step's options that are the method's parameters (all but the weights' own).
bool gptq_option(const std::string& name) { return name != "weights" && name != "gptq"; }

void calibrate_gptq(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  std::map<std::string, std::string> given;
  for (const ParamSpec& spec : method_params())
    if (gptq_option(spec.name) && !ctx.options.get(spec.name).empty()) given[spec.name] = ctx.options.get(spec.name);
  const std::unique_ptr<Method> method = MethodRegistry::get().create("atom", given, cfg);
  Atom& atom = dynamic_cast<Atom&>(*method);
  if (atom.weight_quant().bits >= 16) fail("kvbench calibrate atom-gptq: wbits 16 leaves the weights as they are");
  atom.check_gptq();
  const FitSequences fit = fit_sequences(ctx, "kvbench calibrate atom-gptq", kGptqPaperText);
  size_t total = 0;
  for (const auto& s : fit.seqs) total += s.size();
  const double percdamp = ctx.options.get_float("percdamp");
  GptqPass pass(atom, ctx.model);
  // Each layer runs twice over the text: for its Hessians, then on its GPTQ weights.
  Progress bar("atom gptq (layer-tokens)", 2 * total * size_t(cfg.n_layers), "tok");
  std::vector<std::vector<float>> states(fit.seqs.size());  // what enters the layer, per window
  std::vector<float> scratch;
  for (int l = 0; l < cfg.n_layers; ++l) {
    pass.begin(l, false);
    for (size_t i = 0; i < fit.seqs.size(); ++i) {
      scratch = states[i];
      ctx.engine.prefill_layers(fit.seqs[i], l, l + 1, scratch, &pass);
      bar.advance(fit.seqs[i].size());
    }
    pass.quantize(percdamp);
    pass.begin(l, true);
    for (size_t i = 0; i < fit.seqs.size(); ++i) {
      ctx.engine.prefill_layers(fit.seqs[i], l, l + 1, states[i], &pass);
      bar.advance(fit.seqs[i].size());
    }
  }
  bar.finish();
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < cfg.n_layers; ++l) {
    nlohmann::json layer = nlohmann::json::object();
    for (Matrix mat : kMatrices)
      if (mat != Matrix::Gate || cfg.gated_mlp) layer[matrix_name(mat)] = atom_gptq_to_json(pass.done(l, mat));
    layers.push_back(std::move(layer));
  }
  const std::string out = ctx.out.empty() ? default_artifact_path(kGptqKind, cfg) : ctx.out;
  nlohmann::json body = {{"layers", std::move(layers)}};
  body["header"] = artifact_header(kGptqKind, cfg, ctx.model.path());
  body["header"]["settings"] = atom.gptq_settings();
  body["header"]["calibration"] = {{"text", fit.described},  {"tokens", total},      {"sequences", fit.seqs.size()},
                                   {"seq_len", fit.seq_len}, {"percdamp", percdamp}, {"blocksize", 128}};
  write_artifact(out, body);
  fmt::print("wrote {} ({} tokens, {} layers)\n", out, total, cfg.n_layers);
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
                .run = calibrate},
               {.command = "calibrate",
                .name = "atom-gptq",
                .summary = "Atom's GPTQ weights for one setting of the method's parameters (needs the reorder index)",
                .options =
                    [] {
                      auto o = calibration_text_options();
                      for (ParamSpec& spec : o)
                        if (spec.name == "seq_len") spec.default_value = "2048";
                      o.push_back(ParamSpec::integer("tokens", 262144, 1, 1L << 40,
                                                     "calibration tokens (Atom: 128 x 2048 = 262,144)"));
                      o.push_back(id_sequences_option());
                      o.push_back(ParamSpec::real("percdamp", 0.01, 0.0, 1.0,
                                                  "damping, a share of the Hessian's mean diagonal (Atom's 0.01)"));
                      for (const ParamSpec& spec : method_params())
                        if (gptq_option(spec.name)) o.push_back(spec);
                      return o;
                    }(),
                .run = calibrate_gptq}},
     .budgeted = false,
     .changes_model = true});

}  // namespace
}  // namespace kvb
