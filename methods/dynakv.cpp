// DynaKV (spec/methods-a.md 2): learned token-adaptive channel truncation of K and V. The learned maps
// (harness/method/dynakv.*) change the model: every layer's pre-RoPE keys and values of all KV heads
// are rotated into a basis, a gate picks each token's width, and only the leading coordinates are
// cached. This file holds the method's offline steps:
//   kvbench calibrate dynakv-pca MODEL [--text FILES]   the PCA basis (uncentred second moment, fp64)
//   kvbench train dynakv MODEL --alpha A [--mode e2e|ll] [--steps N]   the maps, from that basis
// The default text is the Python documentation's prose set-up fetches (data/python-docs); every
// tenth document is held out for validation and never trained or calibrated on.
#include <cblas.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>

#include "harness/engine/engine.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/dynakv.hpp"
#include "harness/method/dynakv_train.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/linalg.hpp"
#include "harness/util/progress.hpp"
#include "harness/util/text_files.hpp"

namespace kvb {
namespace {

constexpr int kHeldOutEvery = 10;

// The documents of `text` (or set-up's Python documentation), split into fitting and held-out ones.
struct Documents {
  SplitDocuments split;
  std::string described;
};

Documents read_documents(const std::string& spec, const std::string& data_dir, const std::string& command) {
  Documents d;
  std::vector<std::string> all;
  if (!spec.empty()) {
    d.described = spec;
    all = read_text_files(spec, "text");
  } else {
    const auto dir = std::filesystem::path(data_dir) / "python-docs";
    if (!std::filesystem::is_directory(dir))
      fail("{}: no --text given and {} is missing (scripts/setup.sh fetches it)", command, dir.string());
    d.described = "the Python 3 documentation's tutorial, HOWTOs, FAQ and What's New pages (" + dir.string() +
                  ", PSF License); the paper uses RedPajama-V2 and reports rates on WikiText-2";
    all = read_text_files(dir.string(), "text");
  }
  d.split = split_held_out(all, kHeldOutEvery, command, "give more files");
  return d;
}

// Accumulates X^T X of every layer's pre-RoPE K and V rows (all KV heads jointly) in double.
class MomentTap final : public PrefillObserver {
 public:
  MomentTap(int layers, int d) : d_(d), moments_(size_t(layers)) {
    for (auto& m : moments_)
      for (auto& z : m) z.assign(size_t(d) * d, 0.0);
  }
  PrefillNeeds needs() const override { return {0, true, false}; }
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
  DynaKvPca solve() const {
    DynaKvPca pca;
    pca.d = d_;
    for (const auto& m : moments_) {
      auto& basis = pca.basis.emplace_back();
      auto& vals = pca.eigenvalues.emplace_back();
      for (int z = 0; z < 2; ++z) {
        std::vector<double> a = m[size_t(z)], vecs;
        for (double& x : a) x /= double(tokens_);
        symmetric_eigen(std::move(a), d_, vals[size_t(z)], vecs);
        basis[size_t(z)].assign(vecs.begin(), vecs.end());
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

void calibrate_pca(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const Params& o = ctx.options;
  const Documents docs = read_documents(o.get("text"), ctx.data_dir, "kvbench calibrate dynakv-pca");
  const auto seqs = token_sequences(ctx.tokenizer, docs.split.fit, static_cast<int>(o.get_int("seq_len")),
                                    static_cast<size_t>(o.get_int("tokens")));
  size_t total = 0;
  for (const auto& s : seqs) total += s.size();
  const int d = cfg.n_kv_heads * cfg.head_dim;
  MomentTap tap(cfg.n_layers, d);
  Progress bar("dynakv pca", total, "tok");
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : seqs) {
    ctx.engine.prefill(s, &tap);
    bar.advance(s.size());
  }
  bar.finish();
  const DynaKvPca pca = tap.solve();
  const std::string out = ctx.out.empty() ? default_artifact_path(kDynaKvPcaKind, cfg) : ctx.out;
  nlohmann::json body = dynakv_pca_json(pca);
  body["header"] = artifact_header(kDynaKvPcaKind, cfg, ctx.model.path());
  body["header"]["calibration"] = {
      {"text", docs.described},
      {"tokens", tap.tokens()},
      {"sequences", seqs.size()},
      {"seq_len", o.get_int("seq_len")},
      {"moment", "uncentred E[x x^T] of pre-RoPE K and of V, all KV heads jointly, fp64"},
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
  t.steps = static_cast<int>(o.get_int("steps"));
  t.batch = static_cast<int>(o.get_int("batch"));
  t.seq_len = static_cast<int>(o.get_int("seq_len"));
  t.lr = o.get_float("lr");
  t.lr_basis = o.get_float("lr_basis");
  t.weight_decay = o.get_float("weight_decay");
  t.clip = o.get_float("clip");
  const std::string basis = o.get("train_basis");
  t.train_basis = basis == "auto" ? t.mode == "e2e" : basis == "true";
  t.init_rate = o.get_float("init_rate");
  t.tau = o.get_float("tau");
  t.checkpoint_every = static_cast<int>(o.get_int("checkpoint_every"));
  t.progress = ctx.progress;

  const LoadedArtifact pa = load_artifact(kDynaKvPcaKind, o.get("pca"), cfg, "kvbench calibrate dynakv-pca MODEL");
  DynaKvWeights weights = dynakv_init(dynakv_pca_from(pa, cfg), t.init_rate, t.tau);
  const Documents docs = read_documents(o.get("text"), ctx.data_dir, "kvbench train dynakv");
  const auto fit = token_sequences(ctx.tokenizer, docs.split.fit, t.seq_len, size_t(t.steps) * t.batch * t.seq_len);
  const auto held = token_sequences(ctx.tokenizer, docs.split.held, t.seq_len, static_cast<size_t>(o.get_int("held_tokens")));
  if (held.empty()) fail("kvbench train dynakv: the held-out documents give no sequence of {} tokens", t.seq_len);

  const std::string out =
      !ctx.out.empty() ? ctx.out
                       : (std::filesystem::path(artifacts_dir()) / kDynaKvKind /
                          fmt::format("{}.{}-a{:g}.json", cfg.fingerprint, t.mode, t.alpha))
                             .string();
  ModelGradients mg(ctx.model);
  nlohmann::json training = train_dynakv(mg, weights, t, fit, held, out + ".ckpt");
  training["text"] = docs.described;
  training["pca"] = {{"file", pa.path}, {"digest", pa.digest}};
  nlohmann::json body = dynakv_weights_json(weights);
  body["header"] = artifact_header(kDynaKvKind, cfg, ctx.model.path());
  body["header"]["training"] = training;
  write_artifact(out, body);
  const auto& v = training["validation"];
  fmt::print("wrote {}\n  held-out ({} tokens): hard retain rate {:.4f}, soft {:.4f}; perplexity {:.3f} (full cache "
             "{:.3f}); {} training tokens in {:.0f} s\n",
             out, v["tokens"].get<size_t>(), v["hard_rate"].get<double>(), v["soft_rate"].get<double>(),
             v["ppl_hard"].get<double>(), v["ppl_full"].get<double>(), training["train_tokens"].get<size_t>(),
             training["seconds"].get<double>());
}

std::vector<ParamSpec> text_options() {
  return {ParamSpec::text("text", "", "text files or directories (default: set-up's data/python-docs)"),
          ParamSpec::integer("seq_len", 512, 16, 1 << 20, "tokens per sequence (BOS + text)")};
}

std::vector<ParamSpec> pca_options() {
  auto p = text_options();
  p.push_back(ParamSpec::integer("tokens", 262144, 1, 1L << 40, "calibration tokens (the spec recommends >= 1M)"));
  return p;
}

std::vector<ParamSpec> train_options() {
  auto p = text_options();
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

const bool pca_registered = register_offline_step(
    {"calibrate", "dynakv-pca", "DynaKV's PCA basis per layer, K and V (uncentred second moment, fp64)", pca_options(),
     calibrate_pca});
const bool train_registered = register_offline_step(
    {"train", "dynakv", "DynaKV's maps (U, W, b per layer, K and V) from the PCA basis, base model frozen",
     train_options(), train});

}  // namespace
}  // namespace kvb
