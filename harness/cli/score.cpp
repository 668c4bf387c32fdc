// kvbench score: predictions made anywhere, scored with a benchmark's own metric.
#include <fmt/format.h>
#include <cmath>
#include <fstream>

#include <nlohmann/json.hpp>

#include "harness/cli/commands.hpp"
#include "harness/task/task.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

using nlohmann::json;

void register_score_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("score", "Score predictions made anywhere with a benchmark's own metric");
  struct Args {
    std::string task, predictions, out, data = default_data_dir();
    bool by_length = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("--task", a->task,
                  "TASK/VARIANT: longbench/DATASET, longbench-e/DATASET, ruler/TASK, niah or jsonl/METRIC")
      ->required();
  cmd->add_option("predictions", a->predictions,
                  "JSONL in LongBench's pred/ layout: pred, answers (all_classes, length where needed) per line")
      ->required();
  cmd->add_flag("--longbench-e,--by-length", a->by_length,
                "Also score by length range (0-4k, 4-8k, 8k+) as LongBench-E, from each line's length (implied by "
                "--task longbench-e/DATASET)");
  cmd->add_option("--data", a->data, "Data folder with jieba's tables (the Chinese datasets)");
  cmd->add_option("--out", a->out, "Write the scores as JSON, as LongBench's eval.py writes result.json");
  cmd->callback([a] {
    // A longbench-e task is scored by length range, as eval.py --e does (and Python's kvbench.score).
    a->by_length = a->by_length || a->task.starts_with("longbench-e/");
    const auto r = score_predictions_file(a->task, a->predictions, a->by_length, a->data);
    // Keyed as eval.py's result.json: by the dataset (the part after the task's name).
    const std::string key = a->task.substr(a->task.find('/') + 1);
    json j;
    if (a->by_length) {
      for (const auto& [range, s] : r.ranges) j[key][range] = std::isnan(s) ? json() : json(s);
    } else {
      j[key] = r.score;
    }
    fmt::print("{} ({} predictions): {:.2f}\n", a->task, r.lines, r.score);
    for (const auto& [range, s] : r.ranges)
      fmt::print("  {}: {}\n", range, std::isnan(s) ? std::string("-") : fmt::format("{:.2f}", s));
    if (!a->out.empty()) {
      std::ofstream(a->out) << j.dump(4) << "\n";
      fmt::print("scores in {}\n", a->out);
    }
  });
}

}  // namespace kvb::cli
