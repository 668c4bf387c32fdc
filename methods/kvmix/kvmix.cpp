// KVmix (README.md §1-§7): mixed-precision KV quantization by layer, keys and values apart. An
// offline profile ranks layers by the gradient norms of the loss with respect to their key and value
// projections; the most sensitive share of layers gets more bits (keys 3, values 4; the rest 2). Keys
// are quantized per channel along tokens, values per token along channels, each behind a
// full-precision buffer of recent tokens that shrinks by its ratio at every step (KvmixSegment).
//
// `kvbench calibrate kvmix MODEL` profiles: LongBench prompts (round robin over the datasets found),
// each cut to its first max_tokens tokens, one forward and one backward of the next-token loss per
// prompt (harness/engine/gradients.*), ||dL/dW_k||_F and ||dL/dW_v||_F per layer averaged over prompts.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <filesystem>
#include <numeric>
#include <random>
#include <set>

#include "harness/engine/generate.hpp"
#include "harness/engine/gradients.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"
#include "methods/kvmix/kvmix_segment.hpp"

namespace kvb {
namespace {

// The layers with the `count` largest scores (ties: the lower layer), ascending.
std::vector<int> top_layers(const std::vector<double>& score, int count) {
  std::vector<int> idx(score.size());
  std::iota(idx.begin(), idx.end(), 0);
  std::stable_sort(idx.begin(), idx.end(), [&](int a, int b) { return score[a] > score[b]; });
  idx.resize(size_t(std::clamp(count, 0, static_cast<int>(idx.size()))));
  std::sort(idx.begin(), idx.end());
  return idx;
}

// floor(f L) layers get the high bit widths (README.md §1; the reference's int(0.1 L) + int(0.1 L) is the same
// for L = 32).
int high_count(double fraction, int layers) { return static_cast<int>(std::floor(fraction * layers + 1e-9)); }

// ---------------------------------------------------------------------------------------------------
// Profiling

void calibrate_kvmix(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const Params& o = ctx.options;
  const auto dir = std::filesystem::path(o.get("longbench").empty() ? ctx.data_dir + "/longbench" : o.get("longbench"));
  if (!std::filesystem::is_directory(dir))
    fail(
        "kvbench calibrate kvmix: {} is not a directory of LongBench files (<dataset>.jsonl); give --data DIR "
        "holding longbench/ or -o longbench=DIR",
        dir.string());
  const auto& known = TaskRegistry::get().info("longbench").options;
  std::vector<std::string> valid;
  for (const auto& p : known)
    if (p.name == "dataset") valid = p.choices;
  std::vector<std::string> datasets;
  for (const auto& e : std::filesystem::directory_iterator(dir))
    if (e.path().extension() == ".jsonl" &&
        std::find(valid.begin(), valid.end(), e.path().stem().string()) != valid.end())
      datasets.push_back(e.path().stem().string());
  std::sort(datasets.begin(), datasets.end());
  if (datasets.empty()) fail("kvbench calibrate kvmix: no LongBench <dataset>.jsonl in {}", dir.string());

  std::vector<std::unique_ptr<Task>> tasks;
  for (const auto& ds : datasets) {
    TaskContext tc;
    tc.tokenizer = &ctx.tokenizer;
    tc.data_dir = dir.parent_path().string();
    tc.options = {{"dataset", ds}, {"max_len", "10000000"}};
    tasks.push_back(TaskRegistry::get().create("longbench", tc));
  }
  // Round robin over the datasets: sample i of each in turn.
  const int want = o.integer("prompts");
  const int max_tokens = o.integer("max_tokens");
  std::vector<std::vector<int32_t>> prompts;
  std::vector<std::string> prompt_ids;
  for (size_t i = 0; static_cast<int>(prompts.size()) < want; ++i) {
    bool any = false;
    for (size_t t = 0; t < tasks.size() && static_cast<int>(prompts.size()) < want; ++t) {
      if (i >= tasks[t]->size()) continue;
      any = true;
      const Sample s = tasks[t]->sample(i);
      auto ids = build_prompt(ctx.model, ctx.tokenizer, s.prompt, false);
      if (static_cast<int>(ids.size()) > max_tokens) ids.resize(size_t(max_tokens));
      if (ids.size() < 2) continue;
      prompts.push_back(std::move(ids));
      prompt_ids.push_back(datasets[t] + "/" + s.id);
    }
    if (!any) break;
  }
  if (static_cast<int>(prompts.size()) < want)
    fail("kvbench calibrate kvmix: {} prompts asked, the files in {} hold {}", want, dir.string(), prompts.size());

  ModelGradients mg(ctx.model);
  std::set<std::string> names;
  for (int l = 0; l < cfg.n_layers; ++l) {
    names.insert(fmt::format("blk.{}.attn_k.weight", l));
    names.insert(fmt::format("blk.{}.attn_v.weight", l));
  }
  size_t total = 0;
  for (const auto& p : prompts) total += p.size();
  Progress bar("kvmix profile", total, "tok");
  const auto t0 = std::chrono::steady_clock::now();
  std::vector<std::vector<double>> sk, sv;
  std::vector<double> losses;
  for (const auto& p : prompts) {
    const LossGradients g = mg.compute(p, names);
    std::vector<double> k(size_t(cfg.n_layers)), v(size_t(cfg.n_layers));
    auto fro = [](const std::vector<float>& x) {
      double s = 0;
      for (float e : x) s += double(e) * e;
      return std::sqrt(s);
    };
    for (int l = 0; l < cfg.n_layers; ++l) {
      k[size_t(l)] = fro(g.grads.at(fmt::format("blk.{}.attn_k.weight", l)));
      v[size_t(l)] = fro(g.grads.at(fmt::format("blk.{}.attn_v.weight", l)));
    }
    sk.push_back(std::move(k));
    sv.push_back(std::move(v));
    losses.push_back(g.loss);
    bar.advance(p.size(), fmt::format("loss {:.3f}", g.loss));
  }
  bar.finish();
  const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  std::vector<double> mk(size_t(cfg.n_layers), 0.0), mv(mk);
  for (size_t p = 0; p < sk.size(); ++p)
    for (int l = 0; l < cfg.n_layers; ++l) {
      mk[size_t(l)] += sk[p][size_t(l)] / double(sk.size());
      mv[size_t(l)] += sv[p][size_t(l)] / double(sv.size());
    }
  const int high = high_count(o.get_float("high_fraction"), cfg.n_layers);
  const auto hk = top_layers(mk, high), hv = top_layers(mv, high);

  nlohmann::json body;
  body["header"] = artifact_header("kvmix", cfg, ctx.model.path());
  body["header"]["profile"] = {
      {"procedure",
       "mean over prompts of ||dL/dW||_F per layer for attn_k and attn_v; L the mean next-token "
       "cross-entropy of the prompt (fp32 backward pass, no padding)"},
      {"longbench_dir", dir.string()},
      {"datasets", datasets},
      {"prompts", prompt_ids},
      {"prompt_tokens", prompts},  // the exact ids profiled, for independent references
      {"max_tokens", max_tokens},
      {"tokens", total},
      {"losses", losses},
      {"high_fraction", o.get_float("high_fraction")},
      {"seconds", seconds},
      {"tokens_per_second", double(total) / seconds}};
  body["s_k"] = mk;
  body["s_v"] = mv;
  body["per_prompt"] = {{"s_k", sk}, {"s_v", sv}};
  body["high_k"] = hk;
  body["high_v"] = hv;
  const std::string path = ctx.out.empty() ? default_artifact_path("kvmix", cfg) : ctx.out;
  write_artifact(path, body);
  fmt::print(
      "kvmix profile: {} prompts, {} tokens in {:.0f} s ({:.1f} tok/s); high-bit key layers {}, value "
      "layers {}; written to {}\n",
      prompts.size(), total, seconds, double(total) / seconds, nlohmann::json(hk).dump(), nlohmann::json(hv).dump(),
      path);
}

// ---------------------------------------------------------------------------------------------------
// Inference

class Kvmix final : public Method {
 public:
  void setup() override {
    const ModelConfig& m = model();
    const Params& p = params();
    for (const char* b : {"v_high", "v_low"})
      if (p.get_int(b) == 3) fail("method kvmix: {}=3: 3-bit values are not supported (use 2 or 4)", b);
    const int group = p.integer("group");
    if (m.head_dim % group != 0)
      fail("method kvmix: group={} does not divide the head dimension {}", group, m.head_dim);
    const int high = high_count(p.get_float("high_fraction"), m.n_layers);
    const std::string& layers = p.get("layers");
    std::vector<int> hk, hv;
    if (layers == "profile") {
      const LoadedArtifact a = load_artifact("kvmix", p.get("profile"), m, "kvbench calibrate kvmix MODEL");
      digest_ = a.digest;
      source_ = a.path;
      auto norms = [&](const char* key) {
        if (!a.body.contains(key) || !a.body[key].is_array() || a.body[key].size() != size_t(m.n_layers))
          fail("{}: field '{}' must list {} per-layer gradient norms", a.path, key, m.n_layers);
        std::vector<double> v;
        for (const auto& x : a.body[key]) {
          if (!x.is_number() || !(x.get<double>() >= 0))
            fail("{}: field '{}' holds {}, expected a norm >= 0", a.path, key, x.dump());
          v.push_back(x.get<double>());
        }
        return v;
      };
      hk = top_layers(norms("s_k"), high);
      hv = top_layers(norms("s_v"), high);
    } else if (layers == "random") {
      std::mt19937 rng(static_cast<uint32_t>(p.get_int("seed")));
      auto pick = [&] {
        std::vector<int> all(size_t(m.n_layers));
        std::iota(all.begin(), all.end(), 0);
        std::shuffle(all.begin(), all.end(), rng);
        all.resize(size_t(high));
        std::sort(all.begin(), all.end());
        return all;
      };
      hk = pick();
      hv = pick();
    }
    layouts_.assign(size_t(m.n_layers), {});
    for (int l = 0; l < m.n_layers; ++l) {
      const bool k_hi = std::binary_search(hk.begin(), hk.end(), l), v_hi = std::binary_search(hv.begin(), hv.end(), l);
      KvmixLayout& L = layouts_[size_t(l)];
      L.k_bits = p.integer(k_hi ? "k_high" : "k_low");
      L.v_bits = p.integer(v_hi ? "v_high" : "v_low");
      L.k_group = L.k_bits == 3 ? 11 : group;  // 11 codes per word for 3 bits
      L.v_group = group;
      L.k_rpc = p.get_float(k_hi ? "rpc_high" : "rpc_low");
      L.v_rpc = p.get_float(v_hi ? "rpc_high" : "rpc_low");
      L.v_move = 32;
      L.residual = p.integer("residual");
      L.fused = p.get_bool("fused");
      KvmixSegment check(m.head_dim, L);  // validates bit widths and groups now, not mid-sweep
    }
  }

  LayerCache compress(const PrefillView& v, const Budget&) override {
    // Native: one store per KV head, shared by its query heads. Repeat: a copy per query head.
    const int hkv = v.n_kv_heads, d = v.head_dim, stored = stored_heads(), G = stored / hkv;
    const KvmixLayout& L = layouts_.at(size_t(v.layer));
    LayerCache cache(v.n_heads, stored, d);
    size_t kq = 0, vq = 0;
    for (int s = 0; s < stored; ++s) {
      const int g = s / G;
      auto seg = std::make_unique<KvmixSegment>(d, L, v.kv_dtype);
      seg->append(v.k + size_t(g) * d, v.v + size_t(g) * d, v.n_tokens, v.positions, size_t(hkv) * d);
      kq += seg->size() - seg->k_buffer();
      vq += seg->size() - seg->v_buffer();
      cache.segments(s).push_back(std::move(seg));
    }
    stats_ = {{"layer", v.layer}, {"k_bits", L.k_bits},       {"v_bits", L.v_bits},      {"k_rpc", L.k_rpc},
              {"v_rpc", L.v_rpc}, {"k_quantized_tokens", kq}, {"v_quantized_tokens", vq}};
    if (L.residual) stats_["residual"] = L.residual;
    return cache;
  }

  nlohmann::json layer_stats() const override { return stats_; }

  nlohmann::json artifacts() const override {
    if (source_.empty()) return nullptr;
    return {{"kvmix_profile", {{"file", source_}, {"digest", digest_}}}};
  }

 private:
  std::vector<KvmixLayout> layouts_;
  std::string digest_, source_;
  nlohmann::json stats_;
};

const bool registered = register_method(
    {.name = "kvmix",
     .summary = "mixed 2/3/4-bit keys and values by layer from a gradient profile, with full-precision recent tokens",
     .params = {ParamSpec::choice("layers", "profile", {"profile", "random", "low"},
                                  "which layers get the high bit widths: the profile's most sensitive, a random "
                                  "set of the same size (the paper's random-k2.19v2.38), or none (KVmix-2bit)"),
                ParamSpec::text("profile", "", "profile file (default: this model's from kvbench calibrate kvmix)"),
                ParamSpec::real("high_fraction", 0.2, 0.0, 1.0, "share of layers with high bit widths, floor(f L)"),
                ParamSpec::integer("k_high", 3, 1, 4,
                                   "key bits of high layers (3: 11 codes per word, 11-token groups)"),
                ParamSpec::integer("k_low", 2, 1, 4, "key bits of the other layers"),
                ParamSpec::integer("v_high", 4, 1, 4, "value bits of high layers (1, 2 or 4)"),
                ParamSpec::integer("v_low", 2, 1, 4, "value bits of the other layers (1, 2 or 4)"),
                ParamSpec::real("rpc_high", 0.2, 0.0, 1.0,
                                "recent pivotal context ratio of high layers (paper 0.2; 0 for w/o RPC)"),
                ParamSpec::real("rpc_low", 0.1, 0.0, 1.0,
                                "recent pivotal context ratio of the other layers (paper 0.1)"),
                ParamSpec::integer("group", 32, 1, 4096,
                                   "group size: tokens per key group (not 3-bit) and channels per value group"),
                ParamSpec::integer("seed", 0, 0, 2147483647, "seed of layers=random"),
                ParamSpec::integer("residual", 0, 0, 1 << 20,
                                   "> 0: KIVI's residual rule instead of the recent-context ratios: keys quantized "
                                   "in whole blocks of this many tokens, values keep this many most recent at full "
                                   "precision (method kivi sets it)")
                    .added_later(),
                ParamSpec::boolean("fused", true,
                                   "attention reads the codes directly; false dequantizes first (the benchmark's "
                                   "baseline; same outputs)")},
     .make = [] { return std::make_unique<Kvmix>(); },
     .steps = {{.options = {ParamSpec::text("longbench", "",
                                            "directory of LongBench <dataset>.jsonl files (default: <data>/longbench)"),
                            ParamSpec::integer("prompts", 30, 1, 100000, "prompts, round robin over the datasets"),
                            ParamSpec::integer("max_tokens", 1024, 2, 10000000, "each prompt's first tokens"),
                            ParamSpec::real("high_fraction", 0.2, 0.0, 1.0, "share of layers reported as high")},
                .run = calibrate_kvmix}},
     .budgeted = false});

}  // namespace
}  // namespace kvb
