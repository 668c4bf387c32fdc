// KVQuant (Hooper et al. 2024, arXiv:2401.18079; SqueezeAILab/KVQuant) as KVmix's Tables 2-3 compare
// against it ("KVQuant-3bit-1%": the reference's nuq3 with 1% dense-and-sparse outliers): keys quantized
// per channel before RoPE against calibrated thresholds, values per token against thresholds of their
// own row, each to a Fisher-weighted non-uniform codebook, values beyond the thresholds kept in fp16.
// This file holds the method, its cache and its offline step:
//   kvbench calibrate kvquant MODEL [--bits 3] [--outliers 0.01] [--text FILES]
#include "methods/kvquant/kvquant.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "harness/engine/engine.hpp"
#include "harness/engine/gradients.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/base64.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"
#include "kernels/cpu/fp16.hpp"

namespace kvb {

// ---------------------------------------------------------------------------------------------------
// The artifact

namespace {

std::string artifact_kind(int bits) { return fmt::format("kvquant-nuq{}", bits); }

}  // namespace

nlohmann::json kvquant_json(const KvquantQuantizers& q) {
  nlohmann::json layers = nlohmann::json::array();
  for (const KvquantLayer& l : q.layers) {
    std::vector<float> upper, lower;
    for (size_t c = 0; c < l.k_upper.size(); ++c) {
      upper.push_back(half_to_float(l.k_upper[c]));
      lower.push_back(half_to_float(l.k_lower[c]));
    }
    layers.push_back({{"k_upper", floats_to_base64(upper)},
                      {"k_lower", floats_to_base64(lower)},
                      {"k_codebook", floats_to_base64(l.k_codebook)},
                      {"v_codebook", floats_to_base64(l.v_codebook)}});
  }
  return {{"bits", q.bits}, {"outliers", q.outliers}, {"layers", layers}};
}

KvquantQuantizers kvquant_from_json(const nlohmann::json& body, const ModelConfig& model, const std::string& where) {
  KvquantQuantizers q;
  if (!body.contains("bits") || !body["bits"].is_number_integer() || !body.contains("outliers") ||
      !body["outliers"].is_number() || !body.contains("layers") || !body["layers"].is_array())
    fail("{}: expected fields bits (integer), outliers (number) and layers (array)", where);
  q.bits = body["bits"].get<int>();
  q.outliers = body["outliers"].get<double>();
  if (q.bits < 2 || q.bits > 8) fail("{}: field bits = {}, expected 2 to 8", where, q.bits);
  if (body["layers"].size() != size_t(model.n_layers))
    fail("{}: field layers has {} entries, the model has {} layers", where, body["layers"].size(), model.n_layers);
  const size_t channels = size_t(model.n_kv_heads) * size_t(model.head_dim), levels = size_t(1) << q.bits;
  for (size_t l = 0; l < size_t(model.n_layers); ++l) {
    const auto& j = body["layers"][l];
    const std::string at = fmt::format("{} layers[{}]", where, l);
    KvquantLayer& layer = q.layers.emplace_back();
    for (float x : artifact_floats(j, "k_upper", channels, at)) layer.k_upper.push_back(float_to_half(x));
    for (float x : artifact_floats(j, "k_lower", channels, at)) layer.k_lower.push_back(float_to_half(x));
    layer.k_codebook = artifact_floats(j, "k_codebook", levels, at);
    layer.v_codebook = artifact_floats(j, "v_codebook", levels, at);
    for (const auto* cb : {&layer.k_codebook, &layer.v_codebook})
      if (!std::is_sorted(cb->begin(), cb->end())) fail("{}: a codebook is not ascending", at);
  }
  return q;
}

// ---------------------------------------------------------------------------------------------------
// The cache

KvquantSegment::KvquantSegment(std::shared_ptr<const KvquantLayer> q, std::shared_ptr<const KvquantBatch> batch,
                               int bits, double outliers, int head_dim, int first)
    : RowSegment(head_dim, KvDtype::F32),
      q_(std::move(q)),
      batch_(std::move(batch)),
      bits_(bits),
      d_(head_dim),
      first_(first),
      share_(outliers),
      row_bytes_(size_t(head_dim * bits + 7) / 8) {}

std::string KvquantSegment::format() const { return fmt::format("kvquant(nuq{},{:g}%)", bits_, share_ * 100); }

size_t KvquantSegment::bytes() const {
  const size_t outlier = sizeof(int32_t) + sizeof(uint16_t);
  return k_codes_.size() + v_codes_.size() + outliers() * outlier + 2 * size() * sizeof(uint32_t) +
         size() * 2 * sizeof(float);
}

void KvquantSegment::pack(const KvquantRow& row, std::vector<uint8_t>& codes, std::vector<KvquantOutlier>& out,
                          std::vector<uint32_t>& starts) const {
  const size_t at = codes.size();
  codes.resize(at + row_bytes_, 0);
  for (int i = 0; i < d_; ++i) {
    const unsigned code = row.codes[size_t(first_ + i)];
    for (int b = 0; b < bits_; ++b)
      if (code >> b & 1u) {
        const size_t bit = size_t(i) * size_t(bits_) + size_t(b);
        codes[at + bit / 8] |= uint8_t(1u << (bit % 8));
      }
  }
  for (const KvquantOutlier& o : row.outliers)
    if (o.channel >= first_ && o.channel < first_ + d_) out.push_back({o.channel - first_, o.value});
  starts.push_back(uint32_t(out.size()));
}

KvquantRow KvquantSegment::unpack(const std::vector<uint8_t>& codes, const std::vector<KvquantOutlier>& out,
                                  const std::vector<uint32_t>& starts, size_t t) const {
  KvquantRow row;
  row.codes.assign(size_t(first_ + d_), 0);
  for (int i = 0; i < d_; ++i) {
    unsigned code = 0;
    for (int b = 0; b < bits_; ++b) {
      const size_t bit = size_t(i) * size_t(bits_) + size_t(b);
      code |= unsigned(codes[t * row_bytes_ + bit / 8] >> (bit % 8) & 1u) << b;
    }
    row.codes[size_t(first_ + i)] = uint8_t(code);
  }
  for (size_t o = starts[t]; o < starts[t + 1]; ++o) row.outliers.push_back({out[o].channel + first_, out[o].value});
  return row;
}

bool KvquantSegment::append_token(const float* k, const float* v, int32_t pos) {
  const auto& b = *batch_;
  const auto it = std::find(b.positions.rbegin(), b.positions.rend(), pos);
  if (it == b.positions.rend())
    fail("kvquant: position {} entered the cache without passing the method's quantizer", pos);
  const size_t i = size_t(b.positions.rend() - it) - 1;
  pack(b.k[i], k_codes_, k_out_, k_starts_);
  pack(b.v[i], v_codes_, v_out_, v_starts_);
  v_offset_.push_back(b.v[i].offset);
  v_range_.push_back(b.v[i].range);
  k_.append(k);
  v_.append(v);
  pos_.push_back(pos);
  return true;
}

void KvquantSegment::decode(size_t t, float* k_pre_rope, float* v) const {
  kvquant_decode_keys(*q_, unpack(k_codes_, k_out_, k_starts_, t), first_, d_, k_pre_rope);
  KvquantRow row = unpack(v_codes_, v_out_, v_starts_, t);
  row.offset = v_offset_[t];
  row.range = v_range_[t];
  kvquant_decode_values(*q_, row, first_, d_, v);
}

namespace {

// ---------------------------------------------------------------------------------------------------
// Calibration: pre-RoPE key thresholds from a forward pass, then the Fisher information (squared
// gradients of the loss at the keys and values) from kvbench's backward pass, binned by normalised value
// for the weighted k-means.

constexpr const char* kPaperText =
    "the reference calibrates on 16 sequences of 2,048 tokens of WikiText-2 (Fisher "
    "information from C4)";

// Every layer's pre-RoPE keys of the calibration sequences, fp16 as the reference's fp16 model gives them.
class KeyTap final : public PrefillObserver {
 public:
  explicit KeyTap(int layers) : keys_(size_t(layers)) {}
  PrefillNeeds needs() const override { return {.k_pre_rope = true}; }
  void on_layer(const PrefillView& v, LayerCache&) override {
    const size_t n = size_t(v.n_tokens) * size_t(v.n_kv_heads) * size_t(v.head_dim);
    auto& out = keys_[size_t(v.layer)];
    for (size_t i = 0; i < n; ++i) out.push_back(float_to_half(v.k_pre_rope[i]));
  }
  // Per channel of layer l, the percentiles at p and 1 - p of numpy (linear) over every token.
  void thresholds(int l, int channels, double p, std::vector<double>& upper, std::vector<double>& lower) const {
    const auto& k = keys_[size_t(l)];
    const size_t n = k.size() / size_t(channels);
    std::vector<float> column(n);
    upper.assign(size_t(channels), 0.0);
    lower.assign(size_t(channels), 0.0);
    for (int c = 0; c < channels; ++c) {
      for (size_t t = 0; t < n; ++t) column[t] = half_to_float(k[t * size_t(channels) + size_t(c)]);
      std::sort(column.begin(), column.end());
      upper[size_t(c)] = percentile_sorted(column, p * 100.0 / 100.0);
      lower[size_t(c)] = percentile_sorted(column, (1.0 - p) * 100.0 / 100.0);
    }
  }

 private:
  std::vector<std::vector<uint16_t>> keys_;
};

// An identity hook whose backward bins each non-outlier's normalised value by its squared gradient.
class FisherHook final : public KvTrainHook {
 public:
  FisherHook(std::vector<std::vector<double>> k_upper, std::vector<std::vector<double>> k_lower, double p)
      : k_upper_(std::move(k_upper)), k_lower_(std::move(k_lower)), p_(p), k_(k_upper_.size()), v_(k_upper_.size()) {}
  void forward(int layer, int n, float* k, float* v, bool) override {
    const size_t size = size_t(n) * k_upper_[0].size();
    layer_ = layer;
    keys_.assign(k, k + size);
    values_.assign(v, v + size);
  }
  void backward(int layer, int n, float* dk, float* dv) override {
    if (layer != layer_) fail("kvquant calibration: the backward of layer {} follows the forward of {}", layer, layer_);
    const size_t channels = k_upper_[0].size();
    const auto& hi = k_upper_[size_t(layer)];
    const auto& lo = k_lower_[size_t(layer)];
    std::vector<float> sorted(channels);
    for (size_t t = 0; t < size_t(n); ++t) {
      const float* k = keys_.data() + t * channels;
      const float* v = values_.data() + t * channels;
      for (size_t c = 0; c < channels; ++c) {
        const double x = (double(kvquant_fp16(k[c])) - (hi[c] + lo[c]) / 2) / ((hi[c] - lo[c]) / 2);
        if (std::abs(x) <= 1) k_[size_t(layer)].add(float(x), double(dk[t * channels + c]) * dk[t * channels + c]);
      }
      // Values: the reference's thresholds are per token, over the layer's row.
      for (size_t c = 0; c < channels; ++c) sorted[c] = kvquant_fp16(v[c]);
      std::sort(sorted.begin(), sorted.end());
      const double up = percentile_sorted(sorted, p_ * 100.0 / 100.0);
      const double down = percentile_sorted(sorted, (1.0 - p_) * 100.0 / 100.0);
      for (size_t c = 0; c < channels; ++c) {
        const double x = (double(kvquant_fp16(v[c])) - (up + down) / 2) / ((up - down) / 2);
        if (std::abs(x) <= 1) v_[size_t(layer)].add(float(x), double(dv[t * channels + c]) * dv[t * channels + c]);
      }
    }
  }
  const WeightedHistogram& keys(int l) const { return k_[size_t(l)]; }
  const WeightedHistogram& values(int l) const { return v_[size_t(l)]; }

 private:
  std::vector<std::vector<double>> k_upper_, k_lower_;
  double p_;
  std::vector<WeightedHistogram> k_, v_;
  std::vector<float> keys_, values_;
  int layer_ = -1;
};

std::vector<float> codebook(const WeightedHistogram& h, int bits, uint64_t seed, const std::string& what) {
  std::vector<double> x, w;
  h.points(x, w);
  if (x.size() < (size_t(1) << bits))
    fail(
        "kvquant calibration: {} has {} distinct weighted values, fewer than the {} signposts; calibrate on more "
        "text",
        what, x.size(), 1 << bits);
  const std::vector<double> c = weighted_kmeans_1d(x, w, 1 << bits, seed);
  return {c.begin(), c.end()};
}

void calibrate(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const Params& o = ctx.options;
  const int bits = o.integer("bits");
  const double share = o.get_float("outliers");
  const CalibrationText docs = calibration_text(o.get("text"), ctx.data_dir, "kvbench calibrate kvquant", kPaperText);
  const int len = o.integer("seq_len");
  const auto seqs = token_sequences(ctx.tokenizer, docs.split.fit, len, size_t(o.get_int("samples")) * size_t(len),
                                    "kvbench calibrate kvquant: samples x seq_len");
  if (seqs.empty()) fail("kvquant calibration: the text gives no sequence of {} tokens", len);
  size_t total = 0;
  for (const auto& s : seqs) total += s.size();
  const auto t0 = std::chrono::steady_clock::now();
  const double p = kvquant_upper_fraction(share);
  const int channels = cfg.n_kv_heads * cfg.head_dim;

  // Pass 1: the keys' per-channel thresholds over all calibration tokens.
  std::vector<std::vector<double>> upper(size_t(cfg.n_layers)), lower(size_t(cfg.n_layers));
  {
    KeyTap tap(cfg.n_layers);
    Progress bar("kvquant keys", total, "tok");
    for (const auto& s : seqs) {
      ctx.engine.prefill(s, &tap);
      bar.advance(s.size());
    }
    bar.finish();
    for (int l = 0; l < cfg.n_layers; ++l) tap.thresholds(l, channels, p, upper[size_t(l)], lower[size_t(l)]);
  }
  KvquantQuantizers q{.bits = bits, .outliers = share, .layers = {}};
  for (int l = 0; l < cfg.n_layers; ++l) {
    KvquantLayer& layer = q.layers.emplace_back();
    for (int c = 0; c < channels; ++c) {
      layer.k_upper.push_back(float_to_half(float(upper[size_t(l)][size_t(c)])));
      layer.k_lower.push_back(float_to_half(float(lower[size_t(l)][size_t(c)])));
    }
  }
  // Pass 2: Fisher-weighted histograms from the backward pass, then the codebooks.
  FisherHook hook(upper, lower, p);
  ModelGradients mg(ctx.model);
  {
    Progress bar("kvquant fisher", total, "tok");
    for (const auto& s : seqs) {
      mg.compute(s, {}, &hook);
      bar.advance(s.size());
    }
    bar.finish();
  }
  const auto seed = static_cast<uint64_t>(o.get_int("seed"));
  for (int l = 0; l < cfg.n_layers; ++l) {
    auto& layer = q.layers[size_t(l)];
    layer.k_codebook = codebook(hook.keys(l), bits, seed, fmt::format("layer {} keys", l));
    layer.v_codebook = codebook(hook.values(l), bits, seed, fmt::format("layer {} values", l));
  }
  const std::string out = ctx.out.empty() ? default_artifact_path(artifact_kind(bits), cfg) : ctx.out;
  nlohmann::json body = kvquant_json(q);
  body["header"] = artifact_header(artifact_kind(bits), cfg, ctx.model.path());
  body["header"]["calibration"] = {
      {"text", docs.described},
      {"tokens", total},
      {"sequences", seqs.size()},
      {"seq_len", len},
      {"fisher", "squared gradients of the mean next-token cross-entropy at pre-RoPE keys and values, fp32"},
      {"kmeans", "weighted Lloyd from k-means++ over 65,536 bins of the normalised non-outliers, 50 iterations"},
      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
  write_artifact(out, body);
  fmt::print("wrote {} ({} tokens, {} layers, nuq{} with {:g}% outliers)\n", out, total, cfg.n_layers, bits,
             share * 100);
}

std::vector<ParamSpec> calibrate_options() {
  return {calibration_text_options()[0],
          ParamSpec::integer("seq_len", 2048, 16, 1 << 20, "tokens per sequence (the reference: 2,048)"),
          ParamSpec::integer("samples", 16, 1, 1 << 20, "calibration sequences (the reference: 16)"),
          ParamSpec::integer("bits", 3, 2, 4, "bits per code (2^bits signposts)"),
          ParamSpec::real("outliers", 0.01, 0.0, 0.5, "share of values kept in fp16 (the paper's 1%)"),
          ParamSpec::integer("seed", 0, 0, 1L << 62, "seed of the k-means++ seeding")};
}

// ---------------------------------------------------------------------------------------------------
// Inference

class Kvquant final : public Method, public KvTransform {
 public:
  void setup() override {
    const ModelConfig& m = model();
    bits_ = std::stoi(params().get("bits"));
    share_ = params().get_float("outliers");
    const LoadedArtifact a = load_artifact(artifact_kind(bits_), params().get("quantizers"), m,
                                           fmt::format("kvbench calibrate kvquant MODEL -o bits={}", bits_));
    const KvquantQuantizers q = kvquant_from_json(a.body, m, a.path);
    if (q.bits != bits_ || std::abs(q.outliers - share_) > 1e-12)
      fail("{}: quantizers for nuq{} with {:g}% outliers (fields bits, outliers), the run asks for nuq{} with {:g}%",
           a.path, q.bits, q.outliers * 100, bits_, share_ * 100);
    layers_.clear();
    batches_.clear();
    for (const KvquantLayer& l : q.layers) {
      layers_.push_back(std::make_shared<const KvquantLayer>(l));
      batches_.push_back(std::make_shared<KvquantBatch>());
    }
    artifacts_ = {{"quantizers", {{"file", a.path}, {"digest", a.digest}}}};
  }
  KvTransform* kv_transform() override { return this; }
  bool keeps_sequence_state() const override { return true; }  // batches_: the codes apply() made, for the cache
  nlohmann::json artifacts() const override { return artifacts_; }

  // What attention reads, in prefill and decode alike: every token's pre-RoPE keys and values
  // quantized and read back, as the reference's k_proj and v_proj outputs.
  void apply(int layer, int n, const int32_t* pos, float* k, float* v) override {
    const int channels = model().n_kv_heads * model().head_dim;
    KvquantBatch& b = *batches_[size_t(layer)];
    b.positions.assign(pos, pos + n);
    b.k.resize(size_t(n));
    b.v.resize(size_t(n));
    const KvquantLayer& q = *layers_[size_t(layer)];
#pragma omp parallel for schedule(static)
    for (int t = 0; t < n; ++t) {
      float* kt = k + size_t(t) * size_t(channels);
      float* vt = v + size_t(t) * size_t(channels);
      kvquant_keys(q, kt, channels, kt, &b.k[size_t(t)]);
      kvquant_values(q, share_, vt, channels, vt, &b.v[size_t(t)]);
    }
  }

  LayerCache compress(const PrefillView& view, const Budget&) override {
    const int hkv = view.n_kv_heads, d = view.head_dim, stored = stored_heads(), group = stored / hkv;
    LayerCache cache(view.n_heads, stored, d);
    const size_t stride = size_t(hkv) * size_t(d);
    size_t outliers = 0;
    for (int s = 0; s < stored; ++s) {
      const int g = s / group;
      auto seg = std::make_unique<KvquantSegment>(layers_[size_t(view.layer)], batches_[size_t(view.layer)], bits_,
                                                  share_, d, g * d);
      for (int t = 0; t < view.n_tokens; ++t)
        seg->append_token(view.k + size_t(t) * stride + size_t(g) * size_t(d),
                          view.v + size_t(t) * stride + size_t(g) * size_t(d), view.positions[t]);
      if (s % group == 0) outliers += seg->outliers();
      cache.segments(s).push_back(std::move(seg));
    }
    stats_ = {{"layer", view.layer},
              {"tokens", view.n_tokens},
              {"outlier_share", double(outliers) / (2.0 * double(view.n_tokens) * double(stride))}};
    return cache;
  }
  nlohmann::json layer_stats() const override { return stats_; }

 private:
  int bits_ = 3;
  double share_ = 0.01;
  std::vector<std::shared_ptr<const KvquantLayer>> layers_;
  std::vector<std::shared_ptr<KvquantBatch>> batches_;
  nlohmann::json artifacts_, stats_;
};

const bool registered = register_method(
    {.name = "kvquant",
     .summary = "non-uniform Fisher-weighted codebooks, keys per channel before RoPE and values per token, 1% "
                "outliers in fp16 (KVQuant, Hooper et al. 2024)",
     .params = {ParamSpec::choice("bits", "3", {"2", "3", "4"}, "bits per code (KVmix's row: 3)"),
                ParamSpec::real("outliers", 0.01, 0.0, 0.5, "share of values kept in fp16 (the calibration's)"),
                ParamSpec::text("quantizers", "",
                                "artifact of kvbench calibrate kvquant (default: this model's for `bits`)")},
     .make = [] { return std::make_unique<Kvquant>(); },
     .steps = {{.command = "calibrate",
                .summary = "key thresholds, then Fisher-weighted k-means codebooks from the backward pass",
                .options = calibrate_options(),
                .run = calibrate}},
     .budgeted = false,
     .changes_model = true});

}  // namespace
}  // namespace kvb
