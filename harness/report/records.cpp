#include "harness/report/records.hpp"

#include <fmt/format.h>
#include <algorithm>
#include <cctype>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/report/heatmap.hpp"
#include "harness/report/memory_plot.hpp"
#include "harness/report/report.hpp"
#include "harness/report/stats.hpp"
#include "harness/report/table.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"

namespace kvb::report {
namespace {

// One record (file f, line no) into r.
void add_record(const json& j, const std::string& f, int no, Records& r) {
  json cfg = j["config"];
  if (!cfg.contains("options")) cfg["options"] = json::object();
  Entry e;
  e.task = cfg.value("task", "");
  const TaskLayout& layout = layout_of(e.task);
  const json opts = cfg["options"];
  if (!layout.column_option.empty()) e.variant = opts.value(layout.column_option, layout.default_column);
  if (!layout.length_option.empty()) {
    const std::string length = opts.value(layout.length_option, layout.length_default);
    const auto [end, ec] = std::from_chars(length.data(), length.data() + length.size(), e.length);
    if (ec != std::errc() || end != length.data() + length.size() || e.length <= 0)
      fail("{}:{}: field 'config.options.{}' must be a positive whole number of tokens, not '{}'", f, no,
           layout.length_option, length);
  }
  if (!layout.length_ranges.empty() && j.contains("meta") && j["meta"].contains("length"))
    e.length = j["meta"]["length"].get<int>();
  cfg = pooled_config(j);
  e.context = label_context(cfg);
  Group& g = r.groups[cfg.dump()];
  e.group = &g;
  g.config = cfg;
  g.score += j["score"].get<double>();
  g.strata[e.variant].push_back(j["score"].get<double>());
  const double full = j.value("full_kv_bytes", 0.0);
  e.kv_share = full > 0 ? j.value("kv_bytes", 0.0) / full : 1.0;
  // Records made before the dtype was an option held fp32.
  const KvDtype dtype = parse_kv_dtype(j.value("kv_dtype", std::string("fp32")), fmt::format("{}:{}: kv_dtype", f, no));
  e.fp16_share = e.kv_share * double(kv_dtype_bytes(dtype)) / 2;
  e.bits = 16 * e.fp16_share;
  g.kv_share += e.kv_share;
  g.fp16_share += e.fp16_share;
  g.t_eq += e.fp16_share * j.value("prompt_tokens", 0.0);
  ++g.n;
  // (Both must be looked up: a const json's [] of a missing key is undefined behaviour.)
  if (layout.depth_heatmap && j.contains("meta") && j["meta"].contains("depth") && j["meta"].contains("length")) {
    auto& cell = g.depth_length[{j["meta"]["depth"].get<int>(), j["meta"]["length"].get<int>()}];
    cell.first += j["score"].get<double>();
    ++cell.second;
  }
  e.method = cfg.value("method", "fullkv");
  e.budget = config_budget(cfg);
  e.score = j["score"].get<double>();
  e.unit = sample_unit(j);
  // RULER's evaluate.py turns control characters into line breaks before it strips and counts.
  const std::string prediction = j.value("prediction", "");
  e.empty = true;
  for (size_t i = 0; i < prediction.size() && e.empty;) {
    const uint32_t c = next_cp(prediction, i);
    e.empty = c < 0x20 || python_space(c);
  }
  // labelled below; the dtype is shown where it is not fp32
  e.params = cfg.value("params", json::object());
  e.dtype = cfg.value("kv_dtype", std::string("fp32"));
  e.model = cfg.value("model", std::string());
  e.gqa = cfg.value("gqa", "-");
  r.entries.push_back(e);
}

}  // namespace

double record_score(const json& record, const std::string& where) {
  const double s = record["score"].get<double>();
  const std::string task = record["config"].value("task", "");
  if (layout_of(task).perplexity) {
    if (!(s >= 0) || !std::isfinite(s))
      fail("{}: score {} is no mean negative log-likelihood (a finite number >= 0 for task {})", where, s, task);
  } else if (!(s >= 0 && s <= 1)) {
    fail("{}: score {} is outside [0, 1], the scale of task {}'s records", where, s, task);
  }
  return s;
}

json pooled_config(const json& record) {
  json cfg = record["config"];
  if (!cfg.contains("options")) cfg["options"] = json::object();
  // Runs over different parts of one grid belong to one configuration.
  for (const auto& k : layout_of(cfg.value("task", "")).pooled_options) cfg["options"].erase(k);
  cfg.erase("version");
  return cfg;
}

std::string sample_unit(const json& record) {
  const std::string id = record.value("id", std::string());
  if (id.empty()) return "";
  json cfg = pooled_config(record);
  const std::string task = cfg.value("task", "");
  if (const TaskInfo* info = TaskRegistry::get().find(task))
    for (const auto& k : info->scoring_options) cfg["options"].erase(k);
  return json::array({task, cfg["options"], cfg.value("model", ""), cfg.value("kv_dtype", "fp32"), id}).dump();
}

json run_context(const json& config) {
  // The version is left out: records of several commits pool (an error where their scores differ).
  static const std::set<std::string> shown = {"task",   "options",           "method",   "params", "gqa",
                                              "budget", "compression_ratio", "kv_dtype", "model",  "version"};
  json out = json::object();
  for (const auto& [k, v] : config.items())
    if (!shown.count(k))
      out[k] = v.is_string()      ? v.get<std::string>()
               : k == "artifacts" ? fmt::format("{:08x}", uint32_t(fnv1a(v.dump())))
                                  : v.dump();
  return out;
}

json label_context(const json& config) {
  json out = run_context(config);
  const std::string task = config.value("task", "");
  const TaskLayout& layout = layout_of(task);
  auto shown = [&](const std::string& k) {
    return k == layout.column_option || k == layout.length_option ||
           std::find(layout.pooled_options.begin(), layout.pooled_options.end(), k) != layout.pooled_options.end();
  };
  // Options a record leaves out ran at their defaults: an explicit `chat: false` and none are one setting.
  if (const TaskInfo* info = TaskRegistry::get().find(task))
    for (const ParamSpec& s : info->options)
      if (!shown(s.name)) out[s.name] = s.default_value;
  if (config.contains("options"))
    for (const auto& [k, v] : config["options"].items())
      if (!shown(k)) out[k] = v.is_string() ? v : json(v.dump());
  return out;
}

const TaskLayout& layout_of(const std::string& task) {
  static const TaskLayout none;
  const TaskInfo* info = TaskRegistry::get().find(task);
  return info ? info->layout : none;
}

Scale scale_of(const std::string& task) { return layout_of(task).perplexity ? Scale::Perplexity : Scale::Percent; }

std::vector<std::vector<double>> strata_of(const std::map<std::string, std::vector<double>>& by_variant) {
  std::vector<std::vector<double>> out;
  for (const auto& [variant, scores] : by_variant) out.push_back(scores);
  return out;
}

void for_each_distinct_record(const std::vector<std::string>& files,
                              const std::function<void(const json&, const std::string& file, int line)>& fn) {
  // A cell recorded twice (overlapping files, or two runs appending to one file) counts once; the
  // runs are deterministic, so a second copy with another score means the records disagree.
  std::map<std::string, std::pair<double, std::string>> seen;  // key -> score, where first recorded
  size_t repeated = 0;
  auto again = [&](const std::string& key, const std::string& what, const json& j, const std::string& f, int no) {
    const auto [it, fresh] = seen.try_emplace(key, j["score"].get<double>(), fmt::format("{}:{}", f, no));
    if (fresh) return false;
    if (it->second.first != j["score"].get<double>())
      fail(
          "{}:{}: {} is recorded again with score {}, but {} has {} (runs of different code or data? each record's "
          "version says which commit made it)",
          f, no, what, j["score"].get<double>(), it->second.second, it->second.first);
    ++repeated;
    return true;
  };
  for (const auto& f : files) {
    for_each_record(f, [&](const json& j, int no) {
      record_score(j, fmt::format("{}:{}", f, no));
      if (const std::string key = record_key(j); !key.empty() && again(key, "cell " + key, j, f, no)) return;
      // The same sample of one pooled configuration, from runs over overlapping grids (depths=3 and
      // depths=5 share depth 50) or runs giving an option its default and leaving it out: the tables
      // count it once.
      if (const std::string id = j.value("id", std::string()); !id.empty()) {
        json config = pooled_config(j);
        const json context = label_context(config);
        for (auto it = context.begin(); it != context.end(); ++it)
          if (!config.contains(it.key())) config["options"][it.key()] = *it;
        const std::string pooled = json::array({config, id}).dump();
        if (again(pooled,
                  fmt::format("sample '{}' (of a run over another part of the grid, or with options at their defaults)",
                              id),
                  j, f, no))
          return;
      }
      fn(j, f, no);
    });
  }
  // One report reads its files once per kind of table: the note is given the first time.
  static std::set<std::vector<std::string>> told;
  if (repeated && told.insert(files).second)
    fmt::print(stderr, "{} records repeat a cell or a pooled sample already read, with the same score; counted once\n",
               repeated);
}

Records read_records(const std::vector<std::string>& files) {
  Records r;
  for_each_distinct_record(files, [&](const json& j, const std::string& f, int no) { add_record(j, f, no, r); });
  if (r.groups.empty()) fail("no result records in the given files");
  return r;
}

std::string run_label(const std::string& method, const std::string& dtype, const std::string& model) {
  return (method == "fullkv" ? "FullKV" : method) + (dtype == "fp32" ? "" : " [" + dtype + "]") +
         (model.empty() ? "" : " on " + model);
}

json completed_params(const std::string& method, const json& params, const std::string& gqa) {
  json out = params;
  const auto known = MethodRegistry::get().names();
  if (std::find(known.begin(), known.end(), method) != known.end())
    for (const ParamSpec& s : MethodRegistry::get().param_specs(method))
      if (!s.keyed_at_default && !out.contains(s.name)) out[s.name] = s.earlier.empty() ? s.default_value : s.earlier;
  if (gqa != "-" && !gqa.empty() && !out.contains("gqa")) out["gqa"] = gqa;
  return out;
}

namespace {

// The names whose values differ between a method's settings (each its completed parameters); a name
// only some settings have (a base's own parameter) counts where its values differ.
std::set<std::string> varying_params(const std::vector<json>& settings) {
  std::map<std::string, std::set<std::string>> values;
  for (const json& params : settings)
    for (const auto& [k, v] : params.items()) values[k].insert(v.dump());
  std::set<std::string> out;
  for (const auto& [k, v] : values)
    if (v.size() > 1) out.insert(k);
  return out;
}

}  // namespace

std::map<std::string, std::string> setting_texts(const std::map<std::string, json>& settings) {
  std::map<std::string, std::string> out;
  if (settings.size() < 2) {
    for (const auto& [setting, params] : settings) out[setting] = "";
    return out;
  }
  std::vector<json> all;
  for (const auto& [setting, params] : settings) all.push_back(params);
  const std::set<std::string> varying = varying_params(all);
  for (const auto& [setting, params] : settings) {
    json shown = json::object();
    for (const auto& [k, v] : params.items())
      if (varying.count(k)) shown[k] = v;
    out[setting] = params_text(shown.empty() ? params : shown);
  }
  return out;
}

std::vector<json> varying_context(const std::vector<RunContext>& runs) {
  using Setting = std::tuple<std::string, std::string, std::string>;
  std::map<Setting, std::map<std::string, std::set<std::string>>> values;
  for (const RunContext& r : runs)
    for (const auto& [k, v] : r.context.items()) values[{r.task, r.method, r.setting}][k];
  for (const RunContext& r : runs)
    for (auto& [k, distinct] : values[{r.task, r.method, r.setting}])
      distinct.insert(r.context.value(k, std::string("default")));
  std::map<std::pair<std::string, std::string>, std::set<std::string>> varying;  // (task, method) -> fields
  for (const auto& [setting, fields] : values)
    for (const auto& [k, distinct] : fields)
      if (distinct.size() > 1) varying[{std::get<0>(setting), std::get<1>(setting)}].insert(k);
  std::vector<json> out;
  for (const RunContext& r : runs) {
    json& shown = out.emplace_back(json::object());
    for (const auto& k : varying[{r.task, r.method}]) shown[k] = r.context.value(k, std::string("default"));
  }
  return out;
}

void label_entries(Records& r) {
  // The context of a method's runs on one task joins its setting where its values differ, so that two
  // runs differing only in it (max_new_tokens, weights) never share a row.
  std::vector<RunContext> runs;
  for (const Entry& e : r.entries)
    runs.push_back(
        {e.task, e.method, json::array({e.params, e.gqa, e.dtype, e.model, e.budget.name()}).dump(), e.context});
  const std::vector<json> varying = varying_context(runs);
  r.method_configs.clear();
  for (size_t i = 0; i < r.entries.size(); ++i) {
    Entry& e = r.entries[i];
    const json& context = varying[i];
    json shown = completed_params(e.method, e.params, e.gqa);
    for (const auto& [k, v] : context.items()) shown[k] = v;
    e.setting =
        context.empty() ? json::array({e.params, e.gqa}).dump() : json::array({e.params, e.gqa, context}).dump();
    r.method_configs[{e.task, e.method}].emplace(e.setting, shown);
  }
  // A method's row label is its name, with the parameters that differ between its settings where the
  // records hold several (e.g. "kvcrush (base=h2o)", "snapkv (kernel=5)").
  // (task, method) -> setting -> its text: each table tells apart the settings it shows.
  std::map<std::pair<std::string, std::string>, std::map<std::string, std::string>> texts;
  for (const auto& [tm, settings] : r.method_configs) texts[tm] = setting_texts(settings);
  // Records of several models: each row names its model, so that no row pools two models' samples.
  std::set<std::string> models;
  for (const Entry& e : r.entries) models.insert(e.model);
  for (Entry& e : r.entries) {
    const std::string name = run_label(e.method, e.dtype, models.size() > 1 ? e.model : "");
    e.group->distinct = texts[{e.task, e.method}][e.setting];
    e.label = e.group->distinct.empty() ? name : name + " (" + e.group->distinct + ")";
  }
}

}  // namespace kvb::report
