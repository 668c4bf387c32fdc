#pragma once
// KV-cache compression methods: small classes registered by name, built from the shared parts in
// parts.hpp. A method sees each layer after the full-attention prefill (PrefillView) and returns
// what that layer's cache keeps; it may also act at every decode step.
#include <functional>
#include <map>
#include <memory>
#include <nlohmann/json.hpp>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/prefill_view.hpp"
#include "harness/model/config.hpp"
#include "harness/util/params.hpp"

namespace kvb {

// How grouped-query attention is handled, for every method alike:
// native: select per KV head, scores averaged over the group's query heads (one K/V copy per KV head);
// repeat: K/V repeated to every query head, each selecting its own tokens (the papers' code).
enum class GqaMode { Native, Repeat };
std::string gqa_mode_name(GqaMode m);

// "KV size T": the memory of T full-precision tokens per stored head per layer.
struct Budget {
  int tokens = 0;  // T
  // T x stored heads x head_dim x 2 x 4 bytes: methods build their caches in fp32, and the runner then
  // stores them at the run's dtype, which scales the bytes of every budgeted format alike.
  size_t bytes_per_layer = 0;
  double compression_ratio = 0;  // p_c when the run asked for a ratio (T = floor(S (1 - p_c))), else 0
};

// What a run asks for: a KV size T, or a compression ratio p_c, the fraction of the prompt removed
// (kvpress, VECTOR): T = floor(S (1 - p_c)) for a prompt of S tokens, window included, so that every
// prompt is compressed.
struct KvBudget {
  int tokens = 0;    // T, in KV-size mode
  double ratio = 0;  // p_c in (0, 1), in ratio mode
  KvBudget() = default;
  KvBudget(int t) : tokens(t) {}  // NOLINT(google-explicit-constructor): a KV size is the usual budget
  static KvBudget compression_ratio(double p_c);
  bool is_ratio() const { return ratio > 0; }
  bool is_full() const { return tokens == 0 && ratio == 0; }
  int tokens_for(int prompt_tokens) const;
  std::string name() const;  // "128", "p_c=0.5", "Full"
  auto operator<=>(const KvBudget&) const = default;
};

struct DecodeView {
  int layer = 0;
  int32_t position = 0;      // position of the token just appended
  const float* q = nullptr;  // its post-RoPE queries [n_heads, head_dim]
  int budget_tokens = 0;     // T
};

// scores[h][j] for query heads h < Hq and prefix positions j < S - w.
using HeadScores = std::vector<std::vector<float>>;

// What an eviction method decided for one layer before its cache is built. A wrapper (KVCrush,
// VECTOR) asks its base method for this and changes the decision.
struct Selection {
  HeadScores query_scores;                 // the base's token scores per query head, before GQA reduction
  HeadScores scores;                       // per stored head, as the base ranked them (query_scores reduced for GQA)
  std::vector<std::vector<int32_t>> keep;  // per stored head: kept positions, ascending, window included
  int window = 0;                          // the last `window` prompt positions, kept by every head
};

class CalibrationContext;

class Method {
 public:
  virtual ~Method() = default;

  // Called once the parameters are set: loads what the method reads (artifacts), so that a missing
  // one is reported before any work starts.
  virtual void setup() {}
  // What the method needs from prefill besides K and V.
  virtual PrefillNeeds needs() const { return {}; }
  // An error if the method cannot hold a KV size of `tokens` (smaller than an always-kept window), for
  // any prompt: MethodRunner asks when it is made with a KV size, and a sweep before any cell runs, so
  // that --dry-run says so.
  virtual void check_budget(int /*tokens*/) const {}
  // The layer's cache for decoding. Called where keeps_whole_prompt() is false. By default the dense
  // cache of select()'s kept positions.
  virtual LayerCache compress(const PrefillView& view, const Budget& budget);
  // Eviction methods that score tokens and keep the best (those a wrapper can wrap) return their
  // decision here; others return nullopt and override compress().
  virtual std::optional<Selection> select(const PrefillView&, const Budget&) { return std::nullopt; }
  // After each decode step's attention, with the new token already in the cache.
  virtual void on_decode(LayerCache&, const DecodeView&) {}
  // Whether on_decode does anything (the engine skips the call otherwise).
  virtual bool acts_on_decode() const { return false; }
  // Whether the method holds one sequence's state from its prefill into its decoding (H2O's running
  // scores, DynaKV's latent store): a batch of sequences then needs a method each (kvbench bench).
  virtual bool keeps_sequence_state() const { return acts_on_decode(); }
  // A method that decides from the whole prompt (KVzip runs the model over the context again) returns
  // true; on_prompt then sees the engine and the prompt's ids after every layer's prefill and before
  // the first compress() (PrefillObserver::reads_whole_prompt).
  virtual bool reads_whole_prompt() const { return false; }
  virtual void on_prompt(Engine& /*engine*/, std::span<const int32_t> /*ids*/) {}
  // The offline artifacts the method read (file, digest), part of every result's key; null if none.
  virtual nlohmann::json artifacts() const { return nullptr; }
  // What the last compress() decided beyond the cache itself (e.g. a Lagrange multiplier), for the
  // record of the sample; null when there is nothing to report.
  virtual nlohmann::json layer_stats() const { return nullptr; }
  // False for a method registered with budgeted = false (MethodInfo).
  bool budgeted() const { return budgeted_; }
  // True only for settings that reproduce a reference's known overshoot (PyramidKV's floored
  // schedule); the runner then reports the bytes instead of refusing them.
  virtual bool may_exceed_budget() const { return false; }
  // Whether a prompt of n_tokens within a KV size of budget_tokens is kept whole, uncompressed, as the
  // reference repos skip compression there. A paged method sees every prompt (the prompt's attention
  // starts the scores decoding evicts by, and its limit is not T); HeadKV's reference compresses a
  // prompt of exactly T tokens too, its heads' budgets uneven.
  virtual bool keeps_whole_prompt(int n_tokens, int budget_tokens) const { return n_tokens <= budget_tokens; }
  // False for a method registered with changes_model = true: a sweep gives its cells their own prefill
  // instead of the full-attention one shared by the others.
  bool shares_prefill() const { return !changes_model_; }
  // Non-null for a method that changes the model's keys and values before attention (DynaKV); such a
  // method registers with changes_model = true.
  virtual KvTransform* kv_transform() { return nullptr; }
  // Non-null for a method that changes the model's linear products (Atom's quantized weights and
  // activations); it too registers with changes_model = true.
  virtual LinearTransform* linear_transform() { return nullptr; }

  const std::string& name() const { return name_; }
  const Params& params() const { return params_; }
  GqaMode gqa() const { return gqa_; }
  const ModelConfig& model() const { return *model_; }
  // Stored heads per layer under the GQA mode.
  int stored_heads() const { return gqa_ == GqaMode::Repeat ? model_->n_heads : model_->n_kv_heads; }

 private:
  friend class MethodRegistry;
  std::string name_;
  Params params_;
  GqaMode gqa_ = GqaMode::Native;
  bool budgeted_ = true;        // MethodInfo::budgeted, copied at creation
  bool changes_model_ = false;  // MethodInfo::changes_model, copied at creation
  const ModelConfig* model_ = nullptr;
};

// How a method composes with others: a selector's select() can be wrapped; a wrapper takes a selector
// as its parameter `base` (with the base's parameters as base.NAME) and changes its decision.
enum class Composition { Standalone, Selector, Wrapper };

// A method's offline step: `kvbench calibrate NAME MODEL` (command "calibrate") or `kvbench train NAME
// MODEL` (command "train"), with the options declared here, profiling or fitting on the model and
// writing the artifact the method loads (artifact.hpp).
struct OfflineStep {
  std::string command = "calibrate";
  std::string name = {};     // empty: the method's name
  std::string summary = {};  // empty: the method's summary
  std::vector<ParamSpec> options = {};
  std::function<void(CalibrationContext&)> run = {};
};

struct MethodInfo {
  std::string name = {};
  std::string summary = {};
  std::vector<ParamSpec> params = {};  // the method's own; `gqa` is added for all
  std::function<std::unique_ptr<Method>()> make = {};
  // Its offline steps, if it has any (HeadKV's profiling, DynaKV's PCA and training).
  std::vector<OfflineStep> steps = {};
  Composition composition = Composition::Standalone;
  // False for a method that sets its own memory rather than fitting a KV size (quantization: KVmix).
  // It runs once per configuration with no budget (like fullkv in a sweep) and always compresses.
  bool budgeted = true;
  // True for a method that changes the model (kv_transform) or prefill itself (evicting while it
  // prefills): a sweep gives it its own prefill, and tests that drive methods with synthetic prefill
  // views leave it out.
  bool changes_model = false;
};

class MethodRegistry {
 public:
  static MethodRegistry& get();
  void add(MethodInfo info);
  // The method of info.name, registered before, becomes `info` (a Python method registered again after
  // its class was edited). Methods made from the old one keep working.
  void replace(MethodInfo info);
  const MethodInfo& info(const std::string& name) const;  // Error listing the methods if unknown
  std::vector<std::string> names() const;
  // All parameters of a method, `gqa` included (a wrapper's base.NAME parameters are not listed).
  std::vector<ParamSpec> param_specs(const std::string& name) const;
  // The method's parameters validated and completed with defaults; for a wrapper, also its base's
  // (base.NAME keys, validated against the base, every one filled in), so that results are keyed by
  // the whole composition. Errors name the method, the base and the parameter.
  Params resolve(const std::string& name, const std::map<std::string, std::string>& given) const;
  // The offline step `kvbench COMMAND NAME` runs, of whichever method declares it; Error listing the
  // steps of that command if there is none.
  OfflineStep offline_step(const std::string& command, const std::string& name) const;
  // Names of the methods with the given composition role.
  std::vector<std::string> names(Composition role) const;
  std::unique_ptr<Method> create(const std::string& name, const std::map<std::string, std::string>& params,
                                 const ModelConfig& model) const;
  // Asked about a name the registry does not know, before that is an error: a front end that makes
  // methods on demand (the Python module, for "python:module.Class") registers it and returns true.
  void set_resolver(std::function<bool(const std::string&)> resolver) { resolver_ = std::move(resolver); }

 private:
  std::function<bool(const std::string&)> resolver_;
  std::map<std::string, MethodInfo> methods_;
};

// Registers a method from its own file: static const bool reg = register_method({...});
bool register_method(MethodInfo info);

// Bytes of `tokens` dense tokens for every stored head of one layer.
size_t dense_layer_bytes(const ModelConfig& m, GqaMode gqa, int tokens);

// Runs a method as the engine's prefill observer: keeps everything when the prompt fits the budget,
// otherwise asks the method, and checks the bytes it returns. A method without a budget (KVmix) gets
// KvBudget{} and compresses every prompt.
class MethodRunner : public PrefillObserver {
 public:
  MethodRunner(Method& method, KvBudget budget);
  PrefillNeeds needs() const override { return method_.needs(); }
  KvTransform* kv_transform() override { return method_.kv_transform(); }
  LinearTransform* linear_transform() override { return method_.linear_transform(); }
  void on_layer(const PrefillView& view, LayerCache& cache) override;
  bool acts_on_decode() const override { return method_.acts_on_decode(); }
  void on_decode(int layer, LayerCache& cache, const float* q, int32_t pos) override {
    method_.on_decode(cache, DecodeView{layer, pos, q, budget_.tokens});
  }
  bool reads_whole_prompt() const override { return method_.reads_whole_prompt(); }
  void on_prompt(Engine& engine, std::span<const int32_t> ids) override;

  // In ratio mode, T is known once the prompt is: after the first layer.
  const Budget& budget() const { return budget_; }
  bool compressed() const { return compressed_; }
  // What the prefill left in the caches, for the record: tokens kept per segment format (the width
  // histogram of mixed-dimension caches), tokens evicted, the range of tokens kept per stored head
  // (ragged per-head budgets), and the method's per-layer stats when it reports any.
  nlohmann::json cache_profile() const;
  size_t prefill_kv_bytes() const { return bytes_; }  // bytes kept after prefill, all layers
  double compress_seconds() const { return seconds_; }

 private:
  Method& method_;
  KvBudget asked_;
  Budget budget_;
  bool compressed_ = false;
  size_t bytes_ = 0;
  double seconds_ = 0;
  std::map<std::string, size_t> format_tokens_;
  size_t prompt_slots_ = 0;  // prompt tokens x stored heads, summed over layers
  size_t min_head_ = SIZE_MAX, max_head_ = 0;
  nlohmann::json layer_stats_ = nlohmann::json::array();
};

// A method as a command or the Python module names it, with its runner: "" (or "fullkv" without a
// budget) is none, the full cache (both members null). `budget` is the KV size T of a budgeted method and must be 0 for
// one that sets its own memory (KVmix, DynaKV); `who` starts the error messages ("--method", "Model.logits").
struct MethodChoice {
  std::unique_ptr<Method> method;
  std::unique_ptr<MethodRunner> runner;
};
MethodChoice choose_method(const std::string& name, const std::map<std::string, std::string>& params, int budget,
                           const ModelConfig& model, const std::string& who);

}  // namespace kvb
