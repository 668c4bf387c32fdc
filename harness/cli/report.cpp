// kvbench report: tables and figures of results files, optionally beside a paper's published numbers.
#include <filesystem>
#include <fstream>
#include <set>

#include "harness/cli/commands.hpp"
#include "harness/experiment/coverage.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/report/comparison.hpp"
#include "harness/report/paired.hpp"
#include "harness/report/report.hpp"
#include "harness/task/longbench_metrics.hpp"
#include "harness/task/task.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

void register_report_command(CLI::App& app) {
  auto* cmd =
      app.add_subcommand("report", "Tables (paper layouts; Markdown, CSV, LaTeX) and heatmaps (PNG, SVG) from results");
  auto files = std::make_shared<std::vector<std::string>>();
  auto dir = std::make_shared<std::string>("reports");
  auto formats = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"md", "csv"});
  cmd->add_option("results", *files, "Results JSONL files or directories of them (kvbench run or run-task)");
  auto* dir_opt = cmd->add_option("--out-dir", *dir, "Directory for tables and figures");
  cmd->add_option("--format", *formats, "Table formats: md, csv, tex (comma-separated)")->delimiter(',');
  struct Compare {
    std::string published, table, model, baseline, coverage;
  };
  auto c = std::make_shared<Compare>();
  cmd->add_option("--compare", c->published,
                  "A published.csv (experiments/papers/<paper>/): also writes ours beside the paper's numbers, per "
                  "table (compare-<table>.*)");
  cmd->add_option("--table", c->table, "With --compare: only this table (a spec's file name, e.g. table1_longbench)");
  cmd->add_option("--published-model", c->model,
                  "With --compare: the paper's model whose numbers to show (default: the first the table lists)");
  cmd->add_option("--baseline", c->baseline,
                  "METHOD[:key=value,...]: also writes each method's score minus this one's on the same samples, "
                  "with paired 95% intervals (<task>-vs-<baseline>.*)");
  cmd->add_option("--coverage", c->coverage,
                  "Instead of results: how many printed cells of the papers' tables kvbench can regenerate, per paper "
                  "and table, and what blocks the rest (DIR: the paper folders, e.g. experiments/papers; printed, "
                  "and written to --out-dir/coverage.md where --out-dir is given)");
  cmd->callback([files, dir, dir_opt, formats, c] {
    if (!c->coverage.empty()) {
      if (!files->empty()) fail("report --coverage reads the paper folders, not results files");
      const std::string text = coverage_markdown(paper_coverage(c->coverage));
      fmt::print("{}", text);
      if (dir_opt->count()) {
        std::filesystem::create_directories(*dir);
        const std::string path = *dir + "/coverage.md";
        std::ofstream out(path);
        if (!(out << text)) fail("{}: cannot write", path);
        fmt::print(stderr, "wrote {}\n", path);
      }
      return;
    }
    if (files->empty()) fail("report: give results files (or directories of them), or --coverage DIR");
    const std::set<std::string> f(formats->begin(), formats->end());
    if (!c->baseline.empty()) check_baseline(*files, c->baseline);
    if (!c->published.empty()) check_comparison(c->published, c->table, c->model);
    write_report(*files, *dir, f);
    if (!c->baseline.empty()) write_paired_comparison(*files, c->baseline, *dir, f);
    if (!c->published.empty()) write_comparison(*files, c->published, c->table, c->model, *dir, f);
  });
}

}  // namespace kvb::cli
