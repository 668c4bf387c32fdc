#pragma once
// A paper's published numbers as data, and ours beside them. experiments/papers/<paper>/published.csv
// holds one row per published cell:
//   table,model,method,params,budget,task,length,column,score
// table: the spec (file stem) that regenerates it; model: the paper's model; method: the registry's
// name; params: space-separated key=value the spec sets for that method entry (blank if none);
// budget: a KV size, r<p_c> for a compression ratio, or full; task: longbench, longbench-e, ruler or
// niah; length: RULER's context length (blank: the mean over
// the lengths the spec runs; blank for other tasks); column: a LongBench dataset, a RULER task, avg
// (the paper's average) or score (a single NIAH score); score: as printed (x 100).
#include <map>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/method/method.hpp"

namespace kvb {

struct PublishedRow {
  std::string file;
  int line = 0;
  std::string table, model, method;
  std::map<std::string, std::string> params;
  KvBudget budget;
  std::string task;
  int length = 0;
  std::string column;
  double score = 0;
};

// Reads and validates a published.csv; errors name the file, line and field.
std::vector<PublishedRow> load_published(const std::string& path);

struct PublishedChecks {
  bool methods = true;  // false: rows of methods the spec does not run are left out, not errors
  bool budgets = true, columns = true;
};

// Checks that every row of `table` names a cell of the spec: a configuration (method, the listed
// parameters, budget; `configs` as cell_config keys them) and a column among the task variants
// (their options); `checks` leaves out the methods not run, the budget or the column. Errors name the row, and the spec
// must have rows.
void check_published(const std::vector<PublishedRow>& rows, const std::string& table, const std::string& spec_path,
                     const std::string& task, const std::vector<nlohmann::json>& configs,
                     const std::vector<std::map<std::string, std::string>>& variants, PublishedChecks checks = {});

// Ours beside the published values for each table of `published` (or only `table`), in the paper's
// layout (blocks by budget, a row each for ours, published and the difference), as md/csv/tex, the
// cells as CSV and a figure of ours against published; for the paper's model `model` (default: the
// first the table lists).
void write_comparison(const std::vector<std::string>& results, const std::string& published, const std::string& table,
                      const std::string& model, const std::string& dir, const std::set<std::string>& formats);

}  // namespace kvb
