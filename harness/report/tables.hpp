#pragma once
// The report's tables and figures from its records: the summary of every configuration (with each
// one's depth x length heatmap where its task has one), method x KV size per task (table, heatmap,
// memory plot), and the task's paper layout (harness/task/task.hpp, TaskLayout).
#include <set>
#include <string>
#include <vector>

#include "harness/report/records.hpp"
#include "harness/report/table.hpp"

namespace kvb::report {

// Writes the summary as `dir`/summary.*; `used` collects the heatmaps' file stems.
Table write_summary(const Records& r, const std::string& dir, const std::set<std::string>& formats,
                    std::set<std::string>& used);
void write_method_budget(const std::string& task, const std::vector<const Entry*>& es, const std::string& dir,
                         const std::set<std::string>& formats);
// Returns the files written, as ", name" items for the report's list.
std::string write_paper_tables(const std::string& task, const std::vector<const Entry*>& es, const std::string& dir,
                               const std::set<std::string>& formats);
// A configuration's depth x length heatmap; `used` keeps the names already written, so that
// configurations differing only in parameters get numbered files instead of overwriting each other.
void write_depth_heatmap(const Group& g, const std::string& dir, std::set<std::string>& used);

}  // namespace kvb::report
