// Experiment specs (validation with locations, expansion), cell keys, results files (torn lines,
// resume) and reports.
#include <filesystem>
#include <fstream>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/report/report.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "tasks/task.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

std::string write_spec(const std::string& name, const std::string& text) {
  const auto path = std::filesystem::temp_directory_path() / name;
  std::ofstream(path) << text;
  return path.string();
}

// A spec over a model file that exists (the spec loader checks it): this test file itself.
const std::string kModelLine = "model: " + source_path("tests/test_experiment.cpp") + "\n";

}  // namespace

TEST_CASE("experiment specs: expansion of methods x grid x budgets", "[experiment]") {
  const auto path = write_spec("kvb_spec_ok.yaml", kModelLine + R"(
task: niah
task_options: {s_len: 1000, e_len: 2000, step: 1000, depths: 3}
methods:
  - fullkv
  - snapkv
  - {name: pyramidkv, params: {beta: 10}}
budgets: [64, 128]
grid:
  snapkv: {kernel: [5, 7], window: [16, 32]}
)");
  const ExperimentSpec s = load_experiment(path);
  // fullkv once; snapkv 2 x 2 grid x 2 budgets; pyramidkv x 2 budgets.
  REQUIRE(s.configs.size() == 1 + 8 + 2);
  CHECK(s.configs[0].name == "fullkv");
  CHECK(s.configs[0].budget == 0);
  CHECK(s.configs[1].params.at("kernel") == "5");
  CHECK(s.configs[10].params.at("beta") == "10");
  CHECK(s.name == "kvb_spec_ok");
  CHECK(s.out == "runs/kvb_spec_ok.jsonl");
  CHECK(s.task_options.at("depths") == "3");
}

TEST_CASE("experiment specs: errors name the file, line and column", "[experiment]") {
  require_error([&] { load_experiment(write_spec("kvb_e1.yaml", kModelLine + "task: niah\nmethods: [fullkv]\nbugdets: [1]\n")); },
                {"kvb_e1.yaml:4:1", "unknown key 'bugdets'", "budgets"});
  require_error([&] { load_experiment(write_spec("kvb_e2.yaml", kModelLine + "task: niah\nmethods: [snapkv]\nbudgets: [64, x]\n")); },
                {"kvb_e2.yaml:4:15", "positive integer"});
  require_error([&] { load_experiment(write_spec("kvb_e3.yaml", "model: /nope.gguf\ntask: niah\nmethods: [fullkv]\n")); },
                {"kvb_e3.yaml:1:8", "/nope.gguf not found"});
  require_error([&] { load_experiment(write_spec("kvb_e4.yaml", kModelLine + "task: niah\nmethods: [{name: snapkv, params: {window: 0}}]\nbudgets: [8]\n")); },
                {"kvb_e4.yaml:3:", "window"});
  require_error([&] { load_experiment(write_spec("kvb_e5.yaml", kModelLine + "task: nope\nmethods: [fullkv]\n")); },
                {"kvb_e5.yaml:2:7", "unknown task 'nope'"});
  require_error([&] { load_experiment(write_spec("kvb_e6.yaml", kModelLine + "task: niah\nmethods: [snapkv]\n")); },
                {"needs 'budgets'"});
  require_error([&] { load_experiment(write_spec("kvb_e7.yaml", "task: [unclosed\n")); }, {"kvb_e7.yaml:"});
}

TEST_CASE("cell keys are stable and change with any input", "[experiment]") {
  const nlohmann::json c = {{"task", "niah"}, {"method", "snapkv"}, {"budget", 64}, {"params", {{"window", "32"}}}};
  CHECK(cell_key(c, "L1000_d0") == cell_key(c, "L1000_d0"));
  CHECK(cell_key(c, "L1000_d0").size() == 16);
  CHECK(cell_key(c, "L1000_d0") != cell_key(c, "L1000_d50"));
  auto d = c;
  d["budget"] = 128;
  CHECK(cell_key(d, "L1000_d0") != cell_key(c, "L1000_d0"));
  d = c;
  d["params"]["window"] = "16";
  CHECK(cell_key(d, "L1000_d0") != cell_key(c, "L1000_d0"));
}

TEST_CASE("results files: appended records, a torn last line dropped on resume, reports", "[experiment]") {
  const auto dir = std::filesystem::temp_directory_path() / "kvb_results_test";
  std::filesystem::remove_all(dir);
  const std::string path = (dir / "r.jsonl").string();
  const nlohmann::json cfg = {{"task", "niah"}, {"options", {{"chat", "true"}}}, {"model", "m.gguf"},
                              {"method", "snapkv"}, {"budget", 64}, {"params", nlohmann::json::object()}, {"gqa", "native"}};
  {
    ResultsFile f(path);
    for (int d : {0, 50})
      f.append({{"key", "k" + std::to_string(d)}, {"config", cfg}, {"score", d == 0 ? 1.0 : 0.5},
                {"meta", {{"length", 1000}, {"depth", d}}}, {"kv_bytes", 25}, {"full_kv_bytes", 100}});
  }
  // A kill in the middle of a write leaves a torn line.
  std::ofstream(path, std::ios::app) << R"({"key": "k100", "config": {"ta)";
  {
    ResultsFile f(path);
    CHECK(f.recorded("key") == std::set<std::string>{"k0", "k50"});
    f.append({{"key", "k100"}, {"config", cfg}, {"score", 0.0}, {"meta", {{"length", 1000}, {"depth", 100}}},
              {"kv_bytes", 25}, {"full_kv_bytes", 100}});
  }
  int n = 0;
  for_each_record(path, [&](const nlohmann::json&, int) { ++n; });
  CHECK(n == 3);
  write_report({path}, (dir / "rep").string());
  std::ifstream md(dir / "rep" / "summary.md");
  std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  CHECK(text.find("| niah | chat=true | snapkv | 64 | native | - | 3 | 50.00 | 25.0% |") != std::string::npos);
  CHECK(std::filesystem::exists(dir / "rep" / "niah-snapkv-T64-chat.png"));
  // A damaged line that is not the last is an error naming the file and line.
  std::ofstream(path, std::ios::app) << "garbage\n{}\n";
  require_error([&] { for_each_record(path, [](const nlohmann::json&, int) {}); }, {"r.jsonl:4", "not a JSON record"});
}

TEST_CASE("a cell from the shared prefill equals the same cell run alone", "[experiment]") {
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  TaskContext ctx;
  ctx.tokenizer = tok.get();
  ctx.data_dir = fixture("longbench/data");
  ctx.options = {{"dataset", "qasper"}};
  auto task = TaskRegistry::get().create("longbench", ctx);
  const Sample s = task->sample(0);
  Engine engine(*m);
  std::vector<std::unique_ptr<Method>> methods;
  methods.push_back(nullptr);
  for (const char* name : {"snapkv", "h2o", "streamingllm", "pyramidkv"})
    methods.push_back(MethodRegistry::get().create(name, {}, m->config()));
  PrefillNeeds needs;
  for (const auto& meth : methods)
    if (meth) {
      needs.window = std::max(needs.window, meth->needs().window);
      needs.attn_colsum = needs.attn_colsum || meth->needs().attn_colsum;
      needs.k_pre_rope = needs.k_pre_rope || meth->needs().k_pre_rope;
    }
  const auto prompt = build_prompt(*m, *tok, s.prompt, s.chat);
  REQUIRE(prompt.size() > 200);
  const PrefillCapture cap = engine.prefill_capture(prompt, needs);
  for (const auto& meth : methods) {
    INFO((meth ? meth->name() : "fullkv"));
    const auto cfg = cell_config(*m, *path, "longbench", ctx.options, meth.get(), 64);
    auto shared = run_cell(*m, *tok, engine, *task, s, meth.get(), 64, cfg, &cap);
    auto alone = run_cell(*m, *tok, engine, *task, s, meth.get(), 64, cfg);
    CHECK(shared["prefill_shared"] == true);
    for (const char* k : {"key", "prediction", "score", "kv_bytes", "full_kv_bytes", "prompt_tokens"}) CHECK(shared[k] == alone[k]);
    if (meth) CHECK(shared["kv_bytes"].get<size_t>() < shared["full_kv_bytes"].get<size_t>());
  }
}
