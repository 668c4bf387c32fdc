#pragma once
// The kvbench subcommands, one file each (harness/cli/NAME.cpp), and the options several share.
#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <string>
#include <vector>

#include "harness/engine/backend.hpp"
#include "harness/engine/engine.hpp"
#include "harness/task/task.hpp"

namespace kvb {
class Tokenizer;
}

namespace kvb::cli {

// Each adds its subcommand to the app; main.cpp calls them in the order `kvbench --help` lists them.
void register_info_command(CLI::App& app);
void register_tokenize_command(CLI::App& app);
void register_detokenize_command(CLI::App& app);
void register_make_model_command(CLI::App& app);
void register_generate_command(CLI::App& app);
void register_logits_command(CLI::App& app);
void register_grad_command(CLI::App& app);
void register_bench_command(CLI::App& app);
void register_list_command(CLI::App& app);
void register_dump_prefill_command(CLI::App& app);
void register_sample_command(CLI::App& app);
void register_run_task_command(CLI::App& app);
void register_score_command(CLI::App& app);
void register_report_command(CLI::App& app);
void register_run_command(CLI::App& app);
void register_calibrate_command(CLI::App& app);
void register_new_command(CLI::App& app);
void register_submit_command(CLI::App& app);
void register_status_command(CLI::App& app);

// The task arguments of dump-prefill, sample and run-task: the task, the model whose tokenizer sizes
// it, its options and the benchmark data directory.
struct TaskArgs {
  std::string task, model, data = default_data_dir();
  std::vector<std::string> options;
};
void add_task_args(CLI::App* cmd, TaskArgs& a);
std::unique_ptr<Task> make_task(const TaskArgs& a, const Tokenizer& tok);

// The options of a command that builds an engine: --backend, --threads, --kv-dtype (what the KV
// cache stores its numbers as) and --weights (how weight matrices are stored; not given: the
// backend's own format).
struct EngineArgs {
  std::string backend = "cpu", kv_dtype = "fp32", weights;
  int threads = 0;
};
void add_engine_options(CLI::App* cmd, EngineArgs& a);
EngineOptions engine_options(const EngineArgs& a);

// Checks of numeric options that say what was expected (CLI11's PositiveNumber prints its range as
// "0.000000 to 1.797...e+308").
extern const CLI::Validator kPositive, kNonNegative;

// "key=value" items of a repeatable option (`flag`, named in errors); Error naming a malformed item or
// a key given twice.
std::map<std::string, std::string> parse_key_values(const std::vector<std::string>& items,
                                                    const std::string& flag = "--param");

}  // namespace kvb::cli
