// MatryoshkaKV (Lin et al. 2024, arXiv:2410.14731; The-kamisato/MatryoshkaKV-cache) as DynaKV's
// Tables 1-4 compare against it (README.md): per layer and KV head, trained orthogonal projections of
// the post-RoPE keys and of the values, of which a run keeps the first r coordinates. This file holds
// the method and its offline steps:
//   kvbench calibrate matryoshkakv-pca MODEL [--text FILES]   per-head PCA of post-RoPE K and of V
//   kvbench train matryoshkakv MODEL [--steps N]               the projections, by distillation
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "harness/cache/lowrank_segment.hpp"
#include "harness/engine/engine.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/error.hpp"
#include "harness/util/linalg.hpp"
#include "harness/util/progress.hpp"
#include "methods/matryoshkakv/maps.hpp"
#include "methods/matryoshkakv/train.hpp"

namespace kvb {
namespace {

// Sums and second moments of every layer's post-RoPE keys and values, per KV head, in double.
class CovarianceTap final : public PrefillObserver {
 public:
  CovarianceTap(int layers, int heads, int d) : d_(d), sums_(size_t(layers)) {
    for (auto& l : sums_) {
      l.resize(size_t(heads));
      for (auto& h : l)
        for (auto& z : h) {
          z.first.assign(size_t(d), 0.0);
          z.second.assign(size_t(d) * d, 0.0);
        }
    }
  }
  void on_layer(const PrefillView& v, LayerCache&) override {
    const int stride = v.n_kv_heads * d_;
    for (int h = 0; h < v.n_kv_heads; ++h)
      for (int z = 0; z < 2; ++z) {
        auto& [sum, moment] = sums_[size_t(v.layer)][size_t(h)][size_t(z)];
        const float* x = (z == 0 ? v.k : v.v) + size_t(h) * d_;
        for (int t = 0; t < v.n_tokens; ++t) {
          const float* row = x + size_t(t) * stride;
          for (int i = 0; i < d_; ++i) {
            sum[size_t(i)] += row[i];
            for (int j = i; j < d_; ++j) moment[size_t(i) * d_ + j] += double(row[i]) * row[j];
          }
        }
      }
    if (v.layer == 0) tokens_ += size_t(v.n_tokens);
  }
  // The reference's statistics: covariance E[x x^T] - mu mu^T, eigenvectors by descending eigenvalue.
  MatryoshkaPca solve() const {
    MatryoshkaPca pca;
    pca.head_dim = d_;
    const double n = double(std::max<size_t>(tokens_, 1));
    for (const auto& l : sums_) {
      auto& heads = pca.layers.emplace_back();
      for (const auto& h : l) {
        auto& e = heads.emplace_back();
        for (int z = 0; z < 2; ++z) {
          const auto& [sum, moment] = h[size_t(z)];
          std::vector<double> mu(static_cast<size_t>(d_)), cov(static_cast<size_t>(d_) * d_), vecs;
          for (int i = 0; i < d_; ++i) mu[size_t(i)] = sum[size_t(i)] / n;
          for (int i = 0; i < d_; ++i)
            for (int j = i; j < d_; ++j)
              cov[size_t(i) * d_ + j] = moment[size_t(i) * d_ + j] / n - mu[size_t(i)] * mu[size_t(j)];
          symmetric_eigen(std::move(cov), d_, e[size_t(z)].eigenvalues, vecs);
          e[size_t(z)].basis.assign(vecs.begin(), vecs.end());
          e[size_t(z)].mean.assign(mu.begin(), mu.end());
        }
      }
    }
    return pca;
  }
  size_t tokens() const { return tokens_; }

 private:
  int d_;
  std::vector<std::vector<std::array<std::pair<std::vector<double>, std::vector<double>>, 2>>> sums_;
  size_t tokens_ = 0;
};

constexpr const char* kPaperText = "the reference fits the PCA on Alpaca and trains on a RedPajama sample";

void calibrate_pca(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const Params& o = ctx.options;
  const CalibrationText docs =
      calibration_text(o.get("text"), ctx.data_dir, "kvbench calibrate matryoshkakv-pca", kPaperText);
  const auto seqs = token_sequences(ctx.tokenizer, docs.split.fit, o.integer("seq_len"), size_t(o.get_int("tokens")),
                                    "kvbench calibrate matryoshkakv-pca: tokens");
  size_t total = 0;
  for (const auto& s : seqs) total += s.size();
  CovarianceTap tap(cfg.n_layers, cfg.n_kv_heads, cfg.head_dim);
  Progress bar("matryoshkakv pca", total, "tok");
  const auto t0 = std::chrono::steady_clock::now();
  for (const auto& s : seqs) {
    ctx.engine.prefill(s, &tap);
    bar.advance(s.size());
  }
  bar.finish();
  const std::string out = ctx.out.empty() ? default_artifact_path(kMatryoshkaPcaKind, cfg) : ctx.out;
  nlohmann::json body = matryoshka_pca_json(tap.solve());
  body["header"] = artifact_header(kMatryoshkaPcaKind, cfg, ctx.model.path());
  body["header"]["calibration"] = {
      {"text", docs.described},
      {"tokens", tap.tokens()},
      {"sequences", seqs.size()},
      {"seq_len", o.get_int("seq_len")},
      {"moment", "covariance of post-RoPE K and of V per layer and KV head, fp64"},
      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
  write_artifact(out, body);
  fmt::print("wrote {} ({} tokens)\n", out, tap.tokens());
}

void train(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const Params& o = ctx.options;
  MatryoshkaTrainOptions t;
  t.steps = o.integer("steps");
  t.batch = o.integer("batch");
  t.seq_len = o.integer("seq_len");
  t.lr = o.get_float("lr");
  t.kl_weight = o.get_float("kl_weight");
  t.clip = o.get_float("clip");
  t.warmup = o.integer("warmup");
  t.seed = static_cast<uint64_t>(o.get_int("seed"));
  t.checkpoint_every = o.integer("checkpoint_every");
  t.progress = ctx.progress;

  const LoadedArtifact pa =
      load_artifact(kMatryoshkaPcaKind, o.get("pca"), cfg, "kvbench calibrate matryoshkakv-pca MODEL");
  MatryoshkaWeights weights = matryoshka_init(matryoshka_pca_from(pa, cfg));
  const MatryoshkaWeights initial = weights;
  const CalibrationText docs = calibration_text(o.get("text"), ctx.data_dir, "kvbench train matryoshkakv", kPaperText);
  const auto fit = token_sequences(ctx.tokenizer, docs.split.fit, t.seq_len, size_t(t.steps) * t.batch * t.seq_len,
                                   "kvbench train matryoshkakv: steps x batch x seq_len (batches reuse sequences)");
  const auto held = token_sequences(ctx.tokenizer, docs.split.held, t.seq_len, size_t(o.get_int("held_tokens")),
                                    "kvbench train matryoshkakv: held_tokens");
  if (held.empty()) fail("kvbench train matryoshkakv: the held-out documents give no sequence of {} tokens", t.seq_len);

  const std::string out = ctx.out.empty() ? default_artifact_path(kMatryoshkaKind, cfg) : ctx.out;
  ModelGradients mg(ctx.model);
  nlohmann::json training = train_matryoshka(mg, weights, t, fit, out + ".ckpt");
  // The DynaKV paper's rates, before (the PCA) and after training, on the same held-out text.
  const std::vector<double> ratios = {0.5, 0.3, 0.2};
  MatryoshkaWeights pca = initial;
  training["validation_pca"] = matryoshka_validate(mg, pca, ratios, held, ctx.progress);
  training["validation"] = matryoshka_validate(mg, weights, ratios, held, ctx.progress);
  training["text"] = docs.described;
  training["pca"] = {{"file", pa.path}, {"digest", pa.digest}};
  nlohmann::json body = matryoshka_weights_json(weights);
  body["header"] = artifact_header(kMatryoshkaKind, cfg, ctx.model.path());
  body["header"]["training"] = training;
  write_artifact(out, body);
  const auto& v = training["validation"];
  const auto& v0 = training["validation_pca"];
  fmt::print("wrote {}\n  held-out ({} tokens), perplexity of the full model {:.3f}:\n", out, v["tokens"].get<size_t>(),
             v["ppl_full"].get<double>());
  for (size_t i = 0; i < ratios.size(); ++i)
    fmt::print("  rank {:>3}/{}: perplexity {:.3f} (PCA {:.3f}), KL to the full model {:.4f} (PCA {:.4f})\n",
               v["ranks"][i]["rank"].get<int>(), cfg.head_dim, v["ranks"][i]["ppl"].get<double>(),
               v0["ranks"][i]["ppl"].get<double>(), v["ranks"][i]["kl"].get<double>(),
               v0["ranks"][i]["kl"].get<double>());
  fmt::print("  {} training tokens in {:.0f} s\n", training["train_tokens"].get<size_t>(),
             training["seconds"].get<double>());
}

std::vector<ParamSpec> pca_options() {
  auto p = calibration_text_options();
  p.push_back(ParamSpec::integer("tokens", 262144, 1, 1L << 40, "calibration tokens"));
  return p;
}

std::vector<ParamSpec> train_options() {
  auto p = calibration_text_options();
  p.push_back(ParamSpec::integer("steps", 100, 1, 1L << 30, "optimizer steps"));
  p.push_back(ParamSpec::integer("batch", 4, 1, 4096, "sequences per step (the reference: 64)"));
  p.push_back(ParamSpec::real("lr", 1e-3, 0.0, 10.0, "AdamW learning rate of X and the value centres"));
  p.push_back(ParamSpec::real("kl_weight", 0.25, 0.0, 1.0, "loss = (1 - w) CE + w KL(teacher || student)"));
  p.push_back(ParamSpec::real("clip", 1.0, 0.0, 1e9, "global gradient-norm clip"));
  p.push_back(ParamSpec::integer("warmup", 10, 0, 1L << 30, "linear warm-up steps before the cosine decay"));
  p.push_back(ParamSpec::integer("seed", 0, 0, 1L << 62, "seed of the rank draws"));
  p.push_back(ParamSpec::integer("checkpoint_every", 10, 1, 1L << 30, "steps between checkpoints (OUT.ckpt)"));
  p.push_back(ParamSpec::integer("held_tokens", 8192, 1, 1L << 40, "held-out tokens of the validation pass"));
  p.push_back(
      ParamSpec::text("pca", "", "PCA artifact (default: this model's from kvbench calibrate matryoshkakv-pca)"));
  return p;
}

// ---------------------------------------------------------------------------------------------------
// Inference

class MatryoshkaKV final : public Method, public KvTransform {
 public:
  void setup() override {
    const ModelConfig& m = model();
    const int d = m.head_dim;
    if (params().get("weights") == "pca") {
      const LoadedArtifact a = load_artifact(kMatryoshkaPcaKind, "", m, "kvbench calibrate matryoshkakv-pca MODEL");
      weights_ = matryoshka_init(matryoshka_pca_from(a, m));
      artifacts_ = {{"pca", {{"file", a.path}, {"digest", a.digest}}}};
    } else {
      const LoadedArtifact a =
          load_artifact(kMatryoshkaKind, params().get("weights"), m,
                        "kvbench calibrate matryoshkakv-pca MODEL, then kvbench train matryoshkakv MODEL");
      weights_ = matryoshka_weights_from(a, m);
      artifacts_ = {{"weights", {{"file", a.path}, {"digest", a.digest}}}};
    }
    rank_ = std::clamp(static_cast<int>(std::lround(params().get_float("rank_ratio") * d)), 1, d);
    // Each head's basis as the cache reads it: the first `rank_` columns of Q, and the values' centre.
    bases_.resize(size_t(m.n_layers));
    for (int l = 0; l < m.n_layers; ++l)
      for (const auto& maps : weights_.layers[size_t(l)]) {
        auto b = std::make_shared<LowRankBasis>();
        b->head_dim = d;
        b->rank = rank_;
        for (int z = 0; z < 2; ++z) {
          auto& out = z == 0 ? b->k : b->v;
          out.resize(size_t(d) * rank_);
          for (int i = 0; i < d; ++i)
            std::copy_n(maps[size_t(z)].Q.data() + size_t(i) * d, rank_, out.data() + size_t(i) * rank_);
        }
        b->v_mean = maps[1].mean;
        bases_[size_t(l)].push_back(std::move(b));
      }
  }
  KvTransform* kv_transform() override { return this; }
  bool after_rope() const override { return true; }
  nlohmann::json artifacts() const override { return artifacts_; }

  // What attention reads, in prefill and decode alike: the projections of the post-RoPE keys and of
  // the values (the reference's model computes every attention over them).
  void apply(int layer, int n, const int32_t* /*pos*/, float* k, float* v) override {
    const auto& heads = weights_.layers[size_t(layer)];
    const int d = weights_.head_dim, stride = static_cast<int>(heads.size()) * d;
    for (size_t h = 0; h < heads.size(); ++h) {
      matryoshka_project(k + h * d, n, stride, heads[h][0].Q, d, rank_, nullptr, k + h * d);
      matryoshka_project(v + h * d, n, stride, heads[h][1].Q, d, rank_, heads[h][1].mean.data(), v + h * d);
    }
  }

  LayerCache compress(const PrefillView& view, const Budget&) override {
    LayerCache cache(view.n_heads, view.n_kv_heads, view.head_dim);
    const size_t stride = size_t(view.n_kv_heads) * view.head_dim;
    for (int h = 0; h < view.n_kv_heads; ++h) {
      auto seg = std::make_unique<LowRankSegment>(bases_[size_t(view.layer)][size_t(h)], rank_, rank_, false);
      seg->take_decoded_tokens();
      for (int t = 0; t < view.n_tokens; ++t)
        seg->append(view.k + t * stride + size_t(h) * view.head_dim, view.v + t * stride + size_t(h) * view.head_dim,
                    view.positions[t]);
      cache.segments(h).push_back(std::move(seg));
    }
    stats_ = {{"layer", view.layer}, {"k_rank", rank_}, {"v_rank", rank_}, {"tokens", view.n_tokens}};
    return cache;
  }
  nlohmann::json layer_stats() const override { return stats_; }

 private:
  MatryoshkaWeights weights_;
  int rank_ = 0;
  std::vector<std::vector<std::shared_ptr<LowRankBasis>>> bases_;
  nlohmann::json artifacts_, stats_;
};

const bool registered = register_method(
    {.name = "matryoshkakv",
     .summary = "trained orthogonal per-head projections of post-RoPE K and of V, the first r coordinates cached "
                "(MatryoshkaKV, Lin et al. 2024)",
     .params = {ParamSpec::real("rank_ratio", 0.5, 0.001, 1.0,
                                "share of each head's K (and V) dimensions kept: the DynaKV paper's 50%, 30%, 20%"),
                ParamSpec::text("weights", "",
                                "trained projections of kvbench train matryoshkakv (default: this model's); `pca` "
                                "runs the untrained PCA initialisation")},
     .make = [] { return std::make_unique<MatryoshkaKV>(); },
     .steps = {{.command = "calibrate",
                .name = "matryoshkakv-pca",
                .summary = "per-head PCA of post-RoPE keys and of values (the projections' initialisation)",
                .options = pca_options(),
                .run = calibrate_pca},
               {.command = "train",
                .summary = "the projections by distillation at randomly drawn ranks (0.75 CE + 0.25 KL)",
                .options = train_options(),
                .run = train}},
     .budgeted = false,
     .changes_model = true});

}  // namespace
}  // namespace kvb
