#pragma once
// Reports from results files (or directories of them): a summary table per configuration (score as
// the benchmarks report it, mean x 100, and the KV cache kept as a share of the full cache); per task
// a method x KV size table and heatmap; the papers' tables for LongBench (categories over datasets,
// one block per KV size) and RULER (per context length, and across lengths); for
// Needle-in-a-Haystack one depth x length heatmap per configuration.
#include <nlohmann/json.hpp>
#include <set>
#include <string>
#include <vector>

#include "harness/method/method.hpp"

namespace kvb {

// Writes the tables in the given formats (md, csv, tex) and the figures (PNG, SVG) under `dir`;
// prints the summary table.
void write_report(const std::vector<std::string>& results, const std::string& dir,
                  const std::set<std::string>& formats = {"md", "csv"});

// A method's recorded parameters as "key=value key=value", "-" for none.
std::string params_text(const nlohmann::json& params);

// The results files named, directories expanded to their .jsonl files (sorted); a missing one is an error.
std::vector<std::string> result_files(const std::vector<std::string>& inputs);

// A column's heading in the papers' tables: LongBench's short dataset names (NrtvQA), RULER's task
// abbreviations (MK1); any other column as it is.
std::string column_name(const std::string& task, const std::string& column);
// The column's place in the papers' order (LongBench's categories, RULER's task list); later for others.
size_t column_order(const std::string& task, const std::string& column);

}  // namespace kvb
