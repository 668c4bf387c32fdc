#include "harness/cli/commands.hpp"

#include "harness/util/error.hpp"

namespace kvb::cli {

std::map<std::string, std::string> parse_key_values(const std::vector<std::string>& items) {
  std::map<std::string, std::string> out;
  for (const auto& kv : items) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) fail("--param '{}': expected key=value", kv);
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

std::unique_ptr<Task> make_task(const TaskArgs& a, const Tokenizer& tok) {
  TaskContext ctx;
  ctx.tokenizer = &tok;
  ctx.options = parse_key_values(a.options);
  ctx.data_dir = a.data;
  return TaskRegistry::get().create(a.task, ctx);
}

void add_task_args(CLI::App* cmd, TaskArgs& a) {
  cmd->add_option("task", a.task, "Task name (kvbench list tasks)")->required();
  cmd->add_option("--model,-m", a.model, "GGUF file or Hugging Face model directory (its tokenizer sizes the task)")
      ->required();
  cmd->add_option("--option,-o", a.options, "Task option key=value (repeatable)");
  cmd->add_option("--data", a.data, "Benchmark data directory (default: $KVBENCH_DATA or <source>/data)");
}

}  // namespace kvb::cli
