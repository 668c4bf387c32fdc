#include "harness/cli/commands.hpp"

#include "harness/util/error.hpp"

namespace kvb::cli {

std::map<std::string, std::string> parse_key_values(const std::vector<std::string>& items, const std::string& flag) {
  std::map<std::string, std::string> out;
  for (const auto& kv : items) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) fail("{} '{}': expected key=value", flag, kv);
    if (const auto [it, fresh] = out.emplace(kv.substr(0, eq), kv.substr(eq + 1)); !fresh)
      fail("{} {}: '{}' is given twice", flag, kv, it->first);
  }
  return out;
}

std::unique_ptr<Task> make_task(const TaskArgs& a, const Tokenizer& tok) {
  TaskContext ctx;
  ctx.tokenizer = &tok;
  ctx.options = parse_key_values(a.options, "--option");
  ctx.data_dir = a.data;
  return TaskRegistry::get().create(a.task, ctx);
}

namespace {

CLI::Validator sign_check(bool zero_allowed) {
  return CLI::Validator(
      [zero_allowed](std::string& text) -> std::string {
        double v = 0;
        size_t used = 0;
        try {
          v = std::stod(text, &used);
        } catch (const std::exception&) {
          used = 0;
        }
        if (used == 0 || used != text.size()) return fmt::format("expected a number, found '{}'", text);
        if (zero_allowed ? v >= 0 : v > 0) return "";
        return fmt::format("expected a number {} 0, found {}", zero_allowed ? ">=" : ">", text);
      },
      zero_allowed ? "NUMBER >= 0" : "NUMBER > 0");
}

}  // namespace

const CLI::Validator kPositive = sign_check(false), kNonNegative = sign_check(true);

void add_task_args(CLI::App* cmd, TaskArgs& a) {
  cmd->add_option("task", a.task, "Task name (kvbench list tasks)")->required();
  cmd->add_option("--model,-m", a.model, "GGUF file or Hugging Face model directory (its tokenizer sizes the task)")
      ->required();
  cmd->add_option("--option,-o", a.options, "Task option key=value (repeatable)");
  cmd->add_option("--data", a.data, "Benchmark data directory (default: $KVBENCH_DATA or <source>/data)");
}

void add_engine_options(CLI::App* cmd, EngineArgs& a) {
  cmd->add_option("--backend", a.backend, "cpu or cuda");
  cmd->add_option("--threads", a.threads, "Threads (0 = all cores)")->check(kNonNegative);
  cmd->add_option("--kv-dtype", a.kv_dtype, "KV cache storage: fp32 (default), bf16 or fp16 (the papers' full cache)")
      ->check(CLI::IsMember({"fp32", "bf16", "fp16"}));
  cmd->add_option("--weights", a.weights,
                  "Weight storage: fp32 (the CPU default; matches Hugging Face), bf16 (half the bytes per "
                  "decode step; the CUDA backend's only format) or gguf (CPU: the file's Q4_0/Q4_1/Q5_0/Q5_1/"
                  "Q8_0/Q4_K/Q6_K blocks, not dequantized; other matrices bf16)")
      ->check(CLI::IsMember({"fp32", "bf16", "gguf"}));
}

EngineOptions engine_options(const EngineArgs& a) {
  return {.backend = a.backend,
          .threads = a.threads,
          .kv_dtype = parse_kv_dtype(a.kv_dtype, "--kv-dtype"),
          .weights = a.weights.empty() ? std::nullopt : std::optional(parse_weight_format(a.weights, "--weights"))};
}

}  // namespace kvb::cli
