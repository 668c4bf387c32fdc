#include "harness/report/tables.hpp"

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

namespace kvb::report {
namespace {

// Values in the order added: their mean, summed in that order, and what a benchmark's own percent needs.
struct Mean {
  std::vector<double> values;
  void add(double v) { values.push_back(v); }
  int n() const { return static_cast<int>(values.size()); }
  double value() const {
    double sum = 0;
    for (double v : values) sum += v;
    return values.empty() ? std::nan("") : sum / n();
  }
};

std::string pct(double v, Scale s = Scale::Percent) {
  return std::isnan(v) ? "-" : fmt::format("{:.2f}", scaled(v, s));
}

// Methods in the order the papers list them (the full cache first), then by name.
bool method_order(const std::string& a, const std::string& b) {
  return std::pair(a != "FullKV", a) < std::pair(b != "FullKV", b);
}

std::string budget_heading(const KvBudget& b) {
  return b.is_ratio() ? fmt::format("compression ratio {}", b.ratio) : fmt::format("KV size {}", b.tokens);
}

// Rows = methods, columns = the given column keys, one block per KV size (the full cache in each).
// blocks_table's note where it adds a "Results" column; callers write their note before it.
constexpr const char* kCoverageNote =
    " Results k/n: the row has results in k of the n columns (or of a column's tasks), so its Avg. compares with "
    "no full row's.";

template <typename Key>
Table blocks_table(const std::vector<const Entry*>& es, const std::vector<Key>& keys,
                   const std::function<bool(const Entry&, const Key&)>& in_column, bool nulls, bool bits,
                   Scale scale = Scale::Percent, bool average = true, PercentRule rule = PercentRule::MeanTimes100) {
  std::set<KvBudget> budgets;
  std::set<std::string> labels;
  for (const Entry* e : es) {
    if (!e->budget.is_full()) budgets.insert(e->budget);
    labels.insert(e->label);
  }
  if (budgets.empty()) budgets.insert(KvBudget{});
  std::vector<std::string> order(labels.begin(), labels.end());
  std::sort(order.begin(), order.end(), method_order);
  Table t;
  std::vector<std::string> coverage;  // per row, in order: "k/n" where it lacks results
  for (const KvBudget& b : budgets) {
    Table::Block block;
    block.heading = b.is_full()    ? "Full cache"
                    : b.is_ratio() ? fmt::format("Compression ratio = {}", b.ratio)
                                   : fmt::format("KV size = {}", b.tokens);
    std::vector<std::set<std::string>> variants(keys.size());  // each column's, over the block's rows
    for (const Entry* e : es)
      if (e->budget.is_full() || e->budget == b)
        for (size_t k = 0; k < keys.size(); ++k)
          if (in_column(*e, keys[k])) variants[k].insert(e->variant);
    size_t expected = 0;
    for (const auto& v : variants) expected += v.size();
    for (const auto& label : order) {
      // A column pooling several task variants (RULER's per-length summary) averages their means.
      std::vector<std::map<std::string, Mean>> cols(keys.size());
      Mean avg, kept_bits;
      int empty = 0;
      bool any = false;
      for (const Entry* e : es) {
        if (e->label != label || (!e->budget.is_full() && e->budget != b)) continue;
        for (size_t k = 0; k < keys.size(); ++k)
          if (in_column(*e, keys[k])) {
            cols[k][e->variant].add(e->score);
            kept_bits.add(e->bits);
            any = true;
            empty += e->empty;
          }
      }
      if (!any) continue;
      size_t present = 0;
      std::vector<std::string> row = {label};
      for (size_t k = 0; k < cols.size(); ++k) {
        const auto& c = cols[k];
        Mean m;
        for (const auto& [variant, v] : c) m.add(v.value());
        present += c.size();
        // One benchmark score: as its own script computes it from the samples (a rounding tie goes its way).
        const bool own = variants[k].size() == 1 && c.size() == 1 && scale == Scale::Percent;
        row.push_back(own ? fmt::format("{:.2f}", benchmark_percent(c.begin()->second.values, rule))
                          : pct(m.value(), scale));
        if (m.n()) avg.add(m.value());
      }
      if (average) row.push_back(pct(avg.value(), scale));
      if (nulls) row.push_back(std::to_string(empty));
      if (bits) row.push_back(fmt::format("{:.2f}", kept_bits.value()));
      coverage.push_back(present < expected ? fmt::format("{}/{}", present, expected) : "");
      block.rows.push_back(row);
    }
    t.blocks.push_back(block);
  }
  // A mean over fewer columns (or fewer of a column's tasks) than other rows have compares with none of
  // theirs: a last column says so, as a report's --compare does, the cells staying numbers.
  if (std::any_of(coverage.begin(), coverage.end(), [](const std::string& c) { return !c.empty(); })) {
    size_t i = 0;
    for (auto& block : t.blocks)
      for (auto& row : block.rows) row.push_back(coverage[i++]);
    t.note = kCoverageNote;
  }
  return t;
}

// The columns after blocks_table's own: "Results" where it added one.
void add_coverage_column(Table& t) {
  if (t.note == kCoverageNote) t.columns.push_back("Results");
}

}  // namespace

void write_depth_heatmap(const Group& g, const std::string& dir, std::set<std::string>& used) {
  Heatmap h;
  std::set<int> depths, lengths;
  for (const auto& [dl, v] : g.depth_length) {
    depths.insert(dl.first);
    lengths.insert(dl.second);
  }
  for (int d : depths) h.rows.push_back(std::to_string(d));
  for (int l : lengths) h.cols.push_back(std::to_string(l));
  h.cells.assign(depths.size(), std::vector<double>(lengths.size(), std::nan("")));
  for (const auto& [dl, v] : g.depth_length) {
    const auto r = std::distance(depths.begin(), depths.find(dl.first));
    const auto c = std::distance(lengths.begin(), lengths.find(dl.second));
    h.cells[size_t(r)][size_t(c)] = v.first / v.second;
  }
  // A wrapper is named with its base (kvcrush-snapkv), as the papers name "SnapKV + KVCrush".
  const json& params = g.config.contains("params") ? g.config["params"] : json::object();
  const std::string method =
      g.config.value("method", "fullkv") + (params.contains("base") ? "-" + params["base"].get<std::string>() : "");
  const KvBudget budget = config_budget(g.config);
  h.title = "Pressure Testing " + g.config.value("model", std::string("model"));
  h.subtitle = "Fact Retrieval Across Context Lengths (\"Needle In A HayStack\")";
  const std::string settings = g.distinct.empty() ? "" : ", " + g.distinct;
  int per_cell_min = INT32_MAX, per_cell_max = 0;
  for (const auto& [dl, v] : g.depth_length) {
    per_cell_min = std::min(per_cell_min, v.second);
    per_cell_max = std::max(per_cell_max, v.second);
  }
  const MeanInterval ci = score_interval(strata_of(g.strata));
  h.caption = fmt::format(
      "{} Score: {}, {} samples ({} per cell)",
      method == "fullkv" ? "FullKV" + settings : fmt::format("{} ({}{})", method, budget_heading(budget), settings),
      interval_text(ci), g.n,
      per_cell_min == per_cell_max ? std::to_string(per_cell_min) : fmt::format("{}-{}", per_cell_min, per_cell_max));
  const bool chat = g.config["options"].value("chat", "false") == "true";
  // File names keep to letters, digits, '.', '-' and '_' (python:module.Class -> python_module.Class).
  std::string file_method = method;
  for (char& c : file_method)
    if (!std::isalnum(static_cast<unsigned char>(c)) && c != '.' && c != '-' && c != '_') c = '_';
  const std::string base = fmt::format("{}/{}-{}{}{}{}", dir, g.config.value("task", ""), file_method,
                                       method == "fullkv"  ? ""
                                       : budget.is_ratio() ? fmt::format("-r{}", budget.ratio)
                                                           : fmt::format("-T{}", budget.tokens),
                                       chat ? "-chat" : "", g.config.value("gqa", "-") == "repeat" ? "-repeat" : "");
  std::string stem = base;
  for (int i = 2; used.count(stem); ++i) stem = fmt::format("{}-{}", base, i);
  used.insert(stem);
  write_heatmap(h, stem);
}

Table write_summary(const Records& r, const std::string& dir, const std::set<std::string>& formats,
                    std::set<std::string>& used) {
  // Summary of every configuration: rows by task, options, method, then budget (full cache first).
  std::vector<const Group*> rows;
  for (const auto& [key, g] : r.groups) rows.push_back(&g);
  std::stable_sort(rows.begin(), rows.end(), [](const Group* a, const Group* b) {
    auto k = [](const Group* g) {
      return std::tuple(g->config.value("task", ""), g->config["options"].dump(),
                        g->config.value("method", "") != "fullkv", g->config.value("method", ""),
                        config_budget(g->config), g->config.dump());
    };
    return k(a) < k(b);
  });
  Table summary;
  summary.columns = {"task",  "options", "method",  "KV size", "KV dtype",     "gqa",       "params", "samples",
                     "score", "ci_low",  "ci_high", "KV kept", "vs fp16 full", "bits/elem", "T_eq"};
  summary.blocks.emplace_back();
  std::set<std::string> models;
  std::vector<RunContext> contexts;
  for (const Group* g : rows) {
    models.insert(g->config.value("model", std::string()));
    const json context = run_context(g->config);
    json rest = g->config;
    for (auto it = context.begin(); it != context.end(); ++it) rest.erase(it.key());
    contexts.push_back({g->config.value("task", ""), g->config.value("method", ""), rest.dump(), context});
  }
  const std::vector<json> varying = varying_context(contexts);
  for (size_t i = 0; i < rows.size(); ++i) {
    const Group& g = *rows[i];
    const json& c = g.config;
    // What else tells the row from another of the same method: the context its runs differ in and,
    // where the records hold several models, its model.
    json shown = c.value("params", json::object());
    for (const auto& [k, v] : varying[i].items()) shown[k] = v;
    if (models.size() > 1) shown["model"] = c.value("model", std::string());
    std::string opts;
    for (const auto& [k, v] : c["options"].items()) opts += (opts.empty() ? "" : " ") + k + "=" + v.get<std::string>();
    const MeanInterval ci = score_interval(strata_of(g.strata));
    const Scale sc = scale_of(c.value("task", ""));
    summary.blocks[0].rows.push_back(
        {c.value("task", ""), opts.empty() ? "-" : opts, c.value("method", ""), config_budget(c).name(),
         c.value("kv_dtype", std::string("fp32")), c.value("gqa", "-"), params_text(shown), std::to_string(g.n),
         pct(g.score / g.n, sc), pct(ci.low, sc), pct(ci.high, sc), fmt::format("{:.1f}%", 100.0 * g.kv_share / g.n),
         fmt::format("{:.1f}%", 100.0 * g.fp16_share / g.n), fmt::format("{:.2f}", 16.0 * g.fp16_share / g.n),
         fmt::format("{:.0f}", g.t_eq / g.n)});
    if (!g.depth_length.empty()) write_depth_heatmap(g, dir, used);
  }
  summary.note =
      "score: the benchmark's metric x 100, averaged over samples (RULER: tasks pooled; a perplexity task: exp of the "
      "mean over windows of their mean negative log-likelihood, lower is better); ci_low, ci_high: "
      "its 95% confidence interval (Wilson's for 0/1 scores; otherwise a percentile bootstrap over "
      "samples, resampled within each RULER task or LongBench dataset, as one pool where a task holds fewer than 5), "
      "none for identical non-0/1 scores or a bootstrap over fewer than 10 samples; params: the method's parameters "
      "and what else the method's runs differ in (max_new_tokens, weights, an artifact's digest); KV kept: the "
      "prompt cache's bytes as a share of the full cache at the run's dtype; vs fp16 full: the same "
      "against a full fp16 cache (the papers' unit); bits/elem: bytes kept x 8 per K/V element of the "
      "prompt; T_eq: the KV size of a full fp16 cache of as many bytes (fp16 token units per KV head and "
      "layer), means over samples.";
  write_table(summary, dir + "/summary", formats);
  return summary;
}

void write_method_budget(const std::string& task, const std::vector<const Entry*>& es, const std::string& dir,
                         const std::set<std::string>& formats) {
  // Method x budget: mean score and the share of the full cache kept; as a table and a heatmap.
  const Scale scale = scale_of(task);
  std::set<KvBudget> budgets;
  std::set<std::string> labels;
  for (const Entry* e : es) {
    budgets.insert(e->budget);
    labels.insert(e->label);
  }
  std::vector<std::string> order(labels.begin(), labels.end());
  std::sort(order.begin(), order.end(), method_order);
  Table mb;
  mb.caption = task +
               ": score by method and KV size, with its 95% interval over samples (bytes kept as a share "
               "of the run's full cache, and of a full fp16 cache where that differs)";
  mb.columns = {"Method"};
  for (const KvBudget& b : budgets) mb.columns.push_back(b.name());
  mb.blocks.emplace_back();
  Heatmap h;
  h.title = task + ": score by method and KV size";
  h.x_label = "KV size";
  h.y_label = "Method";
  h.annotate = true;
  h.cell_width = 56;
  for (const KvBudget& b : budgets) h.cols.push_back(b.name());
  MemoryPlot mp;
  mp.title = task + ": score against KV memory";
  int n_min = INT32_MAX, n_max = 0;  // samples per cell
  for (const auto& label : order) {
    std::vector<std::string> row = {label};
    std::vector<double> cells;
    MemorySeries& series = mp.series.emplace_back();
    series.label = label;
    for (const KvBudget& b : budgets) {
      Mean kv, kv16;
      std::vector<SampleScore> scores;
      for (const Entry* e : es)
        if (e->label == label && e->budget == b) {
          kv.add(e->kv_share);
          kv16.add(e->fp16_share);
          scores.push_back({e->variant, e->unit, e->score});
        }
      const std::string fp16 =
          std::abs(kv16.value() - kv.value()) > 1e-9 ? fmt::format(", {:.1f}% fp16", 100 * kv16.value()) : "";
      // The heatmap, the plot and the table show one mean: over samples, a sample's variants (GSM8K's
      // two answer extractions) averaged first.
      double cell = std::nan("");
      if (!scores.empty()) {
        const MeanInterval ci = score_interval(sample_strata(scores));
        n_min = std::min(n_min, ci.n);
        n_max = std::max(n_max, ci.n);
        row.push_back(fmt::format("{} ({:.1f}%{}, n={})", interval_text(ci, scale), 100 * kv.value(), fp16, ci.n));
        series.points.push_back({kv16.value(), ci.mean, ci.low, ci.high, ci.n});
        cell = ci.mean;
      } else {
        row.push_back("-");
      }
      cells.push_back(cell);
    }
    mb.blocks[0].rows.push_back(row);
    h.rows.push_back(label);
    h.cells.push_back(cells);
  }
  // No overall mean: it would average the full cache with compressed cells of different sizes.
  h.caption = n_min == n_max ? fmt::format("score x 100, mean over {} samples per cell", n_min)
                             : fmt::format("score x 100, mean over {}-{} samples per cell", n_min, n_max);
  write_table(mb, dir + "/" + task + "-method-budget", formats);
  // The figures' scales are scores in [0, 1]: a perplexity task has its tables only.
  if (scale == Scale::Perplexity) return;
  write_heatmap(h, dir + "/" + task + "-method-budget", dir + "/" + task + "-method-budget-cells");
  write_memory_plot(mp, dir + "/" + task + "-memory");
}

std::string write_paper_tables(const std::string& task, const std::vector<const Entry*>& es, const std::string& dir,
                               const std::set<std::string>& formats) {
  const TaskLayout& layout = layout_of(task);
  if (layout.title.empty()) return "";
  std::vector<ReportColumn> cols;  // the layout's columns with results, in its order
  for (const auto& c : layout.columns)
    if (std::any_of(es.begin(), es.end(), [&](const Entry* e) { return e->variant == c.key; })) cols.push_back(c);
  auto in_column = [](const Entry& e, const ReportColumn& c) { return e.variant == c.key; };
  const std::string note =
      fmt::format(
          fmt::runtime(layout.note), fmt::arg("shown", cols.size()),
          fmt::arg("left_out", cols.size() < layout.columns.size() ? " (those without results are left out)" : "")) +
      (layout.nulls ? "; Nulls = empty predictions" : "") +
      "; Bits = prompt-cache bytes x 8 per K/V element of the prompt (fp16 full cache: 16), mean over the row's "
      "samples.";
  auto paper_table = [&](const std::vector<const Entry*>& at, const std::string& caption) {
    Table t = blocks_table<ReportColumn>(at, cols, in_column, layout.nulls, true,
                                         layout.perplexity ? Scale::Perplexity : Scale::Percent, layout.average,
                                         layout.percent);
    t.caption = caption;
    t.columns = {"Method"};
    for (const auto& c : cols) {
      t.columns.push_back(c.name);
      if (!c.group.empty()) {
        if (t.groups.empty() || t.groups.back().first != c.group) t.groups.push_back({c.group, 0});
        ++t.groups.back().second;
      }
    }
    if (layout.average) t.columns.push_back("Avg.");
    if (layout.nulls) t.columns.push_back("Nulls");
    t.columns.push_back("Bits");
    add_coverage_column(t);
    t.note = note + t.note;
    return t;
  };
  std::string written;
  if (layout.length_option.empty()) {
    write_table(paper_table(es, layout.title), dir + "/" + task, formats);
    written += ", " + task;
  } else {
    // One table per length, then the mean over the columns at each length.
    std::set<int> lengths;
    for (const Entry* e : es) lengths.insert(e->length);
    for (int L : lengths) {
      std::vector<const Entry*> at;
      for (const Entry* e : es)
        if (e->length == L) at.push_back(e);
      write_table(paper_table(at, fmt::format("{}, context length = {}", layout.title, L)),
                  fmt::format("{}/{}-{}", dir, task, L), formats);
      written += fmt::format(", {}-{}", task, L);
    }
    Table t = blocks_table<int>(
        es, std::vector<int>(lengths.begin(), lengths.end()),
        [](const Entry& e, const int& L) { return e.length == L; }, false, false);
    t.caption = layout.title + ": mean score per context length";
    t.columns = {"Method"};
    for (int L : lengths) t.columns.push_back(std::to_string(L));
    t.columns.push_back("Avg.");
    add_coverage_column(t);
    t.note =
        "Each length column is the mean of the column scores at that length (those present in the records)." + t.note;
    write_table(t, dir + "/" + task + "-lengths", formats);
    written += ", " + task + "-lengths";
  }
  if (!layout.length_ranges.empty()) {
    Table t = blocks_table<std::pair<std::string, std::pair<int, int>>>(
        es, layout.length_ranges,
        [](const Entry& e, const auto& r) { return e.length >= r.second.first && e.length < r.second.second; }, false,
        false, Scale::Percent, true, PercentRule::NumpyMean);  // eval.py --e: round(100 * np.mean(...), 2)
    t.caption = layout.title + ": mean score per length range";
    t.columns = {"Method"};
    for (const auto& r : layout.length_ranges) t.columns.push_back(r.first);
    t.columns.push_back("Avg.");
    add_coverage_column(t);
    t.note =
        "Each range column is the mean over columns of their mean score on the records in that range (the "
        "record's length field)." +
        t.note;
    write_table(t, dir + "/" + task + "-lengths", formats);
    written += ", " + task + "-lengths";
  }
  return written;
}

}  // namespace kvb::report
