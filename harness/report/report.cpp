#include "harness/report/report.hpp"

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
#include "harness/report/stats.hpp"
#include "harness/report/table.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

using nlohmann::json;

struct Group {
  json config;
  double score = 0, kv_share = 0, fp16_share = 0, t_eq = 0;
  int n = 0;
  std::map<std::pair<int, int>, std::pair<double, int>> depth_length;  // (depth, length) -> sum, count
  std::map<std::string, std::vector<double>> strata;  // scores by RULER task or LongBench dataset ("" else)
  // The parameters that tell it from the method's other settings in the records ("recency=50"), if any.
  std::string distinct;
};

std::string budget_heading(const KvBudget& b) {
  return b.is_ratio() ? fmt::format("compression ratio {}", b.ratio) : fmt::format("KV size {}", b.tokens);
}

std::vector<std::vector<double>> strata_of(const std::map<std::string, std::vector<double>>& by_variant) {
  std::vector<std::vector<double>> out;
  for (const auto& [variant, scores] : by_variant) out.push_back(scores);
  return out;
}

// `used` keeps the names already written, so that configurations differing only in parameters (an
// ablation grid) get numbered files instead of overwriting each other.
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

// One record, reduced to what the tables group by.
struct Entry {
  std::string task, method, label, variant;  // variant: the task option a paper table has columns for
  json params;                               // the method's parameters, as recorded
  std::string dtype;                         // the cache's KV dtype
  KvBudget budget;
  int length = 0;
  double score = 0, kv_share = 1;
  double fp16_share = 0.5;  // kept bytes against a full fp16 cache of the prompt (the papers' unit)
  double bits = 8;          // kept bits per K/V element of the prompt: 16 x fp16_share
  bool empty = false;
  Group* group = nullptr;
};

struct Mean {
  double sum = 0;
  int n = 0;
  void add(double v) {
    sum += v;
    ++n;
  }
  double value() const { return n ? sum / n : std::nan(""); }
};

std::string pct(double v) { return std::isnan(v) ? "-" : fmt::format("{:.2f}", 100 * v); }

// Methods in the order the papers list them (the full cache first), then by name.
bool method_order(const std::string& a, const std::string& b) {
  return std::pair(a != "FullKV", a) < std::pair(b != "FullKV", b);
}

// The layout a task declares (harness/task/task.hpp); none for a task this build does not know.
const TaskLayout& layout_of(const std::string& task) {
  static const TaskLayout none;
  const TaskInfo* info = TaskRegistry::get().find(task);
  return info ? info->layout : none;
}

// Rows = methods, columns = the given column keys, one block per KV size (the full cache in each).
template <typename Key>
Table blocks_table(const std::vector<const Entry*>& es, const std::vector<Key>& keys,
                   const std::function<bool(const Entry&, const Key&)>& in_column, bool nulls, bool bits) {
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
  for (const KvBudget& b : budgets) {
    Table::Block block;
    block.heading = b.is_full()    ? "Full cache"
                    : b.is_ratio() ? fmt::format("Compression ratio = {}", b.ratio)
                                   : fmt::format("KV size = {}", b.tokens);
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
      std::vector<std::string> row = {label};
      for (const auto& c : cols) {
        Mean m;
        for (const auto& [variant, v] : c) m.add(v.value());
        row.push_back(pct(m.value()));
        if (m.n) avg.add(m.value());
      }
      row.push_back(pct(avg.value()));
      if (nulls) row.push_back(std::to_string(empty));
      if (bits) row.push_back(fmt::format("{:.2f}", kept_bits.value()));
      block.rows.push_back(row);
    }
    t.blocks.push_back(block);
  }
  return t;
}

// The tables of a task's paper layout (its TaskLayout) for its entries; returns the files written, as
// ", name" items for the report's list.
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
    Table t = blocks_table<ReportColumn>(at, cols, in_column, layout.nulls, true);
    t.caption = caption;
    t.columns = {"Method"};
    for (const auto& c : cols) {
      t.columns.push_back(c.name);
      if (!c.group.empty()) {
        if (t.groups.empty() || t.groups.back().first != c.group) t.groups.push_back({c.group, 0});
        ++t.groups.back().second;
      }
    }
    t.columns.push_back("Avg.");
    if (layout.nulls) t.columns.push_back("Nulls");
    t.columns.push_back("Bits");
    t.note = note;
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
    t.note = "Each length column is the mean of the column scores at that length (those present in the records).";
    write_table(t, dir + "/" + task + "-lengths", formats);
    written += ", " + task + "-lengths";
  }
  if (!layout.length_ranges.empty()) {
    Table t = blocks_table<std::pair<std::string, std::pair<int, int>>>(
        es, layout.length_ranges,
        [](const Entry& e, const auto& r) { return e.length >= r.second.first && e.length < r.second.second; }, false,
        false);
    t.caption = layout.title + ": mean score per length range";
    t.columns = {"Method"};
    for (const auto& r : layout.length_ranges) t.columns.push_back(r.first);
    t.columns.push_back("Avg.");
    t.note =
        "Each range column is the mean over columns of their mean score on the records in that range (the "
        "record's length field).";
    write_table(t, dir + "/" + task + "-lengths", formats);
    written += ", " + task + "-lengths";
  }
  return written;
}

}  // namespace

std::string params_text(const json& params) {
  std::string s;
  for (const auto& [k, v] : params.items()) s += (s.empty() ? "" : " ") + k + "=" + v.get<std::string>();
  return s.empty() ? "-" : s;
}

std::vector<std::string> result_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    if (!std::filesystem::exists(in)) fail("{}: not found", in);
    if (std::filesystem::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : std::filesystem::directory_iterator(in))
        if (e.path().extension() == ".jsonl") found.push_back(e.path().string());
      std::sort(found.begin(), found.end());
      files.insert(files.end(), found.begin(), found.end());
    } else {
      files.push_back(in);
    }
  }
  return files;
}

std::string column_name(const std::string& task, const std::string& column) {
  for (const auto& c : layout_of(task).columns)
    if (column == c.key) return c.name;
  return column;
}

size_t column_order(const std::string& task, const std::string& column) {
  const auto& cols = layout_of(task).columns;
  for (size_t i = 0; i < cols.size(); ++i)
    if (column == cols[i].key) return i;
  return SIZE_MAX;
}

namespace {

// Every record of the files, deduplicated, as entries and their configurations' groups.
struct Records {
  std::map<std::string, Group> groups;  // by configuration, the grid's parts pooled
  std::vector<Entry> entries;           // one per record; each points into groups
  // method -> its distinct settings (parameters and GQA mode, as text) -> their parameters
  std::map<std::string, std::map<std::string, json>> method_configs;
};

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
  // Runs over different parts of one grid belong to one configuration.
  for (const auto& k : layout.pooled_options) cfg["options"].erase(k);
  cfg.erase("version");
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
  e.empty = python_strip(j.value("prediction", "")).empty();
  // labelled below; the dtype is shown where it is not fp32
  e.params = cfg.value("params", json::object());
  e.dtype = cfg.value("kv_dtype", std::string("fp32"));
  r.method_configs[e.method].emplace(json::array({e.params, cfg.value("gqa", "-")}).dump(), e.params);
  r.entries.push_back(e);
}

Records read_records(const std::vector<std::string>& files) {
  Records r;
  // A cell recorded twice (overlapping files, or two runs appending to one file) counts once; the
  // runs are deterministic, so a second copy with another score means the records disagree.
  std::map<std::string, std::pair<double, std::string>> seen;  // key -> score, where first recorded
  size_t repeated = 0;
  for (const auto& f : files) {
    for_each_record(f, [&](const json& j, int no) {
      if (const std::string key = record_key(j); !key.empty()) {
        const auto [it, fresh] = seen.try_emplace(key, j["score"].get<double>(), fmt::format("{}:{}", f, no));
        if (!fresh) {
          if (it->second.first != j["score"].get<double>())
            fail(
                "{}:{}: cell {} is recorded again with score {}, but {} has {} (runs of different code? each "
                "record's version says which commit made it)",
                f, no, it->first, j["score"].get<double>(), it->second.second, it->second.first);
          ++repeated;
          return;
        }
      }
      add_record(j, f, no, r);
    });
  }
  if (r.groups.empty()) fail("no result records in the given files");
  if (repeated)
    fmt::print(stderr, "{} records repeat a cell already read (same key and score); counted once\n", repeated);
  return r;
}

void label_entries(Records& r) {
  // A method's row label is its name, with the parameters that differ between its settings where the
  // records hold several (e.g. "kvcrush (base=h2o)", "snapkv (kernel=5)").
  std::map<std::string, std::set<std::string>> varying;  // method -> parameter names whose values differ
  for (const auto& [method, configs] : r.method_configs) {
    std::map<std::string, std::set<std::string>> values;
    for (const auto& [setting, params] : configs) {
      for (const auto& [k, v] : params.items()) {
        values[k].insert(v.dump());
      }
    }
    // A key only some settings have (a base's own parameter) is shown when its values differ.
    for (const auto& [k, v] : values)
      if (v.size() > 1) varying[method].insert(k);
  }
  for (Entry& e : r.entries) {
    const std::string name =
        (e.method == "fullkv" ? "FullKV" : e.method) + (e.dtype == "fp32" ? "" : " [" + e.dtype + "]");
    json shown = json::object();
    for (const auto& [k, v] : e.params.items())
      if (varying[e.method].count(k)) shown[k] = v;
    if (r.method_configs[e.method].size() > 1)
      e.group->distinct = shown.empty() ? params_text(e.params) : params_text(shown);
    e.label = e.group->distinct.empty() ? name : name + " (" + e.group->distinct + ")";
  }
}

// The summary of every configuration (and each one's depth x length heatmap, where its task has one).
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
  for (const Group* gp : rows) {
    const Group& g = *gp;
    const json& c = g.config;
    std::string opts;
    for (const auto& [k, v] : c["options"].items()) opts += (opts.empty() ? "" : " ") + k + "=" + v.get<std::string>();
    const MeanInterval ci = score_interval(strata_of(g.strata));
    summary.blocks[0].rows.push_back(
        {c.value("task", ""), opts.empty() ? "-" : opts, c.value("method", ""), config_budget(c).name(),
         c.value("kv_dtype", std::string("fp32")), c.value("gqa", "-"), params_text(c.value("params", json::object())),
         std::to_string(g.n), fmt::format("{:.2f}", 100.0 * g.score / g.n), pct(ci.low), pct(ci.high),
         fmt::format("{:.1f}%", 100.0 * g.kv_share / g.n), fmt::format("{:.1f}%", 100.0 * g.fp16_share / g.n),
         fmt::format("{:.2f}", 16.0 * g.fp16_share / g.n), fmt::format("{:.0f}", g.t_eq / g.n)});
    if (!g.depth_length.empty()) write_depth_heatmap(g, dir, used);
  }
  summary.note =
      "score: the benchmark's metric x 100, averaged over samples (RULER: tasks pooled); ci_low, ci_high: "
      "its 95% confidence interval (Wilson's for 0/1 scores; otherwise a percentile bootstrap over "
      "samples, resampled within each RULER task or LongBench dataset), none for one sample or identical non-0/1 "
      "scores; KV kept: the "
      "prompt cache's bytes as a share of the full cache at the run's dtype; vs fp16 full: the same "
      "against a full fp16 cache (the papers' unit); bits/elem: bytes kept x 8 per K/V element of the "
      "prompt; T_eq: the KV size of a full fp16 cache of as many bytes (fp16 token units per KV head and "
      "layer), means over samples.";
  write_table(summary, dir + "/summary", formats);
  return summary;
}

// Method x budget for one task: mean score with its interval and the share of the full cache kept, as a
// table, a heatmap and a memory plot.
void write_method_budget(const std::string& task, const std::vector<const Entry*>& es, const std::string& dir,
                         const std::set<std::string>& formats) {
  // Method x budget: mean score and the share of the full cache kept; as a table and a heatmap.
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
      Mean sc, kv, kv16;
      std::map<std::string, std::vector<double>> strata;
      for (const Entry* e : es)
        if (e->label == label && e->budget == b) {
          sc.add(e->score);
          kv.add(e->kv_share);
          kv16.add(e->fp16_share);
          strata[e->variant].push_back(e->score);
        }
      const std::string fp16 =
          std::abs(kv16.value() - kv.value()) > 1e-9 ? fmt::format(", {:.1f}% fp16", 100 * kv16.value()) : "";
      if (sc.n) {
        n_min = std::min(n_min, sc.n);
        n_max = std::max(n_max, sc.n);
        const MeanInterval ci = score_interval(strata_of(strata));
        row.push_back(fmt::format("{} ({:.1f}%{}, n={})", interval_text(ci), 100 * kv.value(), fp16, ci.n));
        series.points.push_back({kv16.value(), sc.value(), ci.low, ci.high, ci.n});
      } else {
        row.push_back("-");
      }
      cells.push_back(sc.value());
    }
    mb.blocks[0].rows.push_back(row);
    h.rows.push_back(label);
    h.cells.push_back(cells);
  }
  // No overall mean: it would average the full cache with compressed cells of different sizes.
  h.caption = n_min == n_max ? fmt::format("score x 100, mean over {} samples per cell", n_min)
                             : fmt::format("score x 100, mean over {}-{} samples per cell", n_min, n_max);
  write_table(mb, dir + "/" + task + "-method-budget", formats);
  write_heatmap(h, dir + "/" + task + "-method-budget", dir + "/" + task + "-method-budget-cells");
  write_memory_plot(mp, dir + "/" + task + "-memory");
}

}  // namespace

void write_report(const std::vector<std::string>& inputs, const std::string& dir,
                  const std::set<std::string>& formats) {
  for (const auto& f : formats)
    if (f != "md" && f != "csv" && f != "tex") fail("report format '{}': expected md, csv or tex", f);
  Records r = read_records(result_files(inputs));
  label_entries(r);
  std::filesystem::create_directories(dir);
  std::set<std::string> used;
  const Table summary = write_summary(r, dir, formats, used);
  std::string written = "summary";
  std::set<std::string> tasks;
  for (const auto& e : r.entries) tasks.insert(e.task);
  for (const auto& task : tasks) {
    std::vector<const Entry*> es;
    for (const auto& e : r.entries)
      if (e.task == task) es.push_back(&e);
    write_method_budget(task, es, dir, formats);
    written += ", " + task + "-method-budget, " + task + "-memory" + write_paper_tables(task, es, dir, formats);
  }
  fmt::print(
      "{}\nwrote to {}: {} (tables as {}){}\n", to_markdown(summary), dir, written,
      [&] {
        std::string f;
        for (const auto& x : formats) f += (f.empty() ? "" : ", ") + x;
        return f;
      }(),
      used.empty() ? "" : "; depth x length heatmaps TASK-METHOD-*.png, .svg, .csv");
}

}  // namespace kvb
