#pragma once
// KV-cache compression methods: small classes registered by name, built from the shared parts in
// parts.hpp. A method sees each layer after the full-attention prefill (PrefillView) and returns
// what that layer's cache keeps; it may also act at every decode step.
#include <functional>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/prefill_view.hpp"
#include "harness/method/params.hpp"
#include "harness/model/config.hpp"

namespace kvb {

// How grouped-query attention is handled, for every method alike:
// native: select per KV head, scores averaged over the group's query heads (one K/V copy per KV head);
// repeat: K/V repeated to every query head, each selecting its own tokens (the papers' code).
enum class GqaMode { Native, Repeat };
std::string gqa_mode_name(GqaMode m);

// "KV size T": the memory of T full-precision tokens per stored head per layer.
struct Budget {
  int tokens = 0;                 // T
  size_t bytes_per_layer = 0;     // T x stored heads x head_dim x 2 x bytes per value
};

struct DecodeView {
  int layer = 0;
  int32_t position = 0;    // position of the token just appended
  const float* q = nullptr;  // its post-RoPE queries [n_heads, head_dim]
  int budget_tokens = 0;   // T
};

class CalibrationContext;

class Method {
 public:
  virtual ~Method() = default;

  // What the method needs from prefill besides K and V.
  virtual PrefillNeeds needs() const { return {}; }
  virtual void calibrate(CalibrationContext&) {}
  // The layer's cache for decoding. Called only when the prompt is longer than the budget.
  virtual LayerCache compress(const PrefillView& view, const Budget& budget) = 0;
  // After each decode step's attention, with the new token already in the cache.
  virtual void on_decode(LayerCache&, const DecodeView&) {}
  // Whether on_decode does anything (the engine skips the call otherwise).
  virtual bool acts_on_decode() const { return false; }
  // True only for settings that reproduce a reference's known overshoot (PyramidKV's floored
  // schedule); the runner then reports the bytes instead of refusing them.
  virtual bool may_exceed_budget() const { return false; }
  // False for a method that changes prefill itself (e.g. evicts while prefilling in chunks): a sweep
  // then gives its cells their own prefill instead of the full-attention one shared by the others.
  virtual bool shares_prefill() const { return true; }

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
  const ModelConfig* model_ = nullptr;
};

struct MethodInfo {
  std::string name;
  std::string summary;
  std::vector<ParamSpec> params;  // the method's own; `gqa` is added for all
  std::function<std::unique_ptr<Method>()> make;
};

class MethodRegistry {
 public:
  static MethodRegistry& get();
  void add(MethodInfo info);
  const MethodInfo& info(const std::string& name) const;  // Error listing the methods if unknown
  std::vector<std::string> names() const;
  // All parameters of a method, `gqa` included.
  std::vector<ParamSpec> param_specs(const std::string& name) const;
  std::unique_ptr<Method> create(const std::string& name, const std::map<std::string, std::string>& params,
                                 const ModelConfig& model) const;

 private:
  std::map<std::string, MethodInfo> methods_;
};

// Registers a method from its own file: static const bool reg = register_method({...});
bool register_method(MethodInfo info);

// Bytes of `tokens` dense tokens for every stored head of one layer.
size_t dense_layer_bytes(const ModelConfig& m, GqaMode gqa, int tokens);

// Runs a method as the engine's prefill observer: keeps everything when the prompt fits the budget,
// otherwise asks the method, and checks the bytes it returns.
class MethodRunner : public PrefillObserver {
 public:
  MethodRunner(Method& method, int budget_tokens);
  PrefillNeeds needs() const override { return method_.needs(); }
  void on_layer(const PrefillView& view, LayerCache& cache) override;
  bool acts_on_decode() const override { return method_.acts_on_decode(); }
  void on_decode(int layer, LayerCache& cache, const float* q, int32_t pos) override {
    method_.on_decode(cache, DecodeView{layer, pos, q, budget_.tokens});
  }

  const Budget& budget() const { return budget_; }
  bool compressed() const { return compressed_; }
  size_t prefill_kv_bytes() const { return bytes_; }  // bytes kept after prefill, all layers
  double compress_seconds() const { return seconds_; }

 private:
  Method& method_;
  Budget budget_;
  bool compressed_ = false;
  size_t bytes_ = 0;
  double seconds_ = 0;
};

}  // namespace kvb
