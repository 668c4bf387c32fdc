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
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/report/heatmap.hpp"
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

// Calls fn(record) for each JSON line of a results file (a missing file has none); a malformed line
// is an error naming the file and line.
template <typename F>
void for_each_record(const std::string& path, F&& fn) {
  std::ifstream in(path);
  std::string line;
  int no = 0;
  while (std::getline(in, line)) {
    ++no;
    if (line.empty()) continue;
    json j;
    try {
      j = json::parse(line);
    } catch (const json::exception& e) {
      fail("{}:{}: not a JSON record ({}); remove the line or choose another file", path, no, e.what());
    }
    fn(j, no);
  }
}

// Ids of samples already in a results file for the same configuration.
std::set<std::string> finished(const std::string& path, const json& config) {
  std::set<std::string> done;
  for_each_record(path, [&](const json& j, int) {
    if (j.value("config", json()) == config) done.insert(j.at("id").get<std::string>());
  });
  return done;
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
      const std::string out = a->out.empty() ? fmt::format("runs/{}-{}.jsonl", a->task, label) : a->out;
      if (auto dir = std::filesystem::path(out).parent_path(); !dir.empty()) std::filesystem::create_directories(dir);
      const json config = {{"task", a->task}, {"options", parse_key_values(a->options)},
                           {"model", std::filesystem::path(a->model).filename().string()},
                           {"method", a->method.empty() ? "fullkv" : a->method}, {"budget", a->budget},
                           {"params", method ? json(method->params().values()) : json::object()},
                           {"gqa", method ? gqa_mode_name(method->gqa()) : "-"}};
      const auto done = finished(out, config);
      const size_t n = a->limit ? std::min(a->limit, task->size()) : task->size();
      std::ofstream sink(out, std::ios::app);
      if (!sink) fail("{}: cannot open for appending", out);
      Progress bar(fmt::format("{} {}", a->task, label), n, "samples");
      double total = 0;
      size_t scored = 0;
      for (size_t i = 0; i < n; ++i) {
        const Sample s = task->sample(i);
        if (done.count(s.id)) {
          bar.advance(1, "(done before)");
          continue;
        }
        const auto prompt = build_prompt(*m, *tok, s.prompt, s.chat);
        GenerateOptions opt;
        opt.max_new_tokens = s.max_new_tokens;
        opt.min_new_tokens = s.min_new_tokens;
        opt.stop = s.stop;
        std::unique_ptr<MethodRunner> runner;
        if (method) runner = std::make_unique<MethodRunner>(*method, a->budget);
        const Generation g = generate(engine, *tok, prompt, opt, runner.get());
        const double sc = task->score(s, g.text);
        total += sc;
        ++scored;
        const json rec = {{"id", s.id}, {"config", config}, {"meta", s.meta}, {"prediction", utf8_lossy(g.text)},
                          {"answers", s.answers}, {"score", sc}, {"prompt_tokens", g.prompt_tokens},
                          {"kv_bytes", runner ? runner->prefill_kv_bytes() : engine.full_kv_bytes(prompt.size())},
                          {"full_kv_bytes", engine.full_kv_bytes(prompt.size())}};
        sink << rec.dump() << '\n';
        sink.flush();
        bar.advance(1, fmt::format("score {:.2f}", sc));
      }
      bar.finish();
      // The summary covers every finished sample of this configuration, earlier runs included.
      double all = 0;
      size_t count = 0;
      for_each_record(out, [&](const json& j, int) {
        if (j.value("config", json()) != config) return;
        all += j.at("score").get<double>();
        ++count;
      });
      fmt::print("{} {}: {} samples, score {:.2f} (mean x 100); this run scored {} ({:.2f}); results in {}\n",
                 a->task, label, count, count ? 100 * all / double(count) : 0.0, scored,
                 scored ? 100 * total / double(scored) : 0.0, out);
    });
  }
  {
    auto* cmd = app.add_subcommand("report", "Tables and figures from results files (niah: heatmaps as PNG, SVG, CSV)");
    auto kind = std::make_shared<std::string>();
    auto files = std::make_shared<std::vector<std::string>>();
    auto dir = std::make_shared<std::string>("reports");
    cmd->add_option("kind", *kind, "niah")->required()->check(CLI::IsMember({"niah"}));
    cmd->add_option("results", *files, "Results JSONL files of kvbench run-task")->required();
    cmd->add_option("--out-dir", *dir, "Directory for the figures");
    cmd->callback([kind, files, dir] {
      // One heatmap per configuration found in the files.
      struct Grid {
        json config;
        std::map<std::pair<int, int>, std::pair<double, int>> cells;  // (depth, length) -> sum, count
      };
      std::map<std::string, Grid> grids;
      for (const auto& f : *files) {
        if (!std::filesystem::exists(f)) fail("{}: not found", f);
        for_each_record(f, [&](const json& j, int no) {
          if (!j.contains("config") || j["config"].value("task", "") != "niah") return;
          if (!j.contains("meta") || !j["meta"].contains("length") || !j["meta"].contains("depth") || !j.contains("score"))
            fail("{}:{}: a niah record needs meta.length, meta.depth and score", f, no);
          json cfg = j["config"];
          // A grid may be assembled from runs over different lengths or depths.
          for (const char* k : {"s_len", "e_len", "step", "depths"}) cfg["options"].erase(k);
          Grid& g = grids[cfg.dump()];
          g.config = cfg;
          auto& cell = g.cells[{j["meta"]["depth"].get<int>(), j["meta"]["length"].get<int>()}];
          cell.first += j["score"].get<double>();
          ++cell.second;
        });
      }
      if (grids.empty()) fail("no niah results in the given files");
      std::filesystem::create_directories(*dir);
      for (const auto& [key, g] : grids) {
        Heatmap h;
        std::set<int> depths, lengths;
        double total = 0;
        int n = 0;
        for (const auto& [dl, v] : g.cells) {
          depths.insert(dl.first);
          lengths.insert(dl.second);
          total += v.first;
          n += v.second;
        }
        h.depths.assign(depths.begin(), depths.end());
        h.lengths.assign(lengths.begin(), lengths.end());
        h.cells.assign(h.depths.size(), std::vector<double>(h.lengths.size(), std::nan("")));
        for (const auto& [dl, v] : g.cells) {
          const auto r = std::find(h.depths.begin(), h.depths.end(), dl.first) - h.depths.begin();
          const auto c = std::find(h.lengths.begin(), h.lengths.end(), dl.second) - h.lengths.begin();
          h.cells[size_t(r)][size_t(c)] = v.first / v.second;
        }
        const std::string method = g.config.value("method", "fullkv");
        const int budget = g.config.value("budget", 0);
        const std::string label = method == "fullkv" ? "FullKV" : fmt::format("{} (KV size {})", method, budget);
        h.title = "Pressure Testing " + g.config.value("model", std::string("model"));
        h.caption = fmt::format("{} Score: {:.2f}", label, 100.0 * total / n);
        const bool chat = g.config["options"].value("chat", "false") == "true";
        const std::string stem = fmt::format("{}/niah-{}{}{}", *dir, method,
                                             method == "fullkv" ? "" : fmt::format("-T{}", budget), chat ? "-chat" : "");
        write_heatmap(h, stem);
        fmt::print("{}: {} ({} results) -> {}.png/.svg/.csv\n", label, h.caption, n, stem);
      }
    });
  }
}

}  // namespace kvb::cli
