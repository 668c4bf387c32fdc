#pragma once
// Ours beside a paper's published numbers (harness/experiment/published.hpp reads and checks them).
#include <set>
#include <string>
#include <vector>

namespace kvb {

// Ours beside the published values for each table of `published` (or only `table`), in the paper's
// layout (blocks by budget, a row each for ours, published and the difference), as md/csv/tex, the
// cells as CSV and a figure of ours against published; for the paper's model `model` (default: the
// first the table lists).
void write_comparison(const std::vector<std::string>& results, const std::string& published, const std::string& table,
                      const std::string& model, const std::string& dir, const std::set<std::string>& formats);
// Whether our model file (a GGUF's name, a checkpoint folder's) is the paper's model: its name, set apart
// by separators, with nothing after it but the file's format and quantization (Meta-Llama-3-8B.Q4_K_M.gguf
// is Llama-3-8B; Llama-3-8B-Instruct is not).
bool names_model(const std::string& ours, const std::string& paper);
// write_comparison's errors about `table` and `model`, before anything is written.
void check_comparison(const std::string& published, const std::string& table, const std::string& model);

}  // namespace kvb
