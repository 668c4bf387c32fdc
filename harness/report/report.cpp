#include "harness/report/report.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <set>

#include "harness/experiment/results.hpp"
#include "harness/report/records.hpp"
#include "harness/report/table.hpp"
#include "harness/report/tables.hpp"
#include "harness/util/error.hpp"

namespace kvb {

using nlohmann::json;
using report::layout_of;

std::string params_text(const json& params) {
  std::string s;
  for (const auto& [k, v] : params.items())
    if (!v.get<std::string>().empty())  // an empty file parameter (the default artifact) says nothing
      s += (s.empty() ? "" : " ") + k + "=" + v.get<std::string>();
  return s.empty() ? "-" : s;
}

std::vector<std::string> result_files(const std::vector<std::string>& inputs) {
  std::vector<std::string> files;
  for (const auto& in : inputs) {
    if (!std::filesystem::exists(in)) fail("{}: not found", in);
    if (std::filesystem::is_directory(in)) {
      std::vector<std::string> found;
      for (const auto& e : std::filesystem::directory_iterator(in))
        if (is_results_file_name(e.path().filename().string())) found.push_back(e.path().string());
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

void write_report(const std::vector<std::string>& inputs, const std::string& dir,
                  const std::set<std::string>& formats) {
  for (const auto& f : formats)
    if (f != "md" && f != "csv" && f != "tex") fail("report format '{}': expected md, csv or tex", f);
  report::Records r = report::read_records(result_files(inputs));
  report::label_entries(r);
  std::filesystem::create_directories(dir);
  std::set<std::string> used;
  const Table summary = report::write_summary(r, dir, formats, used);
  std::string written = "summary", figures;
  std::set<std::string> tasks;
  for (const auto& e : r.entries) tasks.insert(e.task);
  for (const auto& task : tasks) {
    std::vector<const report::Entry*> es;
    for (const auto& e : r.entries)
      if (e.task == task) es.push_back(&e);
    report::write_method_budget(task, es, dir, formats);
    written += ", " + task + "-method-budget" + report::write_paper_tables(task, es, dir, formats);
    // The score-against-memory figure is drawn where scores are percentages (tables.cpp).
    if (report::scale_of(task) != Scale::Perplexity) figures += (figures.empty() ? "" : ", ") + task + "-memory";
  }
  fmt::print(
      "{}\nwrote to {}: {} (tables as {}){}{}\n", to_markdown(summary), dir, written,
      [&] {
        std::string f;
        for (const auto& x : formats) f += (f.empty() ? "" : ", ") + x;
        return f;
      }(),
      figures.empty() ? "" : "; figures " + figures + " (.png, .svg, .csv)",
      used.empty() ? "" : "; depth x length heatmaps TASK-METHOD-*.png, .svg, .csv");
}

}  // namespace kvb
