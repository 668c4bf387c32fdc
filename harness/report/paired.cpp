#include "harness/report/paired.hpp"

#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <nlohmann/json.hpp>
#include <set>
#include <tuple>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/report/records.hpp"
#include "harness/report/report.hpp"
#include "harness/report/stats.hpp"
#include "harness/report/table.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

using nlohmann::json;

struct Run {
  std::string task, variant, method, setting;  // setting: the parameters and GQA mode, as text
  std::string dtype, model;
  json params;
  KvBudget budget;
  std::string unit;    // the sample it scored, for the bootstrap (sample_unit)
  std::string sample;  // what makes two records the same sample: task, options, model, dtype, id
  json context;        // what else the run was made with (report::run_context)
  double score = 0;
};

std::string setting_text(const json& params, const std::string& gqa) {
  return params_text(params) + (gqa == "-" || gqa.empty() ? "" : " gqa=" + gqa);
}

std::vector<Run> read_runs(const std::vector<std::string>& inputs) {
  std::vector<Run> runs;
  report::for_each_distinct_record(result_files(inputs), [&](const json& j, const std::string& f, int no) {
    const json& c = j["config"];
    Run r;
    r.score = report::record_score(j, fmt::format("{}:{}", f, no));
    r.task = c.value("task", "");
    const json opts = c.value("options", json::object());
    r.variant = opts.value("task", opts.value("dataset", ""));
    r.method = c.value("method", "fullkv");
    const json recorded = c.value("params", json::object());
    r.setting = setting_text(recorded, c.value("gqa", "-"));
    r.params = report::completed_params(r.method, recorded, c.value("gqa", "-"));
    r.budget = config_budget(c);
    r.dtype = c.value("kv_dtype", "fp32");
    r.model = c.value("model", "");
    const std::string id = j.value("id", "");
    if (id.empty()) fail("{}:{}: the record has no 'id'; --baseline pairs records by their sample's id", f, no);
    r.unit = report::sample_unit(j);
    // Options that only index the grid (NIAH's depths) are left out: runs over overlapping grids share samples.
    r.sample = json::array({r.task, report::pooled_config(j)["options"], r.model, r.dtype, id}).dump();
    // Task options are part of the sample (a pair is within one set of them), not of the row's setting.
    r.context = report::run_context(c);
    runs.push_back(std::move(r));
  });
  if (runs.empty()) fail("no result records in the given files");
  // The context of a method's runs on one task joins its setting where its values differ (absent:
  // "default"; --baseline fullkv:max_new_tokens=default picks the uncapped run), as a report's rows.
  std::vector<report::RunContext> contexts;
  for (const Run& r : runs)
    contexts.push_back(
        {r.task, r.method, json::array({r.setting, r.dtype, r.model, r.budget.name()}).dump(), r.context});
  const std::vector<json> varying = report::varying_context(contexts);
  for (size_t i = 0; i < runs.size(); ++i) {
    for (const auto& [k, v] : varying[i].items()) runs[i].params[k] = v;
    if (!varying[i].empty()) runs[i].setting += " " + params_text(varying[i]);
  }
  return runs;
}

// A p-value as a reader compares it with 0.05: three decimals, "<0.001" below.
std::string p_text(double p) { return p < 0.001 ? "<0.001" : fmt::format("{:.3f}", p); }

// The recorded setting `baseline` (parsed: `named`) names on each task: the one setting of its method
// there whose parameters match. A context field shows only on a task where it varies: where a run
// lacks a wanted field that the method's runs on another task have, any value matches ("default", the
// run leaving it out, too). A task where none matches is left out, said on stderr; where several match,
// an error.
std::map<std::string, std::string> baseline_settings(const std::vector<Run>& runs, const std::string& baseline,
                                                     const NamedParams& named, bool say_missing) {
  const std::string& base_method = named.name;
  const std::map<std::string, std::string> want(named.params.begin(), named.params.end());
  std::set<std::string> methods, tasks, fields;  // fields: of the method's runs on any task
  for (const Run& r : runs)
    if (r.method == base_method)
      for (const auto& [k, v] : r.params.items()) fields.insert(k);
  std::map<std::string, std::set<std::string>> settings;  // task -> the matching settings
  for (const Run& r : runs) {
    methods.insert(r.method);
    tasks.insert(r.task);
    if (r.method != base_method) continue;
    bool match = true;
    for (const auto& [k, v] : want)
      match = match && (r.params.contains(k) ? r.params[k].get<std::string>() == v : fields.count(k) > 0);
    if (match) settings[r.task].insert(r.setting);
  }
  if (!methods.count(base_method))
    fail("--baseline {}: no recorded cell of method '{}' (recorded: {})", baseline, base_method,
         fmt::join(methods, ", "));
  if (settings.empty()) fail("--baseline {}: no recorded setting of {} has these parameters", baseline, base_method);
  std::map<std::string, std::string> out;
  for (const auto& [task, matching] : settings) {
    if (matching.size() > 1)
      fail("--baseline {}: {} recorded settings of {} on {} match; name the parameters that pick one: {}", baseline,
           matching.size(), base_method, task, fmt::join(matching, " | "));
    out[task] = *matching.begin();
  }
  for (const auto& task : tasks)
    if (say_missing && !out.count(task))
      fmt::print(stderr, "--baseline {}: no recorded setting of {} on {} matches; {} has no comparison\n", baseline,
                 base_method, task, task);
  return out;
}

}  // namespace

void check_baseline(const std::vector<std::string>& results, const std::string& baseline) {
  baseline_settings(read_runs(results), baseline, parse_named_params(baseline, "--baseline"), false);
}

void write_paired_comparison(const std::vector<std::string>& results, const std::string& baseline,
                             const std::string& dir, const std::set<std::string>& formats) {
  const std::vector<Run> runs = read_runs(results);
  const NamedParams named = parse_named_params(baseline, "--baseline");
  const std::map<std::string, std::string> base_setting = baseline_settings(runs, baseline, named, true);
  const std::string& base_method = named.name;
  auto is_baseline = [&](const Run& r) {
    const auto it = base_setting.find(r.task);
    return r.method == base_method && it != base_setting.end() && r.setting == it->second;
  };
  const std::map<std::string, std::string> want(named.params.begin(), named.params.end());

  // Baseline scores by (sample, budget); a full-cache baseline has one per sample.
  const bool full_baseline = base_method == "fullkv";
  std::map<std::pair<std::string, KvBudget>, double> base;
  for (const Run& r : runs)
    if (is_baseline(r)) base[{r.sample, full_baseline ? KvBudget{} : r.budget}] = r.score;
  // A method's label shows its setting where the records hold several of its settings, its KV dtype and,
  // where they hold several models, its model: a row never pools two runs of one sample.
  using TaskMethod = std::pair<std::string, std::string>;
  std::map<TaskMethod, std::map<std::string, json>> method_settings;  // (task, method) -> setting -> parameters
  std::set<std::string> models;
  for (const Run& r : runs) {
    method_settings[{r.task, r.method}].emplace(r.setting, r.params);
    models.insert(r.model);
  }
  std::map<TaskMethod, std::map<std::string, std::string>> texts;  // (task, method) -> setting -> its text
  for (const auto& [tm, by_setting] : method_settings) texts[tm] = report::setting_texts(by_setting);
  auto setting_label = [&](const Run& r) {
    const std::string& text = texts[{r.task, r.method}][r.setting];
    return text.empty() ? text : " (" + text + ")";
  };
  // task -> label -> budget -> differences
  std::map<std::string, std::map<std::string, std::map<KvBudget, std::vector<SampleScore>>>> diffs;
  std::set<std::tuple<std::string, KvBudget, std::string>> paired;  // a sample pairs once per row and budget
  for (const Run& r : runs) {
    if (is_baseline(r)) continue;
    const auto it = base.find({r.sample, full_baseline ? KvBudget{} : r.budget});
    if (it == base.end()) continue;
    const std::string label = report::run_label(r.method, r.dtype, models.size() > 1 ? r.model : "") + setting_label(r);
    if (!paired.emplace(label, r.budget, r.sample).second) continue;
    diffs[r.task][label][r.budget].push_back({r.variant, r.unit, r.score - it->second});
  }
  if (diffs.empty())
    fail("--baseline {}: no other method ran the baseline's samples{}", baseline,
         full_baseline ? "" : " at the baseline's KV sizes");
  std::string name = base_method;
  for (const auto& [k, v] : want) name += fmt::format("-{}={}", k, v);
  std::string file_name;
  for (char ch : name) file_name += std::isalnum(static_cast<unsigned char>(ch)) || ch == '.' || ch == '-' ? ch : '_';
  for (const auto& [task, by_label] : diffs) {
    std::set<KvBudget> budgets;
    for (const auto& [label, by_budget] : by_label)
      for (const auto& [b, v] : by_budget) budgets.insert(b);
    const bool perplexity = report::scale_of(task) == Scale::Perplexity;
    // Every cell's interval first: the table's comparisons are one family for Holm's adjustment.
    struct Cell {
      MeanInterval ci;
      bool spread = false;
      double p_holm = std::nan("");
    };
    std::map<std::pair<std::string, KvBudget>, Cell> cells;
    std::vector<Cell*> tested;
    for (const auto& [label, by_budget] : by_label)
      for (const auto& [b, d] : by_budget) {
        const std::vector<std::vector<double>> strata = sample_strata(d);
        Cell& c = cells[{label, b}];
        c.ci = bootstrap_interval(strata);
        c.spread = any_spread(strata);
        if (c.ci.has_interval()) tested.push_back(&c);
      }
    std::vector<double> p;
    for (const Cell* c : tested) p.push_back(c->ci.p_zero);
    const std::vector<double> adjusted = holm_adjust(p);
    for (size_t i = 0; i < tested.size(); ++i) tested[i]->p_holm = adjusted[i];

    Table t;
    const std::string family = fmt::format(
        "p: the bootstrap's two-sided p-value adjusted by Holm's method over the table's {} comparison{} with an "
        "interval; * where that p < 0.05",
        tested.size(), tested.size() == 1 ? "" : "s");
    t.caption = perplexity ? fmt::format(
                                 "{}: perplexity over {}'s on the same windows (the ratio), with its 95% interval and "
                                 "the pairs (n); {}",
                                 task, baseline, family)
                           : fmt::format(
                                 "{}: score minus {}'s on the same samples, x 100, with its 95% interval and the pairs "
                                 "(n); {}",
                                 task, baseline, family);
    t.columns = {"Method"};
    for (const KvBudget& b : budgets) t.columns.push_back(b.name());
    t.blocks.emplace_back();
    for (const auto& [label, by_budget] : by_label) {
      std::vector<std::string> row = {label};
      for (const KvBudget& b : budgets) {
        const auto it = cells.find({label, b});
        if (it == cells.end()) {
          row.push_back("-");
          continue;
        }
        const MeanInterval& ci = it->second.ci;
        const char* mark = it->second.p_holm < 0.05 ? " *" : "";
        const std::string pairs = fmt::format("n={}, p={}", ci.n, p_text(it->second.p_holm));
        // Why a cell of several pairs has no interval: the difference never varies, or too few pairs.
        const char* no_spread = ci.n < 2 ? "" : it->second.spread ? ", too few pairs" : ", constant";
        // A difference of mean NLLs over the same windows is the log of the perplexities' ratio.
        if (perplexity)
          row.push_back(ci.has_interval() ? fmt::format("x{:.4f} [x{:.4f}, x{:.4f}]{} ({})", std::exp(ci.mean),
                                                        std::exp(ci.low), std::exp(ci.high), mark, pairs)
                                          : fmt::format("x{:.4f} (n={}{})", std::exp(ci.mean), ci.n, no_spread));
        else
          row.push_back(ci.has_interval() ? fmt::format("{:+.2f} [{:+.2f}, {:+.2f}]{} ({})", 100 * ci.mean,
                                                        100 * ci.low, 100 * ci.high, mark, pairs)
                                          : fmt::format("{:+.2f} (n={}{})", 100 * ci.mean, ci.n, no_spread));
      }
      t.blocks[0].rows.push_back(row);
    }
    t.note =
        "Percentile bootstrap of the mean paired difference (10,000 resamples, within each RULER task or "
        "LongBench dataset; a sample scored several ways, as GSM8K's two metrics, counts once); fewer than 10 pairs, "
        "or a difference constant within every task, give no interval. "
        "The intervals are each comparison's own; with several comparisons some exclude the baseline by chance, "
        "which Holm's adjusted p accounts for.";
    write_table(t, fmt::format("{}/{}-vs-{}", dir, task, file_name), formats);
    fmt::print("{}\n", to_markdown(t));
  }
}

}  // namespace kvb
