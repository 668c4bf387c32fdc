#pragma once
// The kvbench subcommands, one file each (harness/cli/NAME.cpp), and the options several share.
#include <CLI/CLI.hpp>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "harness/engine/backend.hpp"
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

// --kv-dtype on a command that builds an engine: what the KV cache stores its numbers as.
inline void add_kv_dtype_option(CLI::App* cmd, std::string& into) {
  cmd->add_option("--kv-dtype", into, "KV cache storage: fp32 (default), bf16 or fp16 (the papers' full cache)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
}

// --weights on a command that builds an engine: how weight matrices are stored. Empty (the option
// not given): the backend's own format.
inline void add_weights_option(CLI::App* cmd, std::string& into) {
  cmd->add_option("--weights", into,
                  "Weight storage: fp32 (the CPU default; matches Hugging Face), bf16 (half the bytes per "
                  "decode step; the CUDA backend's only format) or gguf (CPU: the file's Q4_0/Q4_1/Q5_0/Q5_1/"
                  "Q8_0/Q4_K/Q6_K blocks as they are, other matrices bf16)")
      ->check(CLI::IsMember({"fp32", "bf16", "gguf"}));
}
inline std::optional<WeightFormat> weights_option(const std::string& s) {
  if (s.empty()) return std::nullopt;
  return parse_weight_format(s, "--weights");
}

// "key=value" items of --param options; Error naming a malformed one.
std::map<std::string, std::string> parse_key_values(const std::vector<std::string>& items);

}  // namespace kvb::cli
