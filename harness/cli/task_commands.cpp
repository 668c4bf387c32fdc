// kvbench sample / run-task: inspect a benchmark's generated samples, and run a task through the
// model (optionally with a compression method), scoring each prediction. Results are appended to a
// JSONL file one sample at a time, so an interrupted run loses nothing and resumes where it stopped.
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/cli/commands.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/report/report.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"
#include "tasks/task.hpp"

namespace kvb::cli {
namespace {

using nlohmann::json;

struct TaskArgs {
  std::string task, model, data = default_data_dir();
  std::vector<std::string> options;
};

void add_task_args(CLI::App* cmd, TaskArgs& a) {
  cmd->add_option("task", a.task, "Task name (kvbench list tasks)")->required();
  cmd->add_option("--model,-m", a.model, "GGUF file or Hugging Face model directory (its tokenizer sizes the task)")
      ->required();
  cmd->add_option("--option,-o", a.options, "Task option key=value (repeatable)");
  cmd->add_option("--data", a.data, "Benchmark data directory (default: $KVBENCH_DATA or <source>/data)");
}

std::unique_ptr<Task> make_task(const TaskArgs& a, const Tokenizer& tok) {
  TaskContext ctx;
  ctx.tokenizer = &tok;
  ctx.options = parse_key_values(a.options);
  ctx.data_dir = a.data;
  return TaskRegistry::get().create(a.task, ctx);
}

}  // namespace

void register_task_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("sample", "Print one generated sample of a task: prompt, answers, metadata");
    auto a = std::make_shared<TaskArgs>();
    auto index = std::make_shared<size_t>(0);
    add_task_args(cmd, *a);
    cmd->add_option("--index,-i", *index, "Sample index");
    cmd->callback([a, index] {
      auto m = ModelFile::open(a->model);
      auto tok = load_tokenizer(*m);
      auto task = make_task(*a, *tok);
      if (*index >= task->size()) fail("--index {}: task {} has {} samples", *index, a->task, task->size());
      const Sample s = task->sample(*index);
      fmt::print("{}\n", json({{"id", s.id}, {"answers", s.answers}, {"max_new_tokens", s.max_new_tokens},
                               {"stop", s.stop}, {"chat", s.chat}, {"meta", s.meta},
                               {"prompt_tokens", build_prompt(*m, *tok, s.prompt, s.chat).size()}})
                             .dump(2));
      fmt::print("--- prompt ---\n{}\n", s.prompt);
    });
  }
  {
    auto* cmd = app.add_subcommand("run-task", "Run a task through the model and score it (resumable)");
    struct Args : TaskArgs {
      std::string backend = "cpu", method, out;
      int budget = 0, threads = 0;
      size_t limit = 0;
      std::vector<std::string> params;
    };
    auto a = std::make_shared<Args>();
    add_task_args(cmd, *a);
    cmd->add_option("--backend", a->backend, "cpu or cuda");
    cmd->add_option("--threads", a->threads, "Threads (0 = all cores)");
    cmd->add_option("--method", a->method, "KV-cache compression method (default: full cache)");
    cmd->add_option("--budget", a->budget, "KV size T for --method")->check(CLI::PositiveNumber);
    cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
    cmd->add_option("--limit", a->limit, "Run only the first N samples (0: all)");
    cmd->add_option("--out", a->out, "Results JSONL (appended; default runs/<task>-<method>[-T<budget>].jsonl)");
    cmd->callback([a] {
      auto m = ModelFile::open(a->model);
      auto tok = load_tokenizer(*m);
      auto task = make_task(*a, *tok);
      Engine engine(*m, {a->backend, a->threads});
      std::unique_ptr<Method> method;
      if (!a->method.empty()) {
        if (a->budget <= 0) fail("--method needs --budget T");
        method = MethodRegistry::get().create(a->method, parse_key_values(a->params), engine.config());
      } else if (a->budget > 0 || !a->params.empty()) {
        fail("--budget and --param need --method");
      }
      const std::string label = a->method.empty() ? "fullkv" : fmt::format("{}-T{}", a->method, a->budget);
      ResultsFile out(a->out.empty() ? fmt::format("runs/{}-{}.jsonl", a->task, label) : a->out);
      const json config = cell_config(*m, a->model, a->task, parse_key_values(a->options), method.get(), a->budget);
      const auto done = out.recorded("key");
      const size_t n = a->limit ? std::min(a->limit, task->size()) : task->size();
      Progress bar(fmt::format("{} {}", a->task, label), n, "samples");
      for (size_t i = 0; i < n; ++i) {
        const Sample s = task->sample(i);
        if (done.count(cell_key(config, s.id))) {
          bar.advance(1, "(done before)");
          continue;
        }
        const json rec = run_cell(*m, *tok, engine, *task, s, method.get(), a->budget, config);
        out.append(rec);
        bar.advance(1, fmt::format("score {:.2f}", rec["score"].get<double>()));
      }
      bar.finish();
      fmt::print("results in {}; summarise with: kvbench report {}\n", out.path(), out.path());
    });
  }
  {
    auto* cmd = app.add_subcommand("report",
                                   "Tables (paper layouts; Markdown, CSV, LaTeX) and heatmaps (PNG, SVG) from results");
    auto files = std::make_shared<std::vector<std::string>>();
    auto dir = std::make_shared<std::string>("reports");
    auto formats = std::make_shared<std::vector<std::string>>(std::vector<std::string>{"md", "csv"});
    cmd->add_option("results", *files, "Results JSONL files or directories of them (kvbench run or run-task)")->required();
    cmd->add_option("--out-dir", *dir, "Directory for tables and figures");
    cmd->add_option("--format", *formats, "Table formats: md, csv, tex (comma-separated)")->delimiter(',');
    cmd->callback([files, dir, formats] { write_report(*files, *dir, {formats->begin(), formats->end()}); });
  }
}

}  // namespace kvb::cli
