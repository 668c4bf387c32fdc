// kvbench run-task: a task through the model, optionally compressed, each prediction scored and appended
// to a JSONL file one sample at a time, so an interrupted run loses nothing and resumes where it stopped.
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "harness/cli/commands.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/method/prefill_dump.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/longbench_metrics.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"

namespace kvb::cli {

using nlohmann::json;

void register_run_task_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run-task", "Run a task through the model and score it (resumable)");
  struct Args : TaskArgs, EngineArgs {
    std::string method, out;
    int budget = 0;
    double ratio = 0;
    size_t limit = 0;
    std::vector<std::string> params;
  };
  auto a = std::make_shared<Args>();
  add_task_args(cmd, *a);
  cmd->add_option("--method", a->method, "KV-cache compression method (default: full cache)");
  auto* budget_opt =
      cmd->add_option("--budget", a->budget, "KV size T for --method")->check(kPositive)->default_str("none");
  auto* ratio_opt =
      cmd->add_option("--ratio", a->ratio,
                      "Compression ratio for --method instead of --budget: the fraction of each prompt removed, "
                      "T = floor(S (1 - ratio))")
          ->excludes(budget_opt)
          ->default_str("none");
  cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
  cmd->add_option("--limit", a->limit, "Run only the first N samples (0: all)")->check(kNonNegative);
  cmd->add_option("--out", a->out, "Results JSONL (appended; default runs/<task>-<method>[-T<budget>].jsonl)");
  add_engine_options(cmd, *a);
  cmd->callback([a, ratio_opt] {
    auto m = ModelFile::open(a->model);
    auto tok = load_tokenizer(*m);
    auto task = make_task(*a, *tok);
    const EngineOptions eo = engine_options(*a);
    Engine engine(*m, eo);
    std::unique_ptr<Method> method;
    KvBudget budget = a->budget;
    const bool ratio_given = ratio_opt->count() > 0;
    if (!a->method.empty()) {
      if (ratio_given) budget = KvBudget::compression_ratio(a->ratio);  // an error outside (0, 1)
      method = MethodRegistry::get().create(a->method, parse_key_values(a->params), engine.config());
      if (method->budgeted() && a->budget <= 0 && !ratio_given) fail("--method needs --budget T or --ratio P");
      if (!method->budgeted() && (a->budget > 0 || ratio_given))
        fail("method {} takes no --budget or --ratio: it sets its own memory", a->method);
    } else if (a->budget > 0 || ratio_given || !a->params.empty()) {
      fail("--budget, --ratio and --param need --method");
    }
    const std::string label = a->method.empty()     ? "fullkv"
                              : !method->budgeted() ? a->method
                              : budget.is_ratio()   ? fmt::format("{}-r{}", a->method, budget.ratio)
                                                    : fmt::format("{}-T{}", a->method, a->budget);
    ResultsFile out(a->out.empty() ? fmt::format("runs/{}-{}.jsonl", a->task, label) : a->out);
    const json config = cell_config(
        *m, a->model, a->task, TaskRegistry::get().canonical_options(a->task, parse_key_values(a->options, "--option")),
        method.get(), budget, eo.kv_dtype, eo.weights);
    const auto done = recorded_cells(out.path());
    const size_t n = a->limit ? std::min(a->limit, task->size()) : task->size();
    Progress bar(fmt::format("{} {}", a->task, label), n, "samples");
    double sum = 0;  // of this run's scores: the bar shows their mean, not the last one alone
    int scored = 0;
    for (size_t i = 0; i < n; ++i) {
      const Sample s = task->sample(i);
      const std::string digest = prompt_digest(sample_prompt(*m, *tok, s));
      if (recorded_with_prompt(done, cell_key(config, s.id), s.id, digest, out.path(), a->data)) {
        bar.advance(1, "(done before)");
        continue;
      }
      json rec = run_cell(*m, *tok, engine, *task, s, method.get(), budget, config);
      rec["prompt_digest"] = digest;
      out.append(rec);
      sum += rec["score"].get<double>();
      ++scored;
      bar.advance(1, fmt::format("mean score {:.2f} of the {} run now (last {:.2f})", sum / scored, scored,
                                 rec["score"].get<double>()));
    }
    bar.finish();
    fmt::print("results in {}; summarise with: kvbench report {}\n", out.path(), out.path());
  });
}

}  // namespace kvb::cli
