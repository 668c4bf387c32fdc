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
#include "harness/method/prefill_dump.hpp"
#include "harness/model/model_file.hpp"
#include "harness/report/paired.hpp"
#include "harness/report/published.hpp"
#include "harness/report/report.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/npy.hpp"
#include "harness/util/progress.hpp"
#include "tasks/longbench/jieba.hpp"
#include "tasks/longbench/metrics.hpp"
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
    auto* cmd = app.add_subcommand("dump-prefill",
                                   "Write one sample's per-layer K, V and window queries (.npy), and with a method "
                                   "the width each head keeps each token at, for reference scripts");
    struct Args : TaskArgs {
      std::string out, method;
      std::vector<int> layers;
      std::vector<std::string> params;
      size_t index = 0;
      int window = 8, budget = 0;
    };
    auto a = std::make_shared<Args>();
    add_task_args(cmd, *a);
    cmd->add_option("--index,-i", a->index, "Sample index");
    cmd->add_option("--layers", a->layers, "Layers to write (default: all)")->delimiter(',');
    cmd->add_option("--window", a->window, "Window queries to write")->check(CLI::PositiveNumber);
    cmd->add_option("--method", a->method, "Compression method whose kept widths to write");
    cmd->add_option("--budget", a->budget, "KV size T for a budgeted --method")->check(CLI::PositiveNumber);
    cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
    cmd->add_option("--out", a->out, "Output directory")->required();
    cmd->callback([a] {
      auto m = ModelFile::open(a->model);
      auto tok = load_tokenizer(*m);
      auto task = make_task(*a, *tok);
      if (a->index >= task->size()) fail("--index {}: task {} has {} samples", a->index, a->task, task->size());
      const Sample s = task->sample(a->index);
      const auto ids = build_prompt(*m, *tok, s.prompt, s.chat);
      Engine engine(*m);
      auto [method, runner] = choose_method(a->method, parse_key_values(a->params), a->budget, engine.config(), "--method");
      std::set<int> layers(a->layers.begin(), a->layers.end());
      if (layers.empty())
        for (int l = 0; l < m->config().n_layers; ++l) layers.insert(l);
      std::filesystem::create_directories(a->out);
      PrefillDumper dumper(a->out, layers, a->window, runner.get());
      engine.prefill(ids, &dumper);
      const auto& c = m->config();
      json meta = {{"model", std::filesystem::path(a->model).filename().string()}, {"fingerprint", c.fingerprint},
                   {"task", a->task}, {"options", parse_key_values(a->options)}, {"index", a->index},
                   {"sample", s.id}, {"n_tokens", ids.size()}, {"n_heads", c.n_heads}, {"n_kv_heads", c.n_kv_heads},
                   {"head_dim", c.head_dim}, {"window", a->window}, {"layers", layers}, {"prompt_ids", ids}};
      if (method)
        meta["method"] = {{"name", method->name()}, {"budget", method->budgeted() ? json(a->budget) : json(nullptr)},
                          {"params", method->params().values()}, {"cache", runner->cache_profile()}};
      std::ofstream(a->out + "/meta.json") << meta.dump(1) << "\n";
      fmt::print("{}: {} tokens, {} layers written\n", a->out, ids.size(), layers.size());
    });
  }
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
      std::string backend = "cpu", method, out, kv_dtype = "fp32", weights;
      int budget = 0, threads = 0;
      double ratio = 0;
      size_t limit = 0;
      std::vector<std::string> params;
    };
    auto a = std::make_shared<Args>();
    add_task_args(cmd, *a);
    cmd->add_option("--backend", a->backend, "cpu or cuda");
    cmd->add_option("--threads", a->threads, "Threads (0 = all cores)");
    cmd->add_option("--method", a->method, "KV-cache compression method (default: full cache)");
    auto* budget_opt = cmd->add_option("--budget", a->budget, "KV size T for --method")->check(CLI::PositiveNumber);
    cmd->add_option("--ratio", a->ratio,
                    "Compression ratio for --method instead of --budget: the fraction of each prompt removed, "
                    "T = floor(S (1 - ratio))")
        ->excludes(budget_opt);
    cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
    cmd->add_option("--limit", a->limit, "Run only the first N samples (0: all)");
    cmd->add_option("--out", a->out, "Results JSONL (appended; default runs/<task>-<method>[-T<budget>].jsonl)");
    add_kv_dtype_option(cmd, a->kv_dtype);
    add_weights_option(cmd, a->weights);
    cmd->callback([a] {
      auto m = ModelFile::open(a->model);
      auto tok = load_tokenizer(*m);
      auto task = make_task(*a, *tok);
      const KvDtype kv_dtype = parse_kv_dtype(a->kv_dtype, "--kv-dtype");
      const auto weights = weights_option(a->weights);
      Engine engine(*m, {.backend = a->backend, .threads = a->threads, .kv_dtype = kv_dtype, .weights = weights});
      std::unique_ptr<Method> method;
      KvBudget budget = a->budget;
      if (!a->method.empty()) {
        if (a->ratio != 0) budget = KvBudget::compression_ratio(a->ratio);
        method = MethodRegistry::get().create(a->method, parse_key_values(a->params), engine.config());
        if (method->budgeted() && a->budget <= 0 && a->ratio == 0) fail("--method needs --budget T or --ratio P");
        if (!method->budgeted() && (a->budget > 0 || a->ratio != 0))
          fail("method {} takes no --budget or --ratio: it sets its own memory", a->method);
      } else if (a->budget > 0 || a->ratio != 0 || !a->params.empty()) {
        fail("--budget, --ratio and --param need --method");
      }
      const std::string label = a->method.empty() ? "fullkv"
                                : !method->budgeted() ? a->method
                                : budget.is_ratio() ? fmt::format("{}-r{}", a->method, budget.ratio)
                                                    : fmt::format("{}-T{}", a->method, a->budget);
      ResultsFile out(a->out.empty() ? fmt::format("runs/{}-{}.jsonl", a->task, label) : a->out);
      const json config =
          cell_config(*m, a->model, a->task, TaskRegistry::get().canonical_options(a->task, parse_key_values(a->options)),
                      method.get(), budget, kv_dtype, weights);
      const auto done = recorded_keys(out.path());
      const size_t n = a->limit ? std::min(a->limit, task->size()) : task->size();
      Progress bar(fmt::format("{} {}", a->task, label), n, "samples");
      for (size_t i = 0; i < n; ++i) {
        const Sample s = task->sample(i);
        if (done.count(cell_key(config, s.id))) {
          bar.advance(1, "(done before)");
          continue;
        }
        const json rec = run_cell(*m, *tok, engine, *task, s, method.get(), budget, config);
        out.append(rec);
        bar.advance(1, fmt::format("score {:.2f}", rec["score"].get<double>()));
      }
      bar.finish();
      fmt::print("results in {}; summarise with: kvbench report {}\n", out.path(), out.path());
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "score", "Score predictions made anywhere with a benchmark's own metric (LongBench's eval.py)");
    struct Args {
      std::string task, predictions, out, data = default_data_dir();
      bool by_length = false;
    };
    auto a = std::make_shared<Args>();
    cmd->add_option("--task", a->task, "longbench/DATASET")->required();
    cmd->add_option("predictions", a->predictions,
                    "JSONL in LongBench's pred/ layout: pred, answers, all_classes, length per line")
        ->required();
    cmd->add_flag("--longbench-e", a->by_length, "Also score by length range (0-4k, 4-8k, 8k+) as LongBench-E");
    cmd->add_option("--data", a->data, "Data folder with jieba's tables (the Chinese datasets)");
    cmd->add_option("--out", a->out, "Write the scores as JSON, as eval.py's result.json");
    cmd->callback([a] {
      const std::string prefix = "longbench/";
      if (a->task.rfind(prefix, 0) != 0 || a->task.size() == prefix.size())
        fail("--task {}: score reads LongBench predictions; name the dataset as longbench/DATASET", a->task);
      const std::string dataset = a->task.substr(prefix.size());
      const std::string metric = longbench::metric_of(dataset);
      const longbench::Jieba* jieba =
          metric == "qa_f1_zh" || metric == "rouge_zh" ? &longbench::Jieba::load(a->data) : nullptr;
      const auto r = longbench::score_predictions(dataset, a->predictions, a->by_length, jieba);
      nlohmann::json j;
      if (a->by_length) {
        for (const auto& [range, s] : r.ranges) j[dataset][range] = std::isnan(s) ? nlohmann::json() : nlohmann::json(s);
      } else {
        j[dataset] = r.score;
      }
      fmt::print("{} ({}, {} predictions): {:.2f}\n", dataset, metric, r.lines, r.score);
      for (const auto& [range, s] : r.ranges)
        fmt::print("  {}: {}\n", range, std::isnan(s) ? std::string("-") : fmt::format("{:.2f}", s));
      if (!a->out.empty()) {
        std::ofstream(a->out) << j.dump(4) << "\n";
        fmt::print("scores in {}\n", a->out);
      }
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
    struct Compare {
      std::string published, table, model, baseline;
    };
    auto c = std::make_shared<Compare>();
    cmd->add_option("--compare", c->published,
                    "A published.csv (experiments/papers/<paper>/): also writes ours beside the paper's numbers, per "
                    "table (compare-<table>.*)");
    cmd->add_option("--table", c->table, "With --compare: only this table (a spec's file name, e.g. table1_longbench)");
    cmd->add_option("--published-model", c->model,
                    "With --compare: the paper's model whose numbers to show (default: the first the table lists)");
    cmd->add_option("--baseline", c->baseline,
                    "METHOD[:key=value,...]: also writes each method's score minus this one's on the same samples, "
                    "with paired 95% intervals (<task>-vs-<baseline>.*)");
    cmd->callback([files, dir, formats, c] {
      const std::set<std::string> f(formats->begin(), formats->end());
      write_report(*files, *dir, f);
      if (!c->baseline.empty()) write_paired_comparison(*files, c->baseline, *dir, f);
      if (!c->published.empty()) write_comparison(*files, c->published, c->table, c->model, *dir, f);
    });
  }
}

}  // namespace kvb::cli
