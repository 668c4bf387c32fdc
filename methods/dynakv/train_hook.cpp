#include "methods/dynakv/train_hook.hpp"

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
}  // namespace

DynaKvHook::DynaKvHook(DynaKvWeights& weights, DynaKvPath path, int fixed_width)
    : w_(weights), path_(path), fixed_(fixed_width) {
  if (path == DynaKvPath::Fixed && (fixed_width < 1 || fixed_width > weights.d))
    fail("DynaKV fixed width {} outside [1, {}]", fixed_width, weights.d);
  reset_grads();
  reset_stats();
}

void DynaKvHook::set_objective(Objective o, double alpha) {
  if (path_ != DynaKvPath::Soft) fail("internal: only DynaKV's soft path trains");
  objective_ = o;
  alpha_ = alpha;
  trainable_ = true;
}

void DynaKvHook::reset_grads() {
  grads_.resize(w_.layers.size());
  for (auto& g : grads_)
    for (auto& z : g) z.reset(w_.d, train_basis_);
}

void DynaKvHook::reset_stats() {
  soft_sum_.assign(w_.layers.size(), {0.0, 0.0});
  hard_sum_.assign(w_.layers.size(), {0.0, 0.0});
  tokens_ = 0;
}

double DynaKvHook::soft_rate() const {
  double s = 0;
  for (const auto& l : soft_sum_) s += l[0] + l[1];
  return tokens_ ? s / (2.0 * double(tokens_) * double(w_.layers.size())) : 0.0;
}

double DynaKvHook::hard_rate() const {
  double s = 0;
  for (const auto& l : hard_sum_) s += l[0] + l[1];
  return tokens_ ? s / (2.0 * double(tokens_) * double(w_.layers.size())) : 0.0;
}

double DynaKvHook::hard_rate(int layer, int kind) const {
  return tokens_ ? hard_sum_[size_t(layer)][size_t(kind)] / double(tokens_) : 0.0;
}

double DynaKvHook::sequence_soft_rate() const {
  return seq_tokens_ ? seq_soft_ / (2.0 * seq_tokens_ * double(w_.layers.size())) : 0.0;
}

void DynaKvHook::forward(int layer, int n, float* k, float* v, bool recompute) {
  const double t0 = now_seconds();
  const int d = w_.d;
  if (layer == 0 && !recompute) {
    seq_soft_ = 0;
    seq_tokens_ = n;
    tokens_ += size_t(n);
  }
  state_layer_ = layer;
  for (int z = 0; z < 2; ++z) {
    float* x = z == 0 ? k : v;
    const DynaKvMap& map = w_.layers[size_t(layer)][size_t(z)];
    DynaKvGate& g = gate_[size_t(z)];
    x_[size_t(z)].assign(x, x + size_t(n) * d);
    dynakv_gate(map, x, n, g);
    // Widths serve the rates of first passes and the hard and fixed paths; a soft recompute needs none.
    std::vector<int> width;
    if (!recompute || path_ != DynaKvPath::Soft)
      for (int t = 0; t < n; ++t)
        width.push_back(path_ == DynaKvPath::Fixed ? fixed_ : dynakv_width(g.m.data() + size_t(t) * d, d, w_.tau));
    if (!recompute) {
      for (int t = 0; t < n; ++t) {
        const double r = dynakv_soft_rate(g.m.data() + size_t(t) * d, d);
        soft_sum_[size_t(layer)][size_t(z)] += r;
        seq_soft_ += r;
        hard_sum_[size_t(layer)][size_t(z)] += double(width[size_t(t)]) / d;
      }
    }
    if (path_ == DynaKvPath::Soft) {
      dynakv_soft_reconstruct(map, g, x);
    } else {
      for (int t = 0; t < n; ++t)
        dynakv_expand(map, g.xt.data() + size_t(t) * d, width[size_t(t)], 0, d, x + size_t(t) * d);
    }
  }
  seconds_ += now_seconds() - t0;
}

void DynaKvHook::backward(int layer, int n, float* dk, float* dv) {
  if (path_ != DynaKvPath::Soft)
    fail("internal: DynaKV backward on the {} path", path_ == DynaKvPath::Hard ? "hard" : "fixed");
  if (layer != state_layer_)
    fail("internal: DynaKV backward of layer {} after the forward of layer {}", layer, state_layer_);
  const int d = w_.d;
  const double L = double(w_.layers.size());
  // d loss / d R_tok: e2e's alpha R^2 with R = sum R_tok / (2 L n); layer-local's alpha R_l with
  // R_l = sum over the layer's tokens and K/V of R_tok / (2 n).
  const double rate_grad =
      objective_ == Objective::E2E ? 2.0 * alpha_ * sequence_soft_rate() / (2.0 * L * n) : alpha_ / (2.0 * n);
  std::vector<float> dx(size_t(n) * d);
  for (int z = 0; z < 2; ++z) {
    float* g = z == 0 ? dk : dv;
    dynakv_backward(w_.layers[size_t(layer)][size_t(z)], x_[size_t(z)].data(), gate_[size_t(z)], g,
                    static_cast<float>(rate_grad), train_basis_, grads_[size_t(layer)][size_t(z)], dx.data());
    std::copy(dx.begin(), dx.end(), g);
  }
}

nlohmann::json DynaKvTrainOptions::describe() const {
  return {{"mode", mode},           {"alpha", alpha},
          {"steps", steps},         {"batch", batch},
          {"seq_len", seq_len},     {"lr", lr},
          {"lr_basis", lr_basis},   {"weight_decay", weight_decay},
          {"clip", clip},           {"train_basis", train_basis},
          {"init_rate", init_rate}, {"tau", tau}};
}

nlohmann::json DynaKvValidation::to_json() const {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : layer_hard_rate) layers.push_back({l[0], l[1]});
  return {{"tokens", tokens},
          {"ce_full", ce_full},
          {"ppl_full", std::exp(ce_full)},
          {"ce_soft", ce_soft},
          {"ppl_soft", std::exp(ce_soft)},
          {"ce_hard", ce_hard},
          {"ppl_hard", std::exp(ce_hard)},
          {"soft_rate", soft_rate},
          {"hard_rate", hard_rate},
          {"layer_hard_rate_kv", layers}};
}

DynaKvValidation dynakv_validate(ModelGradients& mg, DynaKvWeights& weights, DynaKvPath path, int fixed_width,
                                 const std::vector<std::vector<int32_t>>& seqs, bool compare_full, bool progress) {
  DynaKvValidation r;
  DynaKvHook hard(weights, path, fixed_width), soft(weights, DynaKvPath::Soft);
  size_t targets = 0;
  for (const auto& s : seqs) targets += s.size() - 1;
  std::unique_ptr<Progress> bar;
  if (progress) bar = std::make_unique<Progress>("dynakv validation", seqs.size(), "seq");
  double done = 0;
  for (const auto& s : seqs) {
    const double w = double(s.size() - 1) / double(targets);
    done += w;
    r.ce_hard += w * mg.compute(s, {}, &hard).loss;
    if (path != DynaKvPath::Fixed) r.ce_soft += w * mg.compute(s, {}, &soft).loss;
    if (compare_full) r.ce_full += w * mg.loss(s);
    if (bar) bar->advance(1, fmt::format("ppl {:.2f} rate {:.3f}", std::exp(r.ce_hard / done), hard.hard_rate()));
  }
  if (bar) bar->finish();
  r.tokens = targets;
  r.hard_rate = hard.hard_rate();
  r.soft_rate = path == DynaKvPath::Fixed ? r.hard_rate : soft.soft_rate();
  for (size_t l = 0; l < weights.layers.size(); ++l)
    r.layer_hard_rate.push_back({hard.hard_rate(int(l), 0), hard.hard_rate(int(l), 1)});
  return r;
}

namespace {

struct Optimizer {
  // [layer][K/V][U, W, b]
  std::vector<std::array<std::array<Moments, 3>, 2>> state;
  int step = 0;
};

nlohmann::json moments_json(const Optimizer& opt) {
  nlohmann::json layers = nlohmann::json::array();
  for (const auto& l : opt.state) {
    nlohmann::json e = nlohmann::json::array();
    for (const auto& z : l)
      for (const auto& t : z) e.push_back({{"m", floats_to_base64(t.m)}, {"v", floats_to_base64(t.v)}});
    layers.push_back(std::move(e));
  }
  return {{"step", opt.step}, {"moments", layers}};
}

void moments_from(const nlohmann::json& j, Optimizer& opt, const std::string& where) {
  opt.step = j.at("step").get<int>();
  const auto& layers = j.at("moments");
  if (layers.size() != opt.state.size())
    fail("{}: moments of {} layers, expected {}", where, layers.size(), opt.state.size());
  for (size_t l = 0; l < layers.size(); ++l)
    for (size_t i = 0; i < 6; ++i) {
      auto& t = opt.state[l][i / 3][i % 3];
      t.m = floats_from_base64(layers[l].at(i).at("m").get<std::string>(), where + ".moments");
      t.v = floats_from_base64(layers[l].at(i).at("v").get<std::string>(), where + ".moments");
    }
}

}  // namespace

nlohmann::json train_dynakv(ModelGradients& mg, DynaKvWeights& weights, const DynaKvTrainOptions& o,
                            const std::vector<std::vector<int32_t>>& train,
                            const std::vector<std::vector<int32_t>>& held, const std::string& checkpoint) {
  if (o.mode != "e2e" && o.mode != "ll") fail("train dynakv: mode '{}' (expected e2e or ll)", o.mode);
  if (train.empty()) fail("train dynakv: no training sequences");
  const bool e2e = o.mode == "e2e";
  const int L = static_cast<int>(weights.layers.size());
  weights.tau = o.tau;
  DynaKvHook hook(weights, DynaKvPath::Soft);
  hook.set_objective(e2e ? DynaKvHook::Objective::E2E : DynaKvHook::Objective::LayerLocal, o.alpha);
  hook.set_train_basis(o.train_basis);
  hook.reset_grads();
  Optimizer opt;
  opt.state.resize(size_t(L));
  nlohmann::json history = nlohmann::json::array();
  double seconds = 0;

  nlohmann::json described = o.describe();
  described["inputs"] = training_inputs(mg.config().fingerprint, dynakv_weights_json(weights), train, held);
  if (const nlohmann::json ck = read_checkpoint(checkpoint, described); !ck.is_null()) {
    weights = dynakv_weights_from(LoadedArtifact{checkpoint, ck.at("weights"), false, ""}, mg.config());
    weights.tau = o.tau;
    moments_from(ck.at("optimizer"), opt, checkpoint);
    history = ck.value("history", nlohmann::json::array());
    seconds = ck.value("seconds", 0.0);
    fmt::print(stderr, "train dynakv: resuming from {} at step {} of {}\n", checkpoint, opt.step, o.steps);
  }
  auto save = [&] {
    if (checkpoint.empty()) return;
    write_artifact(checkpoint, {{"options", described},
                                {"weights", dynakv_weights_json(weights)},
                                {"optimizer", moments_json(opt)},
                                {"history", history},
                                {"seconds", seconds}});
  };

  size_t step_tokens = 0;
  for (int i = 0; i < o.batch; ++i) step_tokens += train[size_t(i) % train.size()].size();
  std::unique_ptr<Progress> bar;
  if (o.progress)
    bar = std::make_unique<Progress>(fmt::format("train dynakv ({}, alpha {})", o.mode, o.alpha), size_t(o.steps),
                                     "step");
  if (bar && opt.step > 0) bar->advance(size_t(opt.step));
  while (opt.step < o.steps) {
    const double t0 = now_seconds();
    hook.reset_grads();
    hook.reset_stats();
    double loss = 0, task = 0;
    for (int i = 0; i < o.batch; ++i) {
      const auto& ids = train[(size_t(opt.step) * o.batch + i) % train.size()];
      if (e2e) {
        const double ce = mg.compute(ids, {}, &hook).loss;
        const double R = hook.sequence_soft_rate();
        task += ce / o.batch;
        loss += (ce + o.alpha * R * R) / o.batch;
      } else {
        const auto D = mg.attention_distortion(ids, hook);
        double sum = 0;
        for (double x : D) sum += x;
        task += sum / o.batch;
        loss += sum / o.batch;  // the rate part is added below from the hook's rates
      }
    }
    if (!e2e) loss += o.alpha * hook.soft_rate() * L;
    // Global norm over every gradient (U's with U^-1's folded in), then AdamW.
    double sq = 0;
    for (int l = 0; l < L; ++l)
      for (int z = 0; z < 2; ++z) {
        auto& g = hook.grads()[size_t(l)][size_t(z)];
        fold_inverse_grad(weights.layers[size_t(l)][size_t(z)], g);
        for (const auto* t : {&g.U, &g.W, &g.b})
          for (float x : *t) sq += double(x) * x / (double(o.batch) * o.batch);
      }
    const double norm = std::sqrt(sq);
    const double gscale = (1.0 / o.batch) * (norm > o.clip ? o.clip / norm : 1.0);
    ++opt.step;
    const double scale = learning_scale(opt.step - 1, o.steps, static_cast<int>(std::lround(0.02 * o.steps)));
    for (int l = 0; l < L; ++l)
      for (int z = 0; z < 2; ++z) {
        DynaKvMap& map = weights.layers[size_t(l)][size_t(z)];
        auto& g = hook.grads()[size_t(l)][size_t(z)];
        auto& st = opt.state[size_t(l)][size_t(z)];
        adamw(map.W, g.W, st[1], o.lr * scale, o.weight_decay, gscale, opt.step);
        adamw(map.b, g.b, st[2], o.lr * scale, 0.0, gscale, opt.step);
        if (o.train_basis) {
          adamw(map.U, g.U, st[0], o.lr_basis * scale, o.weight_decay, gscale, opt.step);
          refresh_inverse(map, fmt::format("train dynakv: layer {} {} after step {}", l, z ? "V" : "K", opt.step));
        }
      }
    seconds += now_seconds() - t0;
    history.push_back({{"step", opt.step},
                       {"loss", loss},
                       {e2e ? "ce" : "distortion", task},
                       {"soft_rate", hook.soft_rate()},
                       {"hard_rate", hook.hard_rate()},
                       {"grad_norm", norm}});
    if (bar)
      bar->advance(1, fmt::format("loss {:.4f} {} {:.4f} R soft {:.3f} hard {:.3f}", loss, e2e ? "ce" : "D", task,
                                  hook.soft_rate(), hook.hard_rate()));
    if (opt.step % std::max(1, o.checkpoint_every) == 0 || opt.step == o.steps) save();
  }
  if (bar) bar->finish();

  const DynaKvValidation val = dynakv_validate(mg, weights, DynaKvPath::Hard, 0, held, true, o.progress);
  return {{"options", described},
          {"train_sequences", train.size()},
          {"train_tokens", size_t(o.steps) * step_tokens},
          {"seconds", seconds},
          {"history", history},
          {"validation", val.to_json()}};
}

}  // namespace kvb
