#include "methods/matryoshkakv/train.hpp"

#include <fmt/format.h>

#include <chrono>
#include <cmath>

#include "harness/method/artifact.hpp"
#include "harness/method/optimizer.hpp"
#include "harness/util/base64.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"

namespace kvb {

namespace {

double now_seconds() {
  return std::chrono::duration<double>(std::chrono::steady_clock::now().time_since_epoch()).count();
}

int rank_of(double ratio, int d) { return std::clamp(static_cast<int>(std::lround(ratio * d)), 1, d); }

}  // namespace

MatryoshkaRanks matryoshka_uniform_ranks(const MatryoshkaWeights& w, int rank) {
  MatryoshkaRanks r(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) r[l].assign(w.layers[l].size(), {rank, rank});
  return r;
}

MatryoshkaRanks matryoshka_sample_ranks(const MatryoshkaWeights& w, std::mt19937_64& rng) {
  const int step = std::max(1, w.head_dim / 8);
  std::uniform_int_distribution<int> pick(1, 8);
  MatryoshkaRanks r(w.layers.size());
  for (size_t l = 0; l < w.layers.size(); ++l) {
    r[l].resize(w.layers[l].size());
    for (auto& h : r[l])
      for (int& x : h) x = std::min(w.head_dim, step * pick(rng));
  }
  return r;
}

MatryoshkaHook::MatryoshkaHook(MatryoshkaWeights& weights, bool trainable) : w_(weights), trainable_(trainable) {
  ranks_ = matryoshka_uniform_ranks(w_, w_.head_dim);
  reset_grads();
}

void MatryoshkaHook::reset_grads() {
  const size_t dd = size_t(w_.head_dim) * w_.head_dim;
  gq_.assign(w_.layers.size(), {});
  gmean_.assign(w_.layers.size(), {});
  for (size_t l = 0; l < w_.layers.size(); ++l) {
    gq_[l].resize(w_.layers[l].size());
    for (auto& z : gq_[l])
      for (auto& g : z) g.assign(dd, 0.0);
    gmean_[l].assign(w_.layers[l].size(), std::vector<double>(size_t(w_.head_dim), 0.0));
  }
}

void MatryoshkaHook::forward(int layer, int n, float* k, float* v, bool /*recompute*/) {
  const auto& heads = w_.layers[size_t(layer)];
  const int d = w_.head_dim, H = static_cast<int>(heads.size()), stride = H * d;
  if (trainable_) {
    xk_.assign(k, k + size_t(n) * stride);
    xv_.assign(v, v + size_t(n) * stride);
    state_layer_ = layer;
  }
  for (int h = 0; h < H; ++h) {
    const auto& r = ranks_[size_t(layer)][size_t(h)];
    const auto& maps = heads[size_t(h)];
    matryoshka_project(k + size_t(h) * d, n, stride, maps[0].Q, d, r[0], nullptr, k + size_t(h) * d);
    matryoshka_project(v + size_t(h) * d, n, stride, maps[1].Q, d, r[1], maps[1].mean.data(), v + size_t(h) * d);
  }
}

void MatryoshkaHook::backward(int layer, int n, float* dk, float* dv) {
  if (state_layer_ != layer)
    fail("internal: matryoshkakv backward of layer {} after the forward of {}", layer, state_layer_);
  const auto& heads = w_.layers[size_t(layer)];
  const int d = w_.head_dim, H = static_cast<int>(heads.size()), stride = H * d;
  for (int h = 0; h < H; ++h) {
    const auto& r = ranks_[size_t(layer)][size_t(h)];
    const auto& maps = heads[size_t(h)];
    auto& g = gq_[size_t(layer)][size_t(h)];
    matryoshka_project_backward(xk_.data() + size_t(h) * d, dk + size_t(h) * d, n, stride, maps[0].Q, d, r[0], nullptr,
                                g[0], nullptr);
    matryoshka_project_backward(xv_.data() + size_t(h) * d, dv + size_t(h) * d, n, stride, maps[1].Q, d, r[1],
                                maps[1].mean.data(), g[1], &gmean_[size_t(layer)][size_t(h)]);
  }
}

nlohmann::json MatryoshkaTrainOptions::describe() const {
  return {{"steps", steps},         {"batch", batch}, {"seq_len", seq_len}, {"lr", lr},
          {"kl_weight", kl_weight}, {"clip", clip},   {"warmup", warmup},   {"seed", seed}};
}

nlohmann::json matryoshka_validate(ModelGradients& mg, MatryoshkaWeights& weights, const std::vector<double>& ratios,
                                   const std::vector<std::vector<int32_t>>& seqs, bool progress) {
  MatryoshkaHook hook(weights, false);
  std::vector<double> ce(ratios.size(), 0.0), kl(ratios.size(), 0.0);
  double ce_full = 0;
  size_t tokens = 0, positions = 0;
  std::unique_ptr<Progress> bar;
  if (progress) bar = std::make_unique<Progress>("matryoshkakv validation", seqs.size(), "seq");
  std::vector<float> teacher;
  for (const auto& ids : seqs) {
    const auto full = mg.compute(ids, {}, nullptr, {.logits_out = &teacher});
    ce_full += full.loss * full.n_targets;
    for (size_t i = 0; i < ratios.size(); ++i) {
      hook.set_ranks(matryoshka_uniform_ranks(weights, rank_of(ratios[i], weights.head_dim)));
      const auto r = mg.compute(ids, {}, &hook, {.teacher_logits = teacher, .kl_weight = 0.0});
      ce[i] += r.ce * r.n_targets;
      kl[i] += r.kl * static_cast<double>(ids.size());
    }
    tokens += size_t(full.n_targets);
    positions += ids.size();
    if (bar) bar->advance(1);
  }
  if (bar) bar->finish();
  const double n = static_cast<double>(std::max<size_t>(tokens, 1));
  nlohmann::json at = nlohmann::json::array();
  for (size_t i = 0; i < ratios.size(); ++i)
    at.push_back({{"rank_ratio", ratios[i]},
                  {"rank", rank_of(ratios[i], weights.head_dim)},
                  {"ce", ce[i] / n},
                  {"ppl", std::exp(ce[i] / n)},
                  {"kl", kl[i] / static_cast<double>(std::max<size_t>(positions, 1))}});
  return {{"tokens", tokens}, {"ce_full", ce_full / n}, {"ppl_full", std::exp(ce_full / n)}, {"ranks", at}};
}

namespace {

// Flat view of every trained tensor: per layer, head: X_K, X_V, mean_V.
std::vector<std::vector<float>*> parameters(MatryoshkaWeights& w) {
  std::vector<std::vector<float>*> p;
  for (auto& heads : w.layers)
    for (auto& maps : heads) {
      p.push_back(&maps[0].X);
      p.push_back(&maps[1].X);
      p.push_back(&maps[1].mean);
    }
  return p;
}

nlohmann::json moments_json(const std::vector<Moments>& m, int step) {
  nlohmann::json a = nlohmann::json::array();
  for (const auto& s : m) a.push_back({{"m", floats_to_base64(s.m)}, {"v", floats_to_base64(s.v)}});
  return {{"step", step}, {"moments", a}};
}

}  // namespace

nlohmann::json train_matryoshka(ModelGradients& mg, MatryoshkaWeights& weights, const MatryoshkaTrainOptions& o,
                                const std::vector<std::vector<int32_t>>& train, const std::string& checkpoint) {
  if (train.empty()) fail("train matryoshkakv: no training sequences");
  MatryoshkaHook hook(weights, true);
  std::vector<Moments> moments(parameters(weights).size());
  int step = 0;
  nlohmann::json history = nlohmann::json::array();
  double seconds = 0;

  nlohmann::json described = o.describe();
  described["inputs"] = training_inputs(mg.config().fingerprint, matryoshka_weights_json(weights), train, {});
  if (const nlohmann::json ck = read_checkpoint(checkpoint, described); !ck.is_null()) {
    weights = matryoshka_weights_from(LoadedArtifact{checkpoint, ck.at("weights"), false, ""}, mg.config());
    const auto& opt = ck.at("optimizer");
    step = opt.at("step").get<int>();
    const auto& ms = opt.at("moments");
    if (ms.size() != moments.size())
      fail("{}: moments of {} tensors, expected {}", checkpoint, ms.size(), moments.size());
    for (size_t i = 0; i < moments.size(); ++i) {
      moments[i].m = floats_from_base64(ms[i].at("m").get<std::string>(), checkpoint + ".moments");
      moments[i].v = floats_from_base64(ms[i].at("v").get<std::string>(), checkpoint + ".moments");
    }
    history = ck.value("history", nlohmann::json::array());
    seconds = ck.value("seconds", 0.0);
    fmt::print(stderr, "train matryoshkakv: resuming from {} at step {} of {}\n", checkpoint, step, o.steps);
  }
  auto save = [&] {
    if (checkpoint.empty()) return;
    write_artifact(checkpoint, {{"options", described},
                                {"weights", matryoshka_weights_json(weights)},
                                {"optimizer", moments_json(moments, step)},
                                {"history", history},
                                {"seconds", seconds}});
  };

  std::unique_ptr<Progress> bar;
  if (o.progress) bar = std::make_unique<Progress>("train matryoshkakv", size_t(o.steps), "step");
  if (bar && step > 0) bar->advance(size_t(step));
  std::vector<float> teacher;
  size_t tokens = 0;
  while (step < o.steps) {
    const double t0 = now_seconds();
    hook.reset_grads();
    double loss = 0, ce = 0, kl = 0;
    for (int i = 0; i < o.batch; ++i) {
      const size_t index = size_t(step) * o.batch + i;
      const auto& ids = train[index % train.size()];
      // Each sequence draws its own ranks from a stream fixed by (seed, sequence index), so a resumed
      // run draws what an uninterrupted one would.
      std::mt19937_64 rng(o.seed * 0x9E3779B97F4A7C15ull + index);
      hook.set_ranks(matryoshka_sample_ranks(weights, rng));
      mg.compute(ids, {}, nullptr, {.logits_out = &teacher});
      const auto r = mg.compute(ids, {}, &hook, {.teacher_logits = teacher, .kl_weight = o.kl_weight});
      loss += r.loss / o.batch;
      ce += r.ce / o.batch;
      kl += r.kl / o.batch;
      tokens += ids.size();
    }
    // d loss / d X through the Cayley map, the batch mean, one global norm, AdamW.
    std::vector<std::vector<float>> grads;
    for (size_t l = 0; l < weights.layers.size(); ++l)
      for (size_t h = 0; h < weights.layers[l].size(); ++h) {
        for (int z = 0; z < 2; ++z) {
          const MatryoshkaMap& m = weights.layers[l][h][size_t(z)];
          std::vector<double> gx;
          matryoshka_map_backward(m, hook.q_grads()[l][h][size_t(z)], gx);
          grads.emplace_back(gx.begin(), gx.end());
        }
        const auto& gm = hook.mean_grads()[l][h];
        grads.emplace_back(gm.begin(), gm.end());
      }
    double sq = 0;
    for (const auto& g : grads)
      for (float x : g) sq += double(x) * x / (double(o.batch) * o.batch);
    const double norm = std::sqrt(sq);
    const double gscale = (1.0 / o.batch) * (norm > o.clip ? o.clip / norm : 1.0);
    ++step;
    const double lr = o.lr * learning_scale(step - 1, o.steps, o.warmup);
    auto params = parameters(weights);
    for (size_t i = 0; i < params.size(); ++i) adamw(*params[i], grads[i], moments[i], lr, 0.0, gscale, step);
    for (size_t l = 0; l < weights.layers.size(); ++l)
      for (size_t h = 0; h < weights.layers[l].size(); ++h)
        for (int z = 0; z < 2; ++z) {
          MatryoshkaMap& m = weights.layers[l][h][size_t(z)];
          matryoshka_refresh(m, fmt::format("train matryoshkakv: layer {} head {} after step {}", l, h, step));
        }
    seconds += now_seconds() - t0;
    history.push_back({{"step", step}, {"loss", loss}, {"ce", ce}, {"kl", kl}, {"grad_norm", norm}, {"lr", lr}});
    if (bar) bar->advance(1, fmt::format("loss {:.4f} ce {:.4f} kl {:.4f}", loss, ce, kl));
    if (step % std::max(1, o.checkpoint_every) == 0 || step == o.steps) save();
  }
  if (bar) bar->finish();
  return {{"options", described},
          {"train_sequences", train.size()},
          {"train_tokens", tokens},
          {"seconds", seconds},
          {"history", history}};
}

}  // namespace kvb
