#include "harness/method/method.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "harness/method/artifact.hpp"
#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {

std::string gqa_mode_name(GqaMode m) { return m == GqaMode::Native ? "native" : "repeat"; }

namespace {
ParamSpec gqa_param() {
  return ParamSpec::choice("gqa", "native", {"native", "repeat"},
                           "native: select per KV head (scores averaged over its query heads); "
                           "repeat: per query head over repeated K/V, as the papers' code");
}
}  // namespace

MethodRegistry& MethodRegistry::get() {
  static MethodRegistry r;
  return r;
}

void MethodRegistry::add(MethodInfo info) {
  if (methods_.count(info.name)) fail("method '{}' is registered twice", info.name);
  for (auto& step : info.steps) {
    if (step.name.empty()) step.name = info.name;
    if (step.summary.empty()) step.summary = info.summary;
    for (const auto& [other, i] : methods_)
      for (const auto& s : i.steps)
        if (s.command == step.command && s.name == step.name)
          fail("offline step '{} {}' of method {} is registered twice (also by {})", step.command, step.name, info.name,
               other);
  }
  methods_.emplace(info.name, std::move(info));
}

void MethodRegistry::replace(MethodInfo info) {
  if (!methods_.count(info.name)) fail("internal: method '{}' is not registered, so cannot be replaced", info.name);
  methods_.erase(info.name);
  add(std::move(info));
}

bool register_method(MethodInfo info) {
  MethodRegistry::get().add(std::move(info));
  return true;
}

const MethodInfo& MethodRegistry::info(const std::string& name) const {
  auto it = methods_.find(name);
  if (it == methods_.end() && resolver_ && resolver_(name)) it = methods_.find(name);
  if (it == methods_.end()) {
    if (name.rfind("python:", 0) == 0)
      fail(
          "method '{}' is written in Python: it runs through the Python module (kvbench.run, kvbench.Model."
          "generate), not the command line",
          name);
    fail("unknown method '{}' (available: {})", name, fmt::join(names(), ", "));
  }
  return it->second;
}

std::vector<std::string> MethodRegistry::names() const {
  std::vector<std::string> n;
  for (const auto& [k, v] : methods_) n.push_back(k);
  return n;
}

std::vector<std::string> MethodRegistry::names(Composition role) const {
  std::vector<std::string> n;
  for (const auto& [k, v] : methods_)
    if (v.composition == role) n.push_back(k);
  return n;
}

OfflineStep MethodRegistry::offline_step(const std::string& command, const std::string& name) const {
  std::vector<std::string> known;
  for (const auto& [method, info] : methods_)
    for (const auto& s : info.steps)
      if (s.command == command) {
        if (s.name == name) return s;
        known.push_back(s.name);
      }
  fail("kvbench {}: no offline step '{}' (available: {})", command, name, fmt::join(known, ", "));
}

std::vector<ParamSpec> MethodRegistry::param_specs(const std::string& name) const {
  auto specs = info(name).params;
  specs.push_back(gqa_param());
  return specs;
}

Params MethodRegistry::resolve(const std::string& name, const std::map<std::string, std::string>& given) const {
  auto specs = param_specs(name);
  if (info(name).composition == Composition::Wrapper) {
    // The base's own parameters join the wrapper's as base.NAME; its GQA mode is the wrapper's.
    auto spec = std::find_if(specs.begin(), specs.end(), [](const ParamSpec& p) { return p.name == "base"; });
    if (spec == specs.end()) fail("internal: wrapper method {} declares no 'base' parameter", name);
    const auto it = given.find("base");
    const std::string base = it == given.end() ? spec->default_value : it->second;
    if (!methods_.count(base) || methods_.at(base).composition != Composition::Selector)
      fail("method {}: base '{}' cannot be wrapped; a base must be a method that selects tokens by score: {}", name,
           base, fmt::join(names(Composition::Selector), ", "));
    for (ParamSpec p : info(base).params) {
      p.name = "base." + p.name;
      specs.push_back(std::move(p));
    }
  }
  return Params(specs, given, "method " + name);
}

std::unique_ptr<Method> MethodRegistry::create(const std::string& name,
                                               const std::map<std::string, std::string>& params,
                                               const ModelConfig& model) const {
  const MethodInfo& mi = info(name);
  auto m = mi.make();
  m->name_ = name;
  m->params_ = resolve(name, params);
  m->gqa_ = m->params_.get("gqa") == "repeat" ? GqaMode::Repeat : GqaMode::Native;
  m->budgeted_ = info(name).budgeted;
  m->changes_model_ = info(name).changes_model;
  m->model_ = &model;
  ArtifactReads reads;
  try {
    m->setup();
  } catch (const nlohmann::json::exception& e) {
    // A hand-edited artifact whose field has another type than the method reads: the library's message
    // carries the field's path (JSON_DIAGNOSTICS); the files are those setup() read.
    const auto& files = reads.paths();
    fail("method {}: {} has a field of the wrong type: {}", name,
         files.empty()       ? std::string("an artifact it reads")
         : files.size() == 1 ? files.front()
                             : fmt::format("one of the artifacts it reads ({})", fmt::join(files, ", ")),
         json_error_text(e));
  }
  return m;
}

LayerCache Method::compress(const PrefillView& view, const Budget& budget) {
  auto s = select(view, budget);
  if (!s) fail("internal: method {} has neither compress() nor select()", name());
  return gather(view, gqa(), s->keep);
}

size_t dense_layer_bytes(const ModelConfig& m, GqaMode gqa, int tokens) {
  const int heads = gqa == GqaMode::Repeat ? m.n_heads : m.n_kv_heads;
  return size_t(tokens) * heads * m.head_dim * 2 * sizeof(float);
}

KvBudget KvBudget::compression_ratio(double p_c) {
  if (!(p_c > 0 && p_c < 1))
    fail("compression ratio {} is outside (0, 1): it is the fraction of the prompt removed", p_c);
  KvBudget b;
  b.ratio = p_c;
  return b;
}

int KvBudget::tokens_for(int prompt_tokens) const {
  if (!is_ratio()) return tokens;
  return std::max(1, static_cast<int>(std::floor(prompt_tokens * (1 - ratio))));
}

std::string KvBudget::name() const {
  if (is_ratio()) return fmt::format("p_c={}", ratio);
  return tokens ? std::to_string(tokens) : "Full";
}

MethodRunner::MethodRunner(Method& method, KvBudget budget) : method_(method), asked_(budget) {
  if (!method.budgeted()) {
    if (!budget.is_full())
      fail("method {} takes no KV size or compression ratio (it sets its own memory); run it without a budget",
           method.name());
    return;
  }
  if (!budget.is_ratio() && budget.tokens <= 0)
    fail("budget must be a positive number of tokens, got {}", budget.tokens);
  // A KV size the method cannot hold (below its window) is refused whatever the prompt; a ratio's T
  // depends on the prompt, and a short one's may fall below the window (select_top keeps part of it).
  if (!budget.is_ratio()) method.check_budget(budget.tokens);
  budget_.tokens = budget.tokens;
  budget_.bytes_per_layer = dense_layer_bytes(method.model(), method.gqa(), budget.tokens);
}

void MethodRunner::on_layer(const PrefillView& view, LayerCache& cache) {
  const auto t0 = std::chrono::steady_clock::now();
  if (asked_.is_ratio() && view.layer == 0) {
    budget_.tokens = asked_.tokens_for(view.n_tokens);
    budget_.bytes_per_layer = dense_layer_bytes(method_.model(), method_.gqa(), budget_.tokens);
    budget_.compression_ratio = asked_.ratio;
  }
  if (method_.budgeted() && method_.keeps_whole_prompt(view.n_tokens, budget_.tokens) && !method_.kv_transform() &&
      !method_.linear_transform()) {
    // The prompt fits: every method keeps everything (reference repos skip compression here). A method
    // that changes the model always builds its own cache.
    cache = keep_all(view, method_.gqa());
  } else {
    compressed_ = true;
    cache = method_.compress(view, budget_);
  }
  cache.store_as(view.kv_dtype);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
  bytes_ += cache.bytes();
  for (int h = 0; h < cache.n_cache_heads(); ++h) {
    size_t kept = 0;
    for (const auto& seg : cache.segments(h)) {
      format_tokens_[seg->format()] += seg->size();
      kept += seg->size();
    }
    min_head_ = std::min(min_head_, kept);
    max_head_ = std::max(max_head_, kept);
    prompt_slots_ += size_t(view.n_tokens);
  }
  if (compressed_) {
    auto stats = method_.layer_stats();
    if (!stats.is_null()) layer_stats_.push_back(std::move(stats));
  }
  // A method may shift memory between layers (PyramidKV) but not exceed the total.
  const size_t limit =
      budget_.bytes_per_layer / sizeof(float) * kv_dtype_bytes(view.kv_dtype) * size_t(method_.model().n_layers);
  if (view.layer + 1 == method_.model().n_layers && compressed_ && bytes_ > limit && method_.budgeted() &&
      !method_.may_exceed_budget())
    fail("method {} kept {} bytes, more than its budget of {} bytes (KV size {})", method_.name(), bytes_, limit,
         budget_.tokens);
}

void MethodRunner::on_prompt(Engine& engine, std::span<const int32_t> ids) {
  // Its cost is the method's: KVzip's passes over the context are most of its compression time.
  const auto t0 = std::chrono::steady_clock::now();
  method_.on_prompt(engine, ids);
  seconds_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

nlohmann::json MethodRunner::cache_profile() const {
  size_t kept = 0;
  for (const auto& [f, n] : format_tokens_) kept += n;
  nlohmann::json p = {{"budget_tokens", budget_.tokens},
                      {"formats", format_tokens_},
                      {"evicted", prompt_slots_ - std::min(prompt_slots_, kept)},
                      {"tokens_per_head", {{"min", min_head_ == SIZE_MAX ? 0 : min_head_}, {"max", max_head_}}}};
  if (!layer_stats_.empty()) p["layers"] = layer_stats_;
  return p;
}

MethodChoice choose_method(const std::string& name, const std::map<std::string, std::string>& params, int budget,
                           const ModelConfig& model, const std::string& who) {
  MethodChoice c;
  if (budget < 0) fail("{}: budget {}: a KV size must be > 0 (or 0 for none)", who, budget);
  if (name.empty() || (name == "fullkv" && budget <= 0)) {
    if (budget > 0 || !params.empty()) fail("{}: a budget and parameters need a method", who);
    return c;
  }
  c.method = MethodRegistry::get().create(name, params, model);
  if (c.method->budgeted() && budget <= 0) fail("{}: method {} needs a budget (KV size T)", who, name);
  if (!c.method->budgeted() && budget > 0) fail("{}: method {} takes no budget: it sets its own memory", who, name);
  c.runner = std::make_unique<MethodRunner>(*c.method, c.method->budgeted() ? KvBudget(budget) : KvBudget{});
  return c;
}

}  // namespace kvb
