#include "harness/report/comparison.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/published.hpp"
#include "harness/experiment/results.hpp"
#include "harness/report/figure.hpp"
#include "harness/report/records.hpp"
#include "harness/report/report.hpp"
#include "harness/report/stats.hpp"
#include "harness/report/table.hpp"
#include "harness/task/task.hpp"
#include "harness/util/error.hpp"

namespace kvb {

using nlohmann::json;

namespace {

// Our records, reduced to what a published row is matched on.
struct Ours {
  json config;
  std::string pooled;  // the configuration as the report pools it (report::pooled_config), as text
  std::string id;      // the sample's
  std::map<std::string, std::string> options;
  std::string model;
  double score = 0;
};

struct Cell {
  const PublishedRow* row = nullptr;
  double ours = std::nan("");
  MeanInterval ci;  // of ours, x 1 (scores in [0, 1]); none for an average over columns
  int samples = 0;
  std::string coverage;  // for avg: "k/n" columns of ours behind it, if not all
  bool partial = false;  // an avg over fewer of the paper's columns than its own: no difference to take
};

std::string fmt2(double v) { return std::isnan(v) ? "-" : fmt::format("{:.2f}", v); }

// Spearman's rank correlation (average ranks for ties).
double spearman(const std::vector<double>& a, const std::vector<double>& b) {
  auto ranks = [](const std::vector<double>& v) {
    std::vector<size_t> idx(v.size());
    for (size_t i = 0; i < v.size(); ++i) idx[i] = i;
    std::sort(idx.begin(), idx.end(), [&](size_t x, size_t y) { return v[x] < v[y]; });
    std::vector<double> r(v.size());
    for (size_t i = 0; i < idx.size();) {
      size_t j = i;
      while (j + 1 < idx.size() && v[idx[j + 1]] == v[idx[i]]) ++j;
      for (size_t k = i; k <= j; ++k) r[idx[k]] = (double(i) + double(j)) / 2;
      i = j + 1;
    }
    return r;
  };
  const auto ra = ranks(a), rb = ranks(b);
  double ma = 0, mb = 0;
  for (size_t i = 0; i < ra.size(); ++i) ma += ra[i], mb += rb[i];
  ma /= double(ra.size());
  mb /= double(rb.size());
  double sab = 0, saa = 0, sbb = 0;
  for (size_t i = 0; i < ra.size(); ++i) {
    sab += (ra[i] - ma) * (rb[i] - mb);
    saa += (ra[i] - ma) * (ra[i] - ma);
    sbb += (rb[i] - mb) * (rb[i] - mb);
  }
  return saa > 0 && sbb > 0 ? sab / std::sqrt(saa * sbb) : std::nan("");
}

// Ours against published, one dot per cell, coloured by method; the diagonal is agreement.
void write_scatter(const std::string& stem, const std::string& title,
                   const std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>>& series) {
  constexpr double kLeft = 60, kTop = 40, kSide = 320, kBottom = 50;
  double hi = 10;
  for (const auto& s : series)
    for (const auto& [x, y] : s.second) hi = std::max({hi, x, y});
  hi = std::ceil(hi / 10) * 10;
  size_t longest = 0;
  for (const auto& s : series) longest = std::max(longest, s.first.size());
  const double width = kLeft + kSide + 60 + 6.0 * double(longest);
  const double height = std::max(kTop + kSide + kBottom, kTop + 18.0 * double(series.size()) + 20);
  auto X = [&](double v) { return kLeft + v / hi * kSide; };
  auto Y = [&](double v) { return kTop + (1 - v / hi) * kSide; };
  write_figure(stem, width, height, [&](cairo_t* cr) {
    cairo_set_line_width(cr, 0.5);
    for (int i = 0; i <= 5; ++i) {
      const double v = hi * i / 5;
      cairo_set_source_rgb(cr, 0.88, 0.88, 0.88);
      cairo_move_to(cr, X(v), kTop);
      cairo_line_to(cr, X(v), kTop + kSide);
      cairo_move_to(cr, kLeft, Y(v));
      cairo_line_to(cr, kLeft + kSide, Y(v));
      cairo_stroke(cr);
      cairo_set_source_rgb(cr, 0, 0, 0);
      figure_text(cr, X(v), kTop + kSide + 12, fmt::format("{:g}", v), 10, 0.5);
      figure_text(cr, kLeft - 6, Y(v), fmt::format("{:g}", v), 10, 1.0);
    }
    cairo_set_source_rgb(cr, 0.5, 0.5, 0.5);
    cairo_set_dash(cr, std::array<double, 2>{4, 3}.data(), 2, 0);
    cairo_move_to(cr, X(0), Y(0));
    cairo_line_to(cr, X(hi), Y(hi));
    cairo_stroke(cr);
    cairo_set_dash(cr, nullptr, 0, 0);
    figure_frame(cr, kLeft, kTop, kSide, kSide, "Published (x 100)", "Ours (x 100)", title);
    for (size_t i = 0; i < series.size(); ++i) {
      figure_colour(cr, i);
      for (const auto& [x, y] : series[i].second) {
        cairo_arc(cr, X(x), Y(y), 3.5, 0, 2 * M_PI);
        cairo_fill(cr);
      }
      figure_legend_entry(cr, kLeft + kSide + 30, kTop, i, series[i].first);
    }
  });
}

// The models a published table lists, in the file's order.
std::vector<std::string> table_models(const std::vector<PublishedRow>& rows, const std::string& t) {
  std::vector<std::string> models;
  for (const auto& r : rows)
    if (r.table == t && std::find(models.begin(), models.end(), r.model) == models.end()) models.push_back(r.model);
  return models;
}

// The tables to compare (all of the file's, or --table's); an error where --table or --published-model
// names none of them.
std::vector<std::string> chosen_tables(const std::vector<PublishedRow>& rows, const std::string& published,
                                       const std::string& table, const std::string& model) {
  std::vector<std::string> tables;
  for (const auto& r : rows)
    if (std::find(tables.begin(), tables.end(), r.table) == tables.end()) tables.push_back(r.table);
  if (!table.empty()) {
    if (std::find(tables.begin(), tables.end(), table) == tables.end())
      fail("--table {}: {} has no rows for it (its tables: {})", table, published, fmt::join(tables, ", "));
    tables = {table};
  }
  for (const auto& t : tables)
    if (const auto models = table_models(rows, t);
        !model.empty() && std::find(models.begin(), models.end(), model) == models.end())
      fail("--published-model {}: table {} of {} lists {}", model, t, published, fmt::join(models, ", "));
  return tables;
}

}  // namespace

bool names_model(const std::string& ours, const std::string& paper) {
  auto lower = [](std::string x) {
    for (char& ch : x) ch = char(std::tolower(static_cast<unsigned char>(ch)));
    return x;
  };
  const std::string file = lower(std::filesystem::path(ours).filename().string()), name = lower(paper);
  auto separator = [](char c) { return c == '.' || c == '-' || c == '_'; };
  auto format_word = [](const std::string& w) {
    static const std::set<std::string> words = {"gguf", "safetensors", "bin",  "hf",  "f16",  "f32", "fp16", "fp32",
                                                "bf16", "int4",        "int8", "awq", "gptq", "of",  "imat"};
    const size_t digit = w.starts_with("q") ? 1 : w.starts_with("iq") ? 2 : w.starts_with("v") ? 1 : 0;
    // q4_k_m, iq2_xs, a release (v0.2: "v0" then "2", a name that leaves it out: Mistral-7B-Instruct), a
    // split file's -00001-of-00002
    const bool digits =
        std::all_of(w.begin(), w.end(), [](char c) { return std::isdigit(static_cast<unsigned char>(c)); });
    return words.count(w) || digits ||
           (digit && w.size() > digit && std::isdigit(static_cast<unsigned char>(w[digit])));
  };
  if (name.empty()) return false;
  for (size_t at = file.find(name); at != std::string::npos; at = file.find(name, at + 1)) {
    if (at > 0 && !separator(file[at - 1])) continue;
    // The rest: words between separators (q4_k_m counts as one), each a format or quantization.
    bool ok = true;
    size_t i = at + name.size();
    while (ok && i < file.size()) {
      if (!separator(file[i])) {
        ok = false;
        break;
      }
      size_t j = i + 1;
      while (j < file.size() && file[j] != '.' && file[j] != '-') ++j;
      ok = j > i + 1 && format_word(file.substr(i + 1, j - i - 1));
      i = j;
    }
    if (ok) return true;
  }
  return false;
}

void check_comparison(const std::string& published, const std::string& table, const std::string& model) {
  chosen_tables(load_published(published), published, table, model);
}

void write_comparison(const std::vector<std::string>& results, const std::string& published, const std::string& table,
                      const std::string& model, const std::string& dir, const std::set<std::string>& formats) {
  const auto rows = load_published(published);
  const std::vector<std::string> tables = chosen_tables(rows, published, table, model);
  // Our records, each cell once (copies that disagree are an error, as in the report's tables).
  std::vector<Ours> ours;
  std::set<std::string> our_models;
  report::for_each_distinct_record(result_files(results), [&](const json& j, const std::string& f, int no) {
    Ours o;
    o.config = j["config"];
    o.pooled = report::pooled_config(j).dump();
    o.id = j.value("id", "");
    if (o.config.contains("options"))
      for (const auto& [k, v] : o.config["options"].items())
        if (v.is_string()) o.options[k] = v.get<std::string>();
    o.model = o.config.value("model", "");
    o.score = report::record_score(j, fmt::format("{}:{}", f, no));
    ours.push_back(std::move(o));
  });
  if (ours.empty()) fail("no result records in the given files");
  for (const auto& o : ours) our_models.insert(o.model);
  std::filesystem::create_directories(dir);

  int written = 0;
  for (const auto& t : tables) {
    std::vector<const PublishedRow*> trows;
    const std::string paper_model = model.empty() ? table_models(rows, t).front() : model;
    for (const auto& r : rows)
      if (r.table == t && r.model == paper_model) trows.push_back(&r);

    const Scale scale = report::scale_of(trows.front()->task);
    // Our mean for the row's configuration at a column (the row's own, or another of the table's).
    auto mean_ours = [&](const PublishedRow& row, const std::string& column, int& samples, MeanInterval* ci = nullptr) {
      PublishedRow r = row;
      r.column = column;
      const std::string base = best_of(row);
      if (!base.empty()) r.method = base;
      // Our records behind the cell, by configuration, each by RULER task or LongBench dataset.
      // As in the report's tables: runs over parts of one grid pool, and a sample they share counts once.
      std::map<std::string, std::map<std::string, std::vector<double>>> configs;
      std::set<std::pair<std::string, std::string>> counted;
      for (const auto& o : ours)
        if (o.config.value("task", "") == r.task && row_matches_config(r, o.config) &&
            column_in_options(r, o.options) && counted.emplace(o.pooled, o.id).second) {
          const auto opt = [&](const char* k) { return o.options.count(k) ? o.options.at(k) : std::string(); };
          configs[o.pooled][opt("task") + opt("dataset")].push_back(o.score);
        }
      // Averaging two of our configurations into one published cell would be a number of neither; a
      // derived row takes the best of them instead.
      if (base.empty() && configs.size() > 1) {
        std::string list;
        for (const auto& [config, strata] : configs) list += (list.empty() ? "" : " | ") + config;
        fail(
            "{}:{}: published row {} matches {} configurations in the results (they differ in a parameter the row "
            "does not list, the model or a task option): {}; report one run's results, or list the parameter in the "
            "row",
            r.file, r.line, describe(r), configs.size(), list);
      }
      double best = std::nan("");
      samples = 0;
      for (const auto& [config, strata] : configs) {
        std::vector<std::vector<double>> groups;
        for (const auto& [variant, scores] : strata) groups.push_back(scores);
        const MeanInterval m = score_interval(groups);
        if (std::isnan(best) || m.mean > best) {
          best = m.mean;
          samples = m.n;
          // The best of several means is not a mean of samples: no interval for a derived row.
          if (ci && base.empty()) *ci = m;
        }
      }
      return scaled(best, scale);
    };
    // The table's columns (those a paper's average is over), in the papers' order.
    std::vector<std::string> columns;
    for (const PublishedRow* r : trows)
      if (std::find(columns.begin(), columns.end(), r->column) == columns.end()) columns.push_back(r->column);
    std::stable_sort(columns.begin(), columns.end(), [&](const std::string& a, const std::string& b) {
      return std::pair(summary_column(a), column_order(trows.front()->task, a)) <
             std::pair(summary_column(b), column_order(trows.front()->task, b));
    });
    std::vector<Cell> cells;
    for (const PublishedRow* r : trows) {
      Cell c;
      c.row = r;
      // A task without columns (NIAH) has one score, which is its own cell.
      if (!summary_column(r->column) || TaskRegistry::get().info(r->task).layout.column_option.empty()) {
        c.ours = mean_ours(*r, r->column, c.samples, &c.ci);
      } else if (r->column == "avg") {
        // The paper's average against ours over the table's columns, where we have them. A table that
        // prints only averages does not say which columns it averaged: ours is then the mean over the
        // task's columns our records hold, their count shown.
        std::vector<std::string> over;
        for (const auto& col : columns)
          if (!summary_column(col)) over.push_back(col);
        const bool printed = !over.empty();
        if (!printed)
          for (const auto& rc : report::layout_of(r->task).columns) over.push_back(rc.key);
        // Perplexities average as the report's own table does: exp of the mean of their logs.
        const bool ppl = scale == Scale::Perplexity;
        double sum = 0;
        int n = 0;
        for (const auto& col : over) {
          int samples = 0;
          if (const double v = mean_ours(*r, col, samples); !std::isnan(v)) sum += ppl ? std::log(v) : v, ++n;
        }
        if (n) c.ours = ppl ? std::exp(sum / n) : sum / n;
        if (n && printed && n < int(over.size())) {
          c.coverage = fmt::format("{}/{}", n, over.size());
          c.partial = true;
        }
        if (n && !printed) c.coverage = fmt::format("over {} of ours", n);
      }
      cells.push_back(c);
    }
    // Without --table every table of the file is a candidate: one none of our records reach (another
    // model's, another task's) would only print empty cells.
    if (table.empty() && std::all_of(cells.begin(), cells.end(), [](const Cell& c) { return std::isnan(c.ours); })) {
      fmt::print(stderr, "{}: no record of ours matches a cell of table {}; not written\n", published, t);
      continue;
    }
    ++written;

    // The paper's layout: blocks by (length, budget) in the order the table lists them.
    std::vector<std::pair<int, KvBudget>> blocks;
    std::vector<std::pair<std::string, std::map<std::string, std::string>>> methods;
    for (const auto& c : cells) {
      const PublishedRow& r = *c.row;
      const std::pair<int, KvBudget> b{r.length, r.budget};
      if (std::none_of(blocks.begin(), blocks.end(),
                       [&](const auto& x) { return x.first == b.first && same_budget(x.second, b.second); }))
        blocks.push_back(b);
      const std::pair<std::string, std::map<std::string, std::string>> m{r.method, r.params};
      if (std::find(methods.begin(), methods.end(), m) == methods.end()) methods.push_back(m);
    }
    const std::string task = trows.front()->task;
    Table out;
    out.caption =
        fmt::format("{}: ours ({}) vs published ({}), {}", t, fmt::join(our_models.begin(), our_models.end(), ", "),
                    paper_model, scale == Scale::Perplexity ? "perplexities" : "scores x 100");
    out.columns = {"Method"};
    for (const auto& c : columns) out.columns.push_back(c == "avg" ? "Avg." : column_name(task, c));
    std::vector<double> xs, ys;
    std::vector<std::pair<std::string, std::vector<std::pair<double, double>>>> series;
    // Whether our records ran the paper's model: only then can a published value fall inside our interval
    // by more than chance.
    const bool same_model = our_models.size() == 1 && names_model(*our_models.begin(), paper_model);
    int inside = 0, with_interval = 0;
    std::string cells_csv =
        "table,model,method,params,budget,task,length,column,published,ours,ci_low,ci_high,samples,difference,"
        "published_inside,coverage\n";
    for (const auto& block_key : blocks) {
      // Plain names, not a structured binding: lambdas below capture them (clang 14 cannot).
      const int length = block_key.first;
      const KvBudget budget = block_key.second;
      Table::Block block;
      block.heading = (budget.is_full()    ? std::string("Full cache")
                       : budget.is_ratio() ? fmt::format("Compression ratio = {}", budget.ratio)
                                           : fmt::format("KV size = {}", budget.tokens)) +
                      (length ? fmt::format(", context length = {}", length) : "");
      for (const auto& method_key : methods) {
        const std::string& method = method_key.first;
        const std::map<std::string, std::string>& params = method_key.second;
        const std::string label = (method == "fullkv" ? std::string("FullKV") : method) +
                                  (params.empty() ? "" : " (" + params_text(params) + ")");
        std::vector<std::string> mine = {label}, theirs = {label + ", published"}, diff = {label + ", difference"};
        bool any = false;
        for (const auto& col : columns) {
          const auto it = std::find_if(cells.begin(), cells.end(), [&](const Cell& c) {
            const PublishedRow& r = *c.row;
            return r.method == method && r.params == params && r.length == length && same_budget(r.budget, budget) &&
                   r.column == col;
          });
          if (it == cells.end()) {
            // Not published (or not transcribed): ours alone, from any row of the configuration.
            const auto like = std::find_if(trows.begin(), trows.end(), [&](const PublishedRow* r) {
              return r->method == method && r->params == params && r->length == length &&
                     same_budget(r->budget, budget);
            });
            int samples = 0;
            const double v =
                like != trows.end() && !summary_column(col) ? mean_ours(**like, col, samples) : std::nan("");
            mine.push_back(std::isnan(v) ? "" : fmt2(v));
            theirs.push_back("");
            diff.push_back("");
            continue;
          }
          any = true;
          const Cell& c = *it;
          const bool has_ci = !std::isnan(c.ours) && c.ci.has_interval();
          const bool in = has_ci && scaled(c.ci.low, scale) <= c.row->score && c.row->score <= scaled(c.ci.high, scale);
          with_interval += has_ci;
          inside += in;
          mine.push_back((has_ci ? interval_text(c.ci, scale) : fmt2(c.ours)) +
                         (c.coverage.empty() ? "" : " (" + c.coverage + ")"));
          theirs.push_back(fmt2(c.row->score) + (same_model && in ? " (in)" : ""));
          const bool comparable = !std::isnan(c.ours) && !c.partial;
          diff.push_back(comparable ? fmt::format("{:+.2f}", c.ours - c.row->score) : "-");
          cells_csv += fmt::format("{},{},{},{},{},{},{},{},{},{},{},{},{},{},{},{}\n", csv_field(t),
                                   csv_field(paper_model), method, csv_field(params_text(params)), budget_text(budget),
                                   task, length ? std::to_string(length) : "", col, c.row->score,
                                   std::isnan(c.ours) ? "" : fmt::format("{:.4f}", c.ours),
                                   has_ci ? fmt::format("{:.4f}", scaled(c.ci.low, scale)) : "",
                                   has_ci ? fmt::format("{:.4f}", scaled(c.ci.high, scale)) : "", c.samples,
                                   comparable ? fmt::format("{:.4f}", c.ours - c.row->score) : "",
                                   has_ci ? (in ? "yes" : "no") : "", c.coverage);
          if (!std::isnan(c.ours) && col != "avg") {
            xs.push_back(c.row->score);
            ys.push_back(c.ours);
            auto s = std::find_if(series.begin(), series.end(), [&](const auto& x) { return x.first == label; });
            if (s == series.end()) s = series.insert(series.end(), {label, {}});
            s->second.push_back({c.row->score, c.ours});
          }
        }
        if (!any) continue;
        block.rows.push_back(mine);
        block.rows.push_back(theirs);
        block.rows.push_back(diff);
      }
      if (!block.rows.empty()) out.blocks.push_back(block);
    }
    const double rho = xs.size() >= 3 ? spearman(xs, ys) : std::nan("");
    // The cells counted: all but the averages over columns, unless the table prints only averages.
    const bool only_averages =
        std::all_of(cells.begin(), cells.end(), [](const Cell& c) { return c.row->column == "avg"; });
    auto compared = [&](bool with_ours) {
      return std::count_if(cells.begin(), cells.end(), [&](const Cell& c) {
        return (only_averages || c.row->column != "avg") && (!with_ours || !std::isnan(c.ours));
      });
    };
    out.note = fmt::format(
        "Ours: the mean over our records of each cell (samples in {}-cells.csv); published: as printed in the paper "
        "for {}; difference: ours - published. Avg.: ours over the same columns as the paper's average; (k/n) where we "
        "have k of its n columns (over k of ours: a table of averages alone, ours over the task's columns we ran); "
        "[low, high]: our 95% interval over samples. {} of {} published cells have ours{}. {}",
        "compare-" + t, paper_model, compared(true), compared(false),
        std::isnan(rho) ? ""
                        : fmt::format("; Spearman's rank correlation of ours with published over them: {:.2f}", rho),
        same_model ? fmt::format("Our records ran the paper's model: {} of the {} published values with an interval of "
                                 "ours lie inside it (marked (in)).",
                                 inside, with_interval)
                   : "Our model is not the paper's, so the intervals say how precise ours are, not whether we "
                     "reproduce the paper.");
    const std::string stem = dir + "/compare-" + t;
    write_table(out, stem, formats);
    std::ofstream(stem + "-cells.csv") << cells_csv;
    write_scatter(stem, fmt::format("{}: ours vs published ({})", t, paper_model), series);
    fmt::print("{}\nwrote {}.{{{}}}, {}-cells.csv, {}.png and .svg\n", to_markdown(out), stem,
               fmt::format("{}", fmt::join(formats, ",")), stem, stem);
  }
  if (!written)  // a warning: the other reports of the same command are written by now
    fmt::print(stderr,
               "warning: {}: none of its tables ({}) has a cell our records match (their models: {}); no compare-* "
               "written; check the records' task, methods and KV sizes\n",
               published, fmt::join(tables, ", "), fmt::join(our_models, ", "));
}

}  // namespace kvb
