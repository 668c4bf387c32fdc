#pragma once
// A paper's published numbers as data, checked against the spec that regenerates them (report/comparison.hpp
// puts ours beside them). experiments/papers/<paper>/published.csv
// holds one row per published cell:
//   table,model,method,params,budget,task,length,column,score
// table: the spec (file stem) that regenerates it; model: the paper's model; method: the registry's
// name; params: space-separated key=value the spec sets for that method entry (blank if none);
// budget: a KV size, r<p_c> for a compression ratio, or full; task: longbench, longbench-e, ruler or
// niah; length: RULER's context length (blank: the mean over
// the lengths the spec runs; blank for other tasks); column: a LongBench dataset, a RULER task, avg
// (the paper's average) or score (a single NIAH score); score: as printed (x 100).
#include <map>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "harness/method/method.hpp"

namespace kvb {

// What the papers' tables name that kvbench lacks (experiments/papers/external.yaml beside the paper
// folders): methods, parameters of registered methods, tasks with their columns, each with a line
// saying what it is and where its reference lives; and every model a published.csv names, with its
// architecture. A published row may name these; any other unknown name is an error.
struct ExternalNames {
  std::string file;                                                      // empty: there is none
  std::map<std::string, std::string> methods;                            // name -> what and reference
  std::map<std::string, std::map<std::string, std::string>> parameters;  // method -> parameter -> what
  std::map<std::string, std::vector<std::string>> tasks;                 // task -> its columns
  std::map<std::string, std::string> models;                             // model -> architecture
};
// Reads `path`; a path that does not exist gives the empty declarations.
ExternalNames load_external_names(const std::string& path);
// The declarations that apply to a published.csv: external.yaml in the folder above the CSV's.
std::string external_names_path(const std::string& published_csv);

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
  std::string printed;  // the score as the CSV writes it (its decimals are the paper's)
  // Non-empty for a row that names what kvbench lacks (declared in external.yaml): "method kivi",
  // "parameter paging of h2o", "task gsm8k". No spec runs it; the checks against specs leave it out.
  std::string external;
};

// Reads and validates a published.csv; errors name the file, line and field. Methods, their
// parameters, tasks and columns are kvbench's (its registries) or declared external (`names`, by
// default the CSV's external.yaml); so are models where the declarations list any.
std::vector<PublishedRow> load_published(const std::string& path);
std::vector<PublishedRow> load_published(const std::string& path, const ExternalNames& names);

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

// A budget as published.csv writes it: a KV size, r<p_c> or full.
std::string budget_text(const KvBudget& b);
// Parameters as published.csv writes them: space-separated key=value.
std::string params_text(const std::map<std::string, std::string>& p);
// The row named for errors: method (parameters) at budget, column (at length).
std::string describe(const PublishedRow& r);
bool same_budget(const KvBudget& a, const KvBudget& b);
// The row's method, parameters (those it lists) and, unless `budget` is false, budget are the
// configuration's (a cell config as the results record it).
bool row_matches_config(const PublishedRow& r, const nlohmann::json& c, bool budget = true);
// A row the paper derives from its other rows rather than runs: KVCrush* is, per column, the best of the
// table's KVCrush rows ("KVCrush paired with the top-performing KV compression method", KVCrush's
// Table 3, where every printed cell equals that maximum). Returns the method whose configurations it
// takes the best of, or "" for an ordinary row.
std::string best_of(const PublishedRow& r);
// Whether a task variant's options hold the row's column (a LongBench dataset, a RULER task and length).
bool column_in_options(const PublishedRow& r, const std::map<std::string, std::string>& o);
// avg and score summarise other columns.
bool summary_column(const std::string& c);

}  // namespace kvb
