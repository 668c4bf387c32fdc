#include "harness/experiment/coverage.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <ranges>
#include <set>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/published.hpp"
#include "harness/model/config.hpp"
#include "harness/util/error.hpp"

namespace kvb {

namespace fs = std::filesystem;
using nlohmann::json;

namespace {

// The spec's configurations as the published checks read them: method, parameters with their
// defaults (as results record them), budget.
std::vector<json> spec_configs(const ExperimentSpec& spec) {
  std::vector<json> out;
  for (const auto& c : spec.configs) {
    json j = {{"method", c.name}, {"params", MethodRegistry::get().resolve(c.name, c.params).values()}};
    if (c.budget.is_ratio())
      j["compression_ratio"] = c.budget.ratio;
    else if (!c.budget.is_full())
      j["budget"] = c.budget.tokens;
    out.push_back(std::move(j));
  }
  return out;
}

// Why kvbench cannot regenerate the row from the registries and declarations alone.
std::vector<std::string> registry_blockers(const PublishedRow& r, const ExternalNames& names) {
  std::vector<std::string> b;
  const std::string method = best_of(r).empty() ? r.method : best_of(r);
  if (names.methods.count(method)) b.push_back("method " + method);
  if (const auto it = names.parameters.find(method); it != names.parameters.end())
    for (const auto& [k, v] : r.params)
      if (it->second.count(k)) b.push_back(fmt::format("parameter {} of {}", k, method));
  if (names.tasks.count(r.task)) b.push_back("task " + r.task);
  const auto& archs = supported_architectures();
  if (const auto it = names.models.find(r.model);
      it != names.models.end() && std::find(archs.begin(), archs.end(), it->second) == archs.end())
    b.push_back("architecture " + it->second);
  return b;
}

// Half a unit in the last printed digit.
double rounding(const std::string& printed) {
  const size_t dot = printed.find('.');
  return 0.5 * std::pow(10.0, dot == std::string::npos ? 0.0 : -static_cast<double>(printed.size() - dot - 1));
}

// The row's configuration as describe() names it, without its column: method (parameters) at budget.
std::string configuration_of(const PublishedRow& r) {
  const std::string d = describe(r);
  return d.substr(0, d.find(", column"));
}

// Printed averages against the mean of the same row's printed cells, for rows that print every column
// the table's fullest row prints (a row with unprinted cells averages what is not there): a difference
// beyond rounding (half a unit in the last digit of the average and of the cells) is listed.
std::vector<std::string> average_mismatches(const std::vector<const PublishedRow*>& rows) {
  std::map<std::string, std::vector<const PublishedRow*>> groups;
  for (const auto* r : rows) groups[fmt::format("{}|{}|{}", r->model, configuration_of(*r), r->length)].push_back(r);
  size_t full = 0;
  for (const auto& g : groups | std::views::values) full = std::max(full, g.size());
  std::vector<std::string> out;
  for (const auto& g : groups | std::views::values) {
    const PublishedRow* avg = nullptr;
    double sum = 0, cell_rounding = 0;
    int n = 0;
    for (const auto* r : g) {
      if (r->column == "avg") {
        avg = r;
      } else if (!summary_column(r->column)) {
        sum += r->score, ++n;
        cell_rounding = std::max(cell_rounding, rounding(r->printed));
      }
    }
    if (!avg || n < 2 || g.size() < full) continue;
    const double mean = sum / n, tolerance = rounding(avg->printed) + cell_rounding + 1e-9;
    if (std::abs(mean - avg->score) > tolerance)
      out.push_back(fmt::format("{}:{}: {} ({}), avg printed {}, its {} cells give {:.3f}", avg->file, avg->line,
                                configuration_of(*avg), avg->model, avg->score, n, mean));
  }
  return out;
}

}  // namespace

std::vector<TableCoverage> paper_coverage(const std::string& papers_dir) {
  if (!fs::is_directory(papers_dir)) fail("{}: not a directory of paper folders", papers_dir);
  const ExternalNames names = load_external_names((fs::path(papers_dir) / "external.yaml").string());
  std::vector<fs::path> folders;
  for (const auto& e : fs::directory_iterator(papers_dir))
    if (e.is_directory() && fs::exists(e.path() / "published.csv")) folders.push_back(e.path());
  std::sort(folders.begin(), folders.end());
  if (folders.empty()) fail("{}: no paper folder holds a published.csv", papers_dir);
  std::vector<TableCoverage> out;
  for (const auto& dir : folders) {
    const auto rows = load_published((dir / "published.csv").string(), names);
    std::vector<std::string> tables;
    for (const auto& r : rows)
      if (std::find(tables.begin(), tables.end(), r.table) == tables.end()) tables.push_back(r.table);
    for (const auto& table : tables) {
      TableCoverage t;
      t.paper = dir.filename().string();
      t.table = table;
      std::vector<const PublishedRow*> mine;
      for (const auto& r : rows)
        if (r.table == table) mine.push_back(&r);
      const fs::path spec_path = dir / (table + ".yaml");
      std::optional<ExperimentSpec> spec;
      // The specs name their model as ${MODEL}; nothing is loaded here, so any existing file stands in.
      if (fs::exists(spec_path)) spec = load_experiment(spec_path.string(), {"model=" + spec_path.string()});
      const auto configs = spec ? spec_configs(*spec) : std::vector<json>{};
      for (const auto* r : mine) {
        ++t.cells;
        auto blockers = registry_blockers(*r, names);
        if (blockers.empty() && !spec) blockers.push_back(fmt::format("no spec {}.yaml", table));
        if (blockers.empty()) {
          try {
            check_published({*r}, table, spec->path, spec->task, configs, spec->task_variants);
          } catch (const Error&) {
            blockers.push_back(fmt::format("not run by {}.yaml", table));
          }
        }
        if (blockers.empty()) ++t.regenerable;
        for (const auto& b : blockers) ++t.blockers[b];
      }
      t.average_mismatches = average_mismatches(mine);
      out.push_back(std::move(t));
    }
  }
  return out;
}

std::string coverage_markdown(const std::vector<TableCoverage>& tables) {
  std::string s = "# Printed cells kvbench can regenerate\n";
  auto pct = [](size_t a, size_t b) { return b ? 100.0 * static_cast<double>(a) / static_cast<double>(b) : 0.0; };
  std::map<std::string, size_t> all_blockers;
  std::vector<std::string> mismatches;
  size_t cells = 0, regen = 0;
  for (size_t i = 0; i < tables.size();) {
    const std::string paper = tables[i].paper;
    s += fmt::format("\n## {}\n\n| table | cells | regenerable | % | blockers (cells) |\n|---|---:|---:|---:|---|\n",
                     paper);
    size_t pc = 0, pr = 0;
    for (; i < tables.size() && tables[i].paper == paper; ++i) {
      const auto& t = tables[i];
      std::string b;
      for (const auto& [name, n] : t.blockers) {
        b += fmt::format("{}{} ({})", b.empty() ? "" : "; ", name, n);
        all_blockers[name] += n;
      }
      s += fmt::format("| {} | {} | {} | {:.1f} | {} |\n", t.table, t.cells, t.regenerable, pct(t.regenerable, t.cells),
                       b.empty() ? "–" : b);
      pc += t.cells, pr += t.regenerable;
      mismatches.insert(mismatches.end(), t.average_mismatches.begin(), t.average_mismatches.end());
    }
    s += fmt::format("| **all** | **{}** | **{}** | **{:.1f}** | |\n", pc, pr, pct(pr, pc));
    cells += pc, regen += pr;
  }
  s += fmt::format("\n## All papers\n\n{} of {} printed cells regenerable ({:.1f}%).\n", regen, cells,
                   pct(regen, cells));
  if (!all_blockers.empty()) {
    std::vector<std::pair<size_t, std::string>> by_cells;
    for (const auto& [name, n] : all_blockers) by_cells.emplace_back(n, name);
    std::sort(by_cells.begin(), by_cells.end(), [](const auto& a, const auto& b) {
      return a.first != b.first ? a.first > b.first : a.second < b.second;
    });
    s += "\n| blocker | cells |\n|---|---:|\n";
    for (const auto& [n, name] : by_cells) s += fmt::format("| {} | {} |\n", name, n);
  }
  if (!mismatches.empty()) {
    s += "\nPrinted averages that differ from their own cells (published.csv keeps the printed value):\n\n";
    for (const auto& m : mismatches) s += "- " + m + "\n";
  }
  return s;
}

}  // namespace kvb
