// Palu (Chang et al. 2025, arXiv:2407.21118) as MixedDimKV's Table 9 and DynaKV's Tables 1-4 compare
// against it: K and V projected to a low rank, the rank-r latent cached and the keys rebuilt (then
// rotated) at attention time. The whitened SVD of k_proj and v_proj (per group of KV heads) is the
// projection onto the top eigenvectors of the uncentred second moment of the group's pre-RoPE keys
// (values) over the calibration text (README.md §1), which is DynaKV's fixed-rank path on its PCA
// basis; Palu runs it on a basis of its own calibration, with ranks from Palu's rank searches (uniform;
// per layer and K/V, or per group of heads, from the Fisher information of the projections' weights).
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <map>
#include <numeric>
#include <set>

#include "harness/engine/gradients.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"
#include "methods/palu/rank_search.hpp"

namespace kvb {

namespace palu {

// Python's round halves to even, as nearbyint does in the default rounding mode.
int round_rank(double rank, int multiple, int dims) {
  const double blocks = std::nearbyint(rank / multiple);
  return std::min(dims, std::max(1, static_cast<int>(blocks)) * multiple);
}

// As Palu's loop computes them, in double: floor of target x f / sum f (at most dims), then one more to each module in
// ascending order of what the floor cut off while the target is not reached. Its check `dif == 0` compares a double:
// where the target is not a whole number the first pass gives one to every module, as Palu's code does.
std::vector<int> fisher_ranks(const std::vector<double>& fisher, int dims, double ratio, int per_module) {
  const size_t n = fisher.size();
  if (per_module < 1 || n % size_t(per_module) != 0)
    fail("palu rank search: {} Fisher values in modules of {}", n, per_module);
  double total = 0, sum = 0;
  for (size_t i = 0; i < n; i += size_t(per_module)) {  // fisher_sum += sum(fisher_list), module by module
    double module = 0;
    for (int g = 0; g < per_module; ++g) {
      total += dims;
      module += fisher[i + size_t(g)];
    }
    sum += module;
  }
  const double target = total * ratio;
  std::vector<int> rank(n);
  std::vector<double> wanted(n);
  for (size_t i = 0; i < n; ++i) {
    wanted[i] = target * fisher[i] / sum;
    rank[i] = std::min(dims, static_cast<int>(std::floor(wanted[i])));
  }
  std::vector<size_t> order(n);
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(),
                   [&](size_t a, size_t b) { return wanted[a] - rank[a] < wanted[b] - rank[b]; });
  double dif = target - std::accumulate(rank.begin(), rank.end(), 0.0);
  while (dif > 0) {
    bool grew = false;
    for (size_t i : order) {
      if (rank[i] == dims) continue;
      ++rank[i];
      grew = true;
      dif -= 1;
      if (dif == 0) break;
    }
    if (!grew) break;  // every module whole (ratio 1): Palu's loop would not end
  }
  return rank;
}

}  // namespace palu

namespace {

constexpr const char* kBasisDir = "palu";
constexpr const char* kFisherKind = "palu-fisher";

// The basis of `group_size` heads per group (all: Palu's J-LRD, the file kvbench wrote before groups).
std::string basis_path(const ModelConfig& m, int group_size) {
  std::string p = default_artifact_path(kBasisDir, m);
  if (group_size != m.n_kv_heads) p.replace(p.size() - 5, 5, fmt::format(".g{}.json", group_size));
  return p;
}

// Per layer, K and V, and per group of `group_size` KV heads: the mean Fisher information of the
// projection's rows of that group (the mean of its heads'), module by module.
std::vector<double> group_fisher(const LoadedArtifact& a, const ModelConfig& m, int group_size) {
  if (!a.body.contains("layers") || !a.body["layers"].is_array() ||
      static_cast<int>(a.body["layers"].size()) != m.n_layers)
    fail("{}: layers: expected an array of {} entries (the model's layers)", a.path, m.n_layers);
  const auto& layers = a.body["layers"];
  std::vector<double> f;
  for (int l = 0; l < m.n_layers; ++l)
    for (const char* kind : {"K", "V"}) {
      const auto& layer = layers[size_t(l)];
      if (!layer.is_object() || !layer.contains(kind) || !layer[kind].is_array() ||
          static_cast<int>(layer[kind].size()) != m.n_kv_heads)
        fail("{}: layers[{}].{}: expected {} numbers (one per KV head)", a.path, l, kind, m.n_kv_heads);
      double s = 0;
      for (int h = 0; h < m.n_kv_heads; ++h) {
        const auto& x = layer[kind][size_t(h)];
        if (!x.is_number()) fail("{}: layers[{}].{}: expected numbers", a.path, l, kind);
        const double v = x.get<double>();
        if (!std::isfinite(v) || v <= 0)
          fail("{}: layers[{}].{}: a head's Fisher information {} is not > 0", a.path, l, kind, v);
        s += v;
        if ((h + 1) % group_size == 0) {
          f.push_back(s / group_size);
          s = 0;
        }
      }
    }
  return f;
}

class Palu final : public Method {
 public:
  void setup() override {
    const ModelConfig& m = model();
    const int group_size = heads_per_group(params(), m.n_kv_heads, "method palu");
    const int groups = m.n_kv_heads / group_size, group_dims = group_size * m.head_dim;
    std::string basis = params().get("basis");
    if (basis.empty()) basis = basis_path(m, group_size);
    if (!std::filesystem::exists(basis))
      fail(
          "{}: no such palu basis; make one with `kvbench calibrate palu MODEL --text FILES{}` (the paper fits it on "
          "WikiText-2)",
          basis, group_size == m.n_kv_heads ? "" : fmt::format(" -o group_size={}", group_size));

    const double ratio = params().get_float("rank_ratio");
    const int multiple = params().integer("rank_multiple");
    const std::string allocation = params().get("allocation");
    // Each module's groups' ranks (k_proj, v_proj of layer 0, then layer 1, ...).
    std::vector<std::vector<int>> ranks(
        2 * size_t(m.n_layers),
        std::vector<int>(size_t(groups), palu::round_rank(ratio * group_dims, multiple, group_dims)));
    if (allocation == "uniform" && !params().get("fisher").empty())
      fail("method palu: fisher= is read by the Fisher rank searches only (allocation is uniform)");
    if (allocation != "uniform") {
      const LoadedArtifact f =
          load_artifact(kFisherKind, params().get("fisher"), m, "kvbench calibrate palu-fisher MODEL");
      if (allocation == "fisher_uniform") {
        // One rank per module, then split_values and rounding_search_result: each group an equal share.
        const auto module = palu::fisher_ranks(group_fisher(f, m, m.n_kv_heads), m.n_kv_heads * m.head_dim, ratio);
        for (size_t i = 0; i < module.size(); ++i)
          ranks[i].assign(size_t(groups), palu::round_rank(module[i] / groups, multiple, group_dims));
      } else {
        // fisher: a rank per group from the group's own Fisher information, each rounded.
        const auto group = palu::fisher_ranks(group_fisher(f, m, group_size), group_dims, ratio, groups);
        for (size_t i = 0; i < group.size(); ++i)
          ranks[i / size_t(groups)][i % size_t(groups)] = palu::round_rank(group[i], multiple, group_dims);
      }
      fisher_ = {{"file", f.path}, {"digest", f.digest}};
    }
    // Each module's groups' ranks joined by '+' ("a+b+c"); DynaKV refuses a basis fitted on other groups.
    std::string fixed;
    for (const auto& r : ranks) fixed += fmt::format("{}{}", fixed.empty() ? "" : "/", fmt::join(r, "+"));
    std::map<std::string, std::string> inner = {{"fixed_ranks", fixed}, {"pca", basis}, {"gqa", gqa_mode_name(gqa())}};
    // Palu's latent quantization passes through to DynaKV's fixed-rank path, which stores the latent.
    for (const ParamSpec& q : with_latent_quant({})) inner[q.name] = params().get(q.name);
    try {
      inner_ = MethodRegistry::get().create("dynakv", inner, m);
    } catch (const Error& e) {
      // Palu runs on DynaKV's fixed-rank path: its errors (a basis fitted on other head groups) are
      // about parameters the user gave palu, so say which.
      fail("method palu (group_size {}, basis {}): {}", group_size, basis, e.what());
    }
  }
  PrefillNeeds needs() const override { return inner_->needs(); }
  KvTransform* kv_transform() override { return inner_->kv_transform(); }
  bool keeps_sequence_state() const override { return inner_->keeps_sequence_state(); }
  LayerCache compress(const PrefillView& view, const Budget& budget) override { return inner_->compress(view, budget); }
  nlohmann::json artifacts() const override {
    nlohmann::json a = inner_->artifacts();
    if (!fisher_.is_null()) a["fisher"] = fisher_;
    return a;
  }
  nlohmann::json layer_stats() const override { return inner_->layer_stats(); }

 private:
  std::unique_ptr<Method> inner_;
  nlohmann::json fisher_;
};

// DynaKV's PCA step (through the registry) on Palu's text and sequence length, into Palu's artifact.
void calibrate(CalibrationContext& ctx) {
  const ModelConfig& m = ctx.model.config();
  ctx.command = "kvbench calibrate palu";
  if (ctx.out.empty()) ctx.out = basis_path(m, heads_per_group(ctx.options, m.n_kv_heads, ctx.command));
  MethodRegistry::get().offline_step("calibrate", "dynakv-pca").run(ctx);
}

// palu/rank_search.py calib_fisher_info: per window, the gradient of the loss with respect to every
// k_proj and v_proj weight; per weight sqrt(mean over windows of its square); per KV head the mean over
// its rows. The loss predicts the token `target_offset` ahead (Palu's: 2, see gradients.hpp).
void calibrate_fisher(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  FitSequences fit = fit_sequences(ctx, "kvbench calibrate palu-fisher", "the paper: WikiText-2");
  const int offset = ctx.options.integer("target_offset");
  // Palu's windows all hold seq_len tokens: a shorter last piece of the text is left out.
  if (ctx.options.get("ids").empty())
    std::erase_if(fit.seqs, [&](const auto& s) { return s.size() < size_t(ctx.options.integer("seq_len")); });
  if (fit.seqs.empty())
    fail("kvbench calibrate palu-fisher: no full window of seq_len {} tokens within --tokens {} of the text",
         ctx.options.integer("seq_len"), ctx.options.get_int("tokens"));
  ModelGradients mg(ctx.model);
  std::set<std::string> names;
  for (int l = 0; l < cfg.n_layers; ++l)
    for (const char* w : {"attn_k", "attn_v"}) names.insert(fmt::format("blk.{}.{}.weight", l, w));
  std::map<std::string, std::vector<double>> squares;
  size_t total = 0;
  for (const auto& s : fit.seqs) total += s.size();
  Progress bar("palu fisher", total, "tok");
  const auto t0 = std::chrono::steady_clock::now();
  double loss = 0;
  for (const auto& s : fit.seqs) {
    if (s.size() <= size_t(offset))
      fail("kvbench calibrate palu-fisher: a sequence of {} tokens has no target {} ahead", s.size(), offset);
    const LossGradients g = mg.compute(s, names, nullptr, {.target_offset = offset});
    for (const auto& [name, grad] : g.grads) {
      auto& acc = squares[name];
      acc.resize(grad.size(), 0.0);
      for (size_t i = 0; i < grad.size(); ++i) acc[i] += double(grad[i]) * grad[i];
    }
    loss += g.loss;
    bar.advance(s.size(), fmt::format("loss {:.3f}", g.loss));
  }
  bar.finish();
  const size_t n = fit.seqs.size(), per_head = size_t(cfg.head_dim) * size_t(cfg.hidden);
  nlohmann::json layers = nlohmann::json::array();
  for (int l = 0; l < cfg.n_layers; ++l) {
    nlohmann::json entry;
    for (const auto& [kind, w] : {std::pair{"K", "attn_k"}, std::pair{"V", "attn_v"}}) {
      const auto& acc = squares.at(fmt::format("blk.{}.{}.weight", l, w));
      std::vector<double> heads;
      for (int h = 0; h < cfg.n_kv_heads; ++h) {
        double sum = 0;
        for (size_t i = h * per_head; i < (h + 1) * per_head; ++i) sum += std::sqrt(acc[i] / double(n));
        heads.push_back(sum / double(per_head));
      }
      entry[kind] = heads;
    }
    layers.push_back(std::move(entry));
  }
  const std::string out = ctx.out.empty() ? default_artifact_path(kFisherKind, cfg) : ctx.out;
  nlohmann::json body = {{"layers", std::move(layers)}};
  body["header"] = artifact_header(kFisherKind, cfg, ctx.model.path());
  body["header"]["calibration"] = {
      {"text", fit.described},
      {"sequences", n},
      {"tokens", total},
      {"seq_len", fit.seq_len},
      {"target_offset", offset},
      {"mean_loss", n ? loss / double(n) : 0.0},
      {"fisher",
       "per KV head: the mean over its rows of k_proj's (v_proj's) sqrt(mean over sequences of the "
       "squared gradient), fp32 gradients summed in fp64"},
      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()}};
  write_artifact(out, body);
  fmt::print("wrote {} ({} sequences, {} tokens)\n", out, n, total);
}

const bool registered = register_method(
    {.name = "palu",
     .summary = "low-rank K/V (Palu: J-LRD or G-LRD, uniform or Fisher ranks): the rank-r latent cached, keys "
                "rebuilt then rotated (Chang et al. 2025)",
     .params = with_latent_quant(
         {ParamSpec::real("rank_ratio", 0.5, 0.001, 1.0,
                          "share of the K (and V) dimensions kept: the papers' 50%, 40%, 30%, 20%"),
          ParamSpec::integer("rank_multiple", 32, 1, 4096,
                             "each group's rank rounded to a multiple of this, as Palu's rank search rounds it "
                             "(1: the share's nearest integer)")
              .added_later("1"),
          group_size_option().added_later(),
          ParamSpec::choice("allocation", "uniform", {"uniform", "fisher_uniform", "fisher"},
                            "uniform: one rank everywhere; fisher_uniform: per layer and K/V in proportion to "
                            "the Fisher information, equal in its groups (Palu's default); fisher: per group "
                            "(kvbench calibrate palu-fisher)")
              .added_later(),
          ParamSpec::text("basis", "", "basis of kvbench calibrate palu (default: this model's)"),
          ParamSpec::text("fisher", "",
                          "Fisher information of kvbench calibrate palu-fisher for allocation=fisher_uniform or "
                          "fisher (default: this model's)")
              .added_later()}),
     .make = [] { return std::make_unique<Palu>(); },
     .steps = {{.command = "calibrate",
                .summary = "Palu's low-rank basis per layer, K and V, from the calibration text (the paper: "
                           "WikiText-2)",
                .options = {ParamSpec::text("text", "",
                                            "text files or directories (the paper: WikiText-2; default: "
                                            "set-up's data/python-docs)"),
                            ParamSpec::integer("seq_len", 2048, 16, 1 << 20, "tokens per sequence (BOS + text)"),
                            ParamSpec::integer("tokens", 524288, 1, 1L << 40,
                                               "calibration tokens (Palu's whitening: 256 x 2,048)"),
                            id_sequences_option(), group_size_option()},
                .run = calibrate},
               {.command = "calibrate",
                .name = "palu-fisher",
                .summary = "Fisher information of k_proj and v_proj per KV head, for Palu's Fisher rank searches",
                .options = {ParamSpec::text("text", "",
                                            "text files or directories (the paper: WikiText-2; default: "
                                            "set-up's data/python-docs)"),
                            ParamSpec::integer("seq_len", 1024, 16, 1 << 20,
                                               "tokens per sequence (Palu's calib_seqlen: 1,024)"),
                            ParamSpec::integer("tokens", 2048L * 1024, 1, 1L << 40,
                                               "calibration tokens (Palu's: 2,048 windows of 1,024)"),
                            id_sequences_option(),
                            ParamSpec::integer("target_offset", 2, 1, 16,
                                               "the loss predicts the token this far ahead (Palu's code: 2, its "
                                               "labels shifted twice; 1: next-token cross-entropy)")},
                .run = calibrate_fisher}},
     .budgeted = false,
     .changes_model = true});

}  // namespace
}  // namespace kvb
