// Experiment specs (validation with locations, expansion), cell keys, results files (torn lines,
// resume) and reports.
#include <signal.h>
#include <spawn.h>
#include <sys/wait.h>
#include <unistd.h>
#include <zlib.h>

#include <chrono>
#include <filesystem>
#include <fstream>
#include <map>
#include <set>
#include <thread>

#include <fmt/format.h>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/shared_prefills.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/method/method.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/report/report.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

std::string write_spec(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto path = dir / name;
  std::ofstream(path) << text;
  return path.string();
}

// A spec over a model file that exists (the spec loader checks it): this test file itself.
const std::string kModelLine = "model: " + source_path("tests/test_experiment.cpp") + "\n";

}  // namespace

TEST_CASE("experiment specs: expansion of methods x grid x budgets", "[experiment]") {
  const TempDir dir("specs");
  const auto path = write_spec(dir, "kvb_spec_ok.yaml", kModelLine + R"(
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
  REQUIRE(s.task_variants.size() == 1);
  CHECK(s.task_variants[0].at("depths") == "3");

  // List-valued task options are a grid of task variants.
  const ExperimentSpec r = load_experiment(write_spec(dir, "kvb_spec_tasks.yaml", kModelLine + R"(
task: ruler
task_options: {task: [niah_single_1, niah_multikey_2], length: [4096, 8192], samples: 5}
methods: [fullkv]
)"));
  REQUIRE(r.task_variants.size() == 4);
  CHECK(r.task_variants[3] ==
        std::map<std::string, std::string>{{"task", "niah_multikey_2"}, {"length", "8192"}, {"samples", "5"}});
  require_error(
      [&] {
        load_experiment(
            write_spec(dir, "kvb_e5.yaml", kModelLine + "task: niah\ntask_options: {depths: []}\nmethods: [fullkv]\n"));
      },
      {"kvb_e5.yaml:", "task_options.depths", "no values"});
}

TEST_CASE("experiment specs: compression ratios expand beside KV sizes and key their cells", "[experiment]") {
  const TempDir dir("specs");
  const ExperimentSpec s = load_experiment(write_spec(dir, "kvb_spec_ratio.yaml", kModelLine + R"(
task: niah
methods: [fullkv, snapkv]
budgets: [64]
ratios: [0.5, 0.9]
)"));
  REQUIRE(s.configs.size() == 1 + 3);
  CHECK(s.configs[1].budget == KvBudget(64));
  CHECK(s.configs[2].budget == KvBudget::compression_ratio(0.5));
  CHECK(s.configs[3].budget.is_ratio());
  CHECK(s.configs[3].budget.name() == "p_c=0.9");
  // T = floor(S (1 - p_c)) in doubles, as kvpress's int(q_len * (1 - compression_ratio)): 1 - 0.9 is
  // 0.09999999999999998, so 1000 tokens keep 99. Never below one token.
  CHECK(KvBudget::compression_ratio(0.9).tokens_for(1000) == 99);
  CHECK(KvBudget::compression_ratio(0.5).tokens_for(1001) == 500);
  CHECK(KvBudget::compression_ratio(0.75).tokens_for(4095) == 1023);
  CHECK(KvBudget::compression_ratio(0.99).tokens_for(50) == 1);
  require_error(
      [&] {
        load_experiment(write_spec(dir, "kvb_r1.yaml", kModelLine + "task: niah\nmethods: [snapkv]\nratios: [1.5]\n"));
      },
      {"kvb_r1.yaml:4:", "compression ratio", "(0, 1)"});
  require_error(
      [&] {
        load_experiment(write_spec(dir, "kvb_r2.yaml", kModelLine + "task: niah\nmethods: [snapkv]\nratios: [x]\n"));
      },
      {"kvb_r2.yaml:4:", "compression ratio"});
  require_error([] { (void)KvBudget::compression_ratio(0); }, {"compression ratio 0", "(0, 1)"});
}

TEST_CASE("experiment specs: errors name the file, line and column", "[experiment]") {
  const TempDir dir("specs");
  require_error(
      [&] {
        load_experiment(write_spec(dir, "kvb_e1.yaml", kModelLine + "task: niah\nmethods: [fullkv]\nbugdets: [1]\n"));
      },
      {"kvb_e1.yaml:4:1", "unknown key 'bugdets'", "budgets"});
  // A key given twice ran one of the values silently (the first at the top level, the last below).
  require_error(
      [&] {
        load_experiment(write_spec(dir, "kvb_dup1.yaml",
                                   kModelLine + "task: niah\nmethods: [snapkv]\nbudgets: [32]\nbudgets: [64]\n"));
      },
      {"kvb_dup1.yaml:5:1", "key 'budgets' is given twice in this mapping (first on line 4)"});
  require_error(
      [&] {
        load_experiment(
            write_spec(dir, "kvb_dup2.yaml",
                       kModelLine + "task: niah\ntask_options: {chat: true, chat: false}\nmethods: [fullkv]\n"));
      },
      {"kvb_dup2.yaml:3:", "key 'chat' is given twice"});
  require_error(
      [&] {
        load_experiment(
            write_spec(dir, "kvb_dup3.yaml",
                       kModelLine + "task: niah\nmethods:\n  - snapkv:\n      window: 8\n      window: 16\n"));
      },
      {"kvb_dup3.yaml:6:7", "key 'window' is given twice"});
  require_error(
      [&] {
        load_experiment(
            write_spec(dir, "kvb_e2.yaml", kModelLine + "task: niah\nmethods: [snapkv]\nbudgets: [64, x]\n"));
      },
      {"kvb_e2.yaml:4:15", "positive integer"});
  require_error(
      [&] { load_experiment(write_spec(dir, "kvb_e3.yaml", "model: /nope.gguf\ntask: niah\nmethods: [fullkv]\n")); },
      {"kvb_e3.yaml:1:8", "/nope.gguf not found"});
  require_error(
      [&] {
        load_experiment(
            write_spec(dir, "kvb_e4.yaml",
                       kModelLine + "task: niah\nmethods: [{name: snapkv, params: {window: 0}}]\nbudgets: [8]\n"));
      },
      {"kvb_e4.yaml:3:", "window"});
  require_error(
      [&] { load_experiment(write_spec(dir, "kvb_e5.yaml", kModelLine + "task: nope\nmethods: [fullkv]\n")); },
      {"kvb_e5.yaml:2:7", "unknown task 'nope'"});
  require_error(
      [&] { load_experiment(write_spec(dir, "kvb_e6.yaml", kModelLine + "task: niah\nmethods: [snapkv]\n")); },
      {"needs 'budgets' or 'ratios'"});
  require_error([&] { load_experiment(write_spec(dir, "kvb_e7.yaml", "task: [unclosed\n")); }, {"kvb_e7.yaml:"});
  require_error(
      [&] {
        load_experiment(write_spec(
            dir, "kvb_e8.yaml",
            kModelLine + "task: niah\nmethods: [snapkv]\nbudgets: [64]\ngrid:\n  snapk: {window: [8, 16]}\n"));
      },
      {"kvb_e8.yaml:6:3", "grid for method 'snapk'"});
  require_error(
      [&] {
        load_experiment(write_spec(dir, "kvb_e9.yaml",
                                   kModelLine + "task: niah\ntask_options: {chatt: true}\nmethods: [fullkv]\n"));
      },
      {"kvb_e9.yaml:3:", "unknown parameter 'chatt'", "chat"});
  require_error(
      [&] {
        load_experiment(write_spec(dir, "kvb_e10.yaml",
                                   kModelLine + "task: niah\ntask_options: {depths: [5, x]}\nmethods: [fullkv]\n"));
      },
      {"kvb_e10.yaml:3:", "'depths' = 'x' is invalid"});
  require_error(
      [&] {
        load_experiment(write_spec(dir, "kvb_e11.yaml", kModelLine + "weights: q4\ntask: niah\nmethods: [fullkv]\n"));
      },
      {"kvb_e11.yaml:2:", "weights", "'q4'", "fp32, bf16 or gguf"});
  require_error(
      [&] {
        load_experiment(write_spec(dir, "kvb_e12.yaml",
                                   kModelLine + "backend: cuda\nweights: fp32\ntask: niah\nmethods: [fullkv]\n"));
      },
      {"kvb_e12.yaml:3:", "bf16 only"});
}

TEST_CASE("experiment specs: the weight format is read and keys its cells unless fp32", "[experiment]") {
  const TempDir dir("spec_weights");
  const auto none = load_experiment(write_spec(dir, "n.yaml", kModelLine + "task: niah\nmethods: [fullkv]\n"));
  const auto f32 =
      load_experiment(write_spec(dir, "f.yaml", kModelLine + "weights: fp32\ntask: niah\nmethods: [fullkv]\n"));
  const auto bf =
      load_experiment(write_spec(dir, "b.yaml", kModelLine + "weights: bf16\ntask: niah\nmethods: [fullkv]\n"));
  CHECK(!none.weights);
  CHECK(f32.weights == WeightFormat::F32);
  CHECK(bf.weights == WeightFormat::BF16);
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  auto config = [&](const ExperimentSpec& s) {
    return cell_config(*model, *path, s.task, {}, nullptr, KvBudget{}, s.kv_dtype, s.weights);
  };
  CHECK(config(none) == config(f32));
  CHECK(!config(none).contains("weights"));
  CHECK(config(bf)["weights"] == "bf16");
}

TEST_CASE("a parameter added later keys its cells only away from its default", "[experiment]") {
  const std::vector<ParamSpec> specs = {ParamSpec::integer("window", 8, 1, 64, "window"),
                                        ParamSpec::choice("rule", "old", {"old", "new"}, "rule").added_later()};
  const Params at_default({specs}, {}, "m"), given_default({specs}, {{"rule", "old"}}, "m"),
      changed({specs}, {{"rule", "new"}}, "m");
  const std::map<std::string, std::string> before = {{"window", "8"}};  // what records made before it hold
  CHECK(at_default.keyed_values() == before);
  CHECK(given_default.keyed_values() == before);
  CHECK(changed.keyed_values().at("rule") == "new");
  CHECK(at_default.values().at("rule") == "old");  // the method still reads it
  // Wrapped bases carry the mark: VECTOR's and KVCrush's own added parameters and a base's.
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  const std::vector<std::tuple<std::string, std::string, std::map<std::string, std::string>>> methods = {
      {"kvcrush", "threshold", {}}, {"vector", "materialize", {{"maps", "prompt"}}}};
  for (const auto& [name, extra, params] : methods) {
    auto m = MethodRegistry::get().create(name, params, model->config());
    const auto c = cell_config(*model, *path, "niah", {}, m.get(), KvBudget(64), KvDtype::F32, std::nullopt);
    CHECK(!c["params"].contains(extra));
    CHECK(c["params"].contains("base.window"));
  }
}

TEST_CASE("experiment specs: task options are recorded as the task reads them", "[experiment]") {
  // chat: yes and chat: true are one setting, so one cell key and one report row.
  const TempDir dir("spec_options");
  const auto a = load_experiment(
      write_spec(dir, "a.yaml", kModelLine + "task: niah\ntask_options: {chat: yes, depths: 05}\nmethods: [fullkv]\n"));
  const auto b = load_experiment(
      write_spec(dir, "b.yaml", kModelLine + "task: niah\ntask_options: {chat: true, depths: 5}\nmethods: [fullkv]\n"));
  REQUIRE(a.task_variants.size() == 1);
  CHECK(a.task_variants == b.task_variants);
  CHECK(a.task_variants[0] == std::map<std::string, std::string>{{"chat", "true"}, {"depths", "5"}});
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
  const TempDir dir("results");
  const std::string path = (dir / "r.jsonl").string();
  const nlohmann::json cfg = {
      {"task", "niah"}, {"options", {{"chat", "true"}}},      {"model", "m.gguf"}, {"method", "snapkv"},
      {"budget", 64},   {"params", nlohmann::json::object()}, {"gqa", "native"}};
  {
    ResultsFile f(path);
    for (int d : {0, 50})
      f.append({{"key", "k" + std::to_string(d)},
                {"config", cfg},
                {"score", d == 0 ? 1.0 : 0.5},
                {"meta", {{"length", 1000}, {"depth", d}}},
                {"kv_bytes", 25},
                {"full_kv_bytes", 100}});
  }
  // A kill in the middle of a write leaves a torn line.
  std::ofstream(path, std::ios::app) << R"({"key": "k100", "config": {"ta)";
  {
    ResultsFile f(path);
    std::set<std::string> keys;
    for (const auto& [key, cell] : recorded_cells(path)) keys.insert(key);
    CHECK(keys == std::set<std::string>{"k0", "k50"});
    f.append({{"key", "k100"},
              {"config", cfg},
              {"score", 0.0},
              {"meta", {{"length", 1000}, {"depth", 100}}},
              {"kv_bytes", 25},
              {"full_kv_bytes", 100}});
  }
  int n = 0;
  for_each_record(path, [&](const nlohmann::json&, int) { ++n; });
  CHECK(n == 3);
  write_report({path}, (dir / "rep").string());
  std::ifstream md(dir / "rep" / "summary.md");
  std::string text((std::istreambuf_iterator<char>(md)), std::istreambuf_iterator<char>());
  // fp32 records (no kv_dtype field): a quarter of their full cache is half of a full fp16 cache.
  // Three samples scoring 1, 0.5 and 0: too few for a bootstrap interval (stats.hpp's floors).
  CHECK(text.find("| niah | chat=true | snapkv | 64 | fp32 | native | - | 3 | 50.00 | - | - | 25.0% | 50.0% | "
                  "8.00 |") != std::string::npos);
  CHECK(std::filesystem::exists(dir / "rep" / "niah-snapkv-T64-chat.png"));
  // A whole last record without its newline (a file saved by another tool) counts, and a resumed run
  // gives it its newline rather than cutting it (the report left it out).
  const std::string saved = (dir / "saved.jsonl").string();
  {
    std::ifstream in(path, std::ios::binary);
    std::string all((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
    std::ofstream(saved, std::ios::binary) << all.substr(0, all.size() - 1);
  }
  auto count = [](const std::string& file) {
    int records = 0;
    for_each_record(file, [&](const nlohmann::json&, int) { ++records; });
    return records;
  };
  CHECK(count(saved) == 3);
  {
    ResultsFile f(saved);
    f.append({{"key", "k150"}, {"config", cfg}, {"score", 0.0}, {"kv_bytes", 25}, {"full_kv_bytes", 100}});
  }
  CHECK(count(saved) == 4);
  require_error([&] { ResultsFile f(dir.path().string()); }, {"a directory; a results file is a .jsonl file"});
  // A damaged line that is not the last is an error naming the file and line.
  std::ofstream(path, std::ios::app) << "garbage\n{}\n";
  require_error([&] { for_each_record(path, [](const nlohmann::json&, int) {}); }, {"r.jsonl:4", "not a JSON record"});
}

TEST_CASE("results files: gzip-compressed records read as the plain ones, never appended to", "[experiment]") {
  const TempDir dir("results_gz");
  const std::string plain = (dir / "r.jsonl").string();
  {
    ResultsFile f(plain);
    for (int i = 0; i < 40; ++i)
      f.append({{"key", fmt::format("k{}", i)},
                {"config", {{"task", "niah"}, {"model", "m.gguf"}, {"method", "snapkv"}, {"budget", 64}}},
                {"score", (i % 3) / 2.0},
                {"kv_bytes", 25},
                {"full_kv_bytes", 100}});
  }
  std::ifstream in(plain, std::ios::binary);
  const std::string text((std::istreambuf_iterator<char>(in)), std::istreambuf_iterator<char>());
  std::filesystem::create_directories(dir / "gz");
  const std::string packed = (dir / "gz" / "r.jsonl.gz").string();
  gzFile gz = gzopen(packed.c_str(), "wb9");
  REQUIRE(gzwrite(gz, text.data(), unsigned(text.size())) == int(text.size()));
  REQUIRE(gzclose(gz) == Z_OK);
  auto records = [](const std::string& p) {
    std::vector<std::pair<int, std::string>> out;
    for_each_record(p, [&](const nlohmann::json& j, int no) { out.emplace_back(no, j.dump()); });
    return out;
  };
  CHECK(records(packed) == records(plain));
  CHECK(records(packed).size() == 40);
  CHECK(recorded_cells(packed) == recorded_cells(plain));
  // A report reads a directory's .jsonl.gz files as its .jsonl ones.
  write_report({plain}, (dir / "a").string());
  write_report({(dir / "gz").string()}, (dir / "b").string());
  auto slurp = [](const std::filesystem::path& p) {
    std::ifstream f(p);
    return std::string((std::istreambuf_iterator<char>(f)), std::istreambuf_iterator<char>());
  };
  CHECK(slurp(dir / "a" / "summary.csv") == slurp(dir / "b" / "summary.csv"));
  // Committed records are not resumed in place: a run writes plain lines, one synced at a time.
  require_error([&] { ResultsFile f(packed); }, {"r.jsonl.gz", "cannot be appended to", "gunzip -c"});
  // Written whole, a compressed file's last line is a record even without its newline.
  {
    gzFile g = gzopen(packed.c_str(), "wb9");
    REQUIRE(gzwrite(g, text.data(), unsigned(text.size() - 1)) == int(text.size() - 1));
    REQUIRE(gzclose(g) == Z_OK);
  }
  CHECK(records(packed) == records(plain));
  // A killed run's file compressed as it was: its torn last line is left out, as from the plain file.
  {
    const std::string torn = text + R"({"key": "k40", "config": {"ta)";
    gzFile g = gzopen(packed.c_str(), "wb9");
    REQUIRE(gzwrite(g, torn.data(), unsigned(torn.size())) == int(torn.size()));
    REQUIRE(gzclose(g) == Z_OK);
    std::ofstream(plain, std::ios::binary) << torn;
  }
  CHECK(records(packed) == records(plain));
  CHECK(records(packed).size() == 40);
  std::ofstream((dir / "empty.jsonl.gz").string());
  require_error([&] { records((dir / "empty.jsonl.gz").string()); }, {"empty.jsonl.gz", "an empty file"});
  // A compressed file cut short is an error naming it, not fewer records.
  const auto size = std::filesystem::file_size(packed);
  std::filesystem::resize_file(packed, size / 2);
  require_error([&] { records(packed); }, {"r.jsonl.gz", "not a whole gzip file"});
}

namespace {

// The default model over LongBench's qasper fixture: a long real prompt whose cells share a prefill.
struct Qasper {
  std::string path;
  std::unique_ptr<ModelFile> m;
  std::unique_ptr<Tokenizer> tok;
  TaskContext ctx;
  std::unique_ptr<Task> task;
};

std::optional<Qasper> qasper() {
  const auto path = model_file(kDefaultModel);
  if (!path) return std::nullopt;
  Qasper q{*path, ModelFile::open(*path), nullptr, {}, nullptr};
  q.tok = load_tokenizer(*q.m);
  q.ctx.tokenizer = q.tok.get();
  q.ctx.data_dir = fixture("longbench/data");
  q.ctx.options = {{"dataset", "qasper"}};
  q.task = TaskRegistry::get().create("longbench", q.ctx);
  return q;
}

}  // namespace

TEST_CASE("a cell from the shared prefill equals the same cell run alone", "[experiment]") {
  auto q = qasper();
  if (!q) return;
  auto& [path, m, tok, ctx, task] = *q;
  const Sample s = task->sample(0);
  Engine engine(*m);
  std::vector<std::unique_ptr<Method>> methods;
  // A repeat-mode cache (one head per query head) first: the full cache after it must start from the
  // model's own layout again. The paper-era H2O reads every query row of the shared prefill.
  methods.push_back(MethodRegistry::get().create("snapkv", {{"gqa", "repeat"}}, m->config()));
  methods.push_back(nullptr);
  for (const char* name : {"snapkv", "h2o", "streamingllm", "pyramidkv"})
    methods.push_back(MethodRegistry::get().create(name, {}, m->config()));
  methods.push_back(
      MethodRegistry::get().create("h2o", {{"mask", "legacy_window_only"}, {"gqa", "repeat"}}, m->config()));
  PrefillNeeds needs;
  for (const auto& meth : methods)
    if (meth) needs.merge(meth->needs());
  const auto prompt = build_prompt(*m, *tok, s.prompt, s.chat);
  REQUIRE(prompt.size() > 200);
  const PrefillCapture cap = engine.prefill_capture(prompt, needs);
  for (const auto& meth : methods) {
    INFO((meth ? meth->name() : "fullkv"));
    const auto cfg = cell_config(*m, path, "longbench", ctx.options, meth.get(), 64);
    auto shared = run_cell(*m, *tok, engine, *task, s, meth.get(), 64, cfg, &cap);
    auto alone = run_cell(*m, *tok, engine, *task, s, meth.get(), 64, cfg);
    CHECK(shared["prefill_shared"] == true);
    for (const char* k : {"key", "prediction", "score", "kv_bytes", "full_kv_bytes", "prompt_tokens"})
      CHECK(shared[k] == alone[k]);
    if (meth) CHECK(shared["kv_bytes"].get<size_t>() < shared["full_kv_bytes"].get<size_t>());
  }
}

TEST_CASE("cells decoded together give the records each gives alone, and one that cannot begin fails alone",
          "[experiment]") {
  auto q = qasper();
  if (!q) return;
  auto& [path, m, tok, ctx, task] = *q;
  Sample s = task->sample(0);
  s.max_new_tokens = 24;
  Engine engine(*m);
  // H2O acts on every decode step, so its batch row must reach its own method; the full cache is the
  // longest sequence.
  std::vector<std::unique_ptr<Method>> methods;
  methods.push_back(nullptr);
  for (const char* name : {"snapkv", "h2o", "streamingllm", "pyramidkv", "streamingllm"})
    methods.push_back(MethodRegistry::get().create(name, {}, m->config()));
  const std::vector<int> budgets = {0, 64, 96, 64, 128, 4};  // StreamingLLM cannot keep 4 sinks in 4
  std::vector<nlohmann::json> configs;
  std::vector<CellRun> cells;
  PrefillNeeds needs;
  for (size_t i = 0; i < methods.size(); ++i) {
    if (methods[i]) needs.merge(methods[i]->needs());
    configs.push_back(cell_config(*m, path, "longbench", ctx.options, methods[i].get(), budgets[i]));
  }
  for (size_t i = 0; i < methods.size(); ++i) cells.push_back({methods[i].get(), budgets[i], &configs[i]});
  const auto prompt = build_prompt(*m, *tok, s.prompt, s.chat);
  const PrefillCapture cap = engine.prefill_capture(prompt, needs);
  for (const PrefillCapture* capture : {&cap, static_cast<const PrefillCapture*>(nullptr)}) {
    INFO((capture ? "from the shared prefill" : "each its own prefill"));
    const std::vector<CellOutcome> together = run_cells(*m, *tok, engine, *task, s, cells, capture);
    REQUIRE(together.size() == cells.size());
    CHECK(together.back().error.find("must exceed the 4 sink tokens") != std::string::npos);
    for (size_t i = 0; i + 1 < cells.size(); ++i) {
      INFO((methods[i] ? methods[i]->name() : "fullkv"));
      REQUIRE(together[i].error.empty());
      const nlohmann::json alone =
          run_cell(*m, *tok, engine, *task, s, methods[i].get(), budgets[i], configs[i], capture);
      const nlohmann::json& rec = together[i].record;
      for (const char* k :
           {"key", "prediction", "score", "kv_bytes", "full_kv_bytes", "prompt_tokens", "prefill_shared"})
        CHECK(rec[k] == alone[k]);
      CHECK(rec["decode_batch"] == cells.size() - 1);
      CHECK(together[i].seconds >= rec["decode_seconds"].get<double>());
    }
    CHECK(together[0].record["prediction"].get<std::string>().size() > 0);
  }
}

TEST_CASE("shared prefills compute each shared prefix once and equal fresh prefills", "[experiment]") {
  const TempDir dir("shared_prefills");
  auto model = ModelFile::open(tiny_random_model(dir));
  Engine engine(*model);
  std::mt19937 rng(8);
  auto tokens = [&](size_t n) {
    std::vector<int32_t> t(n);
    for (auto& x : t) x = static_cast<int32_t>(rng() % 300);
    return t;
  };
  // A haystack with needles at several depths, one prompt the prefix of another, one repeated, one
  // sharing nothing.
  const auto hay = tokens(300), needle = tokens(6), other = tokens(120);
  std::vector<std::vector<int32_t>> prompts;
  for (size_t depth : {0, 75, 150, 225, 300}) {
    auto p = std::vector<int32_t>(hay.begin(), hay.begin() + std::ptrdiff_t(depth));
    p.insert(p.end(), needle.begin(), needle.end());
    p.insert(p.end(), hay.begin() + std::ptrdiff_t(depth), hay.end());
    prompts.push_back(p);
  }
  prompts.push_back(std::vector<int32_t>(hay.begin(), hay.begin() + 200));
  prompts.push_back(prompts[2]);
  prompts.push_back(other);
  std::vector<std::span<const int32_t>> views(prompts.begin(), prompts.end());
  const auto order = SharedPrefills::order(views);
  REQUIRE(order.size() == prompts.size());
  CHECK(std::is_sorted(order.begin(), order.end(), [&](size_t a, size_t b) { return prompts[a] < prompts[b]; }));
  CHECK(std::find(order.begin(), order.end(), 2) < std::find(order.begin(), order.end(), 6));  // ties keep order
  std::vector<std::span<const int32_t>> sorted;
  for (size_t i : order) sorted.push_back(views[i]);
  // Every distinct prefix is a node of the prompts' trie: what a perfect reuse computes.
  std::set<std::vector<int32_t>> nodes;
  size_t total = 0;
  for (const auto& p : prompts) {
    total += p.size();
    for (size_t n = 1; n <= p.size(); ++n) nodes.insert(std::vector<int32_t>(p.begin(), p.begin() + std::ptrdiff_t(n)));
  }
  const PrefillNeeds needs{.window = 8, .k_pre_rope = false, .attn_colsum = true};
  // Kept prefixes without a limit, none, and without a limit but every third prompt skipped.
  for (auto [budget, skips] : {std::pair{size_t(1) << 30, false}, {size_t(0), false}, {size_t(1) << 30, true}}) {
    INFO("kept at most " << budget << " bytes, skips " << skips);
    SharedPrefills shared(engine, needs, sorted, budget);
    size_t skipped = 0;
    for (size_t i : order) {
      if (skips && ++skipped % 3 == 0) {
        shared.skip();
        continue;
      }
      const auto got = shared.next();
      const PrefillCapture want = engine.prefill_capture(prompts[i], needs);
      REQUIRE(got->ids == want.ids);
      for (size_t l = 0; l < want.k.size(); ++l) {
        CHECK(max_abs_diff(got->k[l], want.k[l]) <= 1e-5f * max_abs(want.k[l]));
        CHECK(max_abs_diff(got->attn_colsum[l], want.attn_colsum[l]) <= 1e-5f * max_abs(want.attn_colsum[l]));
        CHECK(max_abs_diff(got->q_window[l], want.q_window[l]) <= 1e-5f * max_abs(want.q_window[l]));
      }
      CHECK(max_abs_diff(got->logits, want.logits) <= 1e-5f * max_abs(want.logits));
    }
    if (skips) {
      CHECK(shared.tokens_prefilled() < shared.tokens_total());
    } else {
      CHECK(shared.tokens_total() == total);
      CHECK(shared.tokens_prefilled() == (budget ? nodes.size() : total));
    }
    require_error([&] { shared.next(); }, {"more prompts"});
  }
}

namespace {

// The most recent T tokens, declared as changing prefill so that a sweep must give it its own.
class OwnPrefill final : public Method {
 public:
  LayerCache compress(const PrefillView& v, const Budget& b) override {
    std::vector<int32_t> keep;
    for (int j = v.n_tokens - b.tokens; j < v.n_tokens; ++j) keep.push_back(j);
    return gather(v, gqa(), std::vector<std::vector<int32_t>>(stored_heads(), keep));
  }
};
const bool own_prefill_registered = register_method({.name = "test_own_prefill",
                                                     .summary = "test only: recent tokens, own prefill",
                                                     .make = [] { return std::make_unique<OwnPrefill>(); },
                                                     .changes_model = true});

// A small real sweep: NIAH at 300 and 400 tokens x 2 depths x the methods.
std::string sweep_spec(const TempDir& dir, const std::string& model, const std::string& name,
                       const std::string& methods, const std::string& out) {
  return write_spec(dir, name + ".yaml",
                    "name: " + name + "\nmodel: " + model +
                        "\ntask: niah\ntask_options: {s_len: 300, e_len: 400, step: 100, depths: 2, "
                        "chat: true}\nmethods: [" +
                        methods + "]\nbudgets: [64]\nout: " + out + "\n");
}

size_t lines_in(const std::string& path) {
  std::ifstream in(path);
  size_t n = 0;
  for (std::string l; std::getline(in, l);) n += !l.empty();
  return n;
}

std::map<std::string, nlohmann::json> records_by_key(const std::vector<std::string>& paths) {
  std::map<std::string, nlohmann::json> out;
  for (const auto& p : paths)
    for_each_record(p, [&](const nlohmann::json& r, int) {
      CHECK(out.count(r["key"].get<std::string>()) == 0);  // each cell recorded exactly once
      out[r["key"].get<std::string>()] = r;
    });
  return out;
}

bool essays_present() {
  if (std::filesystem::exists(default_data_dir() + "/PaulGrahamEssays")) return true;
  const char* req = std::getenv("KVBENCH_REQUIRE_MODELS");
  if (req && std::string(req) == "1") FAIL("essays missing (run scripts/setup.sh)");
  WARN("skipped: essays absent (run scripts/setup.sh)");
  return false;
}

}  // namespace

TEST_CASE("a resumed sweep refuses records made from another prompt (another data directory)", "[experiment][sweep]") {
  // Found by a walkthrough: NIAH's sample ids name only length and depth, so a run over another haystack
  // took the first run's records for its own ("0 cells").
  const auto model = model_file(kDefaultModel);
  if (!model || !essays_present()) return;
  const TempDir dir("sweep_data");
  std::vector<std::filesystem::path> essays;
  for (const auto& e : std::filesystem::directory_iterator(default_data_dir() + "/PaulGrahamEssays"))
    if (e.path().extension() == ".txt") essays.push_back(e.path());
  std::sort(essays.begin(), essays.end());
  REQUIRE(essays.size() >= 4);
  for (const auto& [name, from] : {std::pair{"a", 0}, {"b", 2}}) {
    std::filesystem::create_directories(dir / name / "PaulGrahamEssays");
    for (int k = from; k < from + 2; ++k)
      std::filesystem::copy_file(essays[size_t(k)], dir / name / "PaulGrahamEssays" / essays[size_t(k)].filename());
  }
  const std::string out = (dir / "r.jsonl").string(), spec = sweep_spec(dir, *model, "sweep_data", "fullkv", out);
  auto with_data = [&](const char* name) {
    ExperimentSpec s = load_experiment(spec, {"max_new_tokens=2"});
    s.data = (dir / name).string();
    s.limit = 1;
    return s;
  };
  CHECK(Sweep(with_data("a")).run(false).run == 1);
  for_each_record(out, [](const nlohmann::json& r, int) { CHECK(r["prompt_digest"].get<std::string>().size() == 16); });
  CHECK(Sweep(with_data("a")).run(false).run == 0);
  require_error([&] { Sweep(with_data("b")).run(false); },
                {"r.jsonl:1", "recorded from another prompt", "write to another --out"});
}

TEST_CASE("a KV size a method cannot keep a longer prompt in is refused before any cell runs", "[experiment][sweep]") {
  // Found by a review: --dry-run passed it, and every cell of it then failed after its prefill.
  const auto model = model_file(kDefaultModel);
  if (!model || !essays_present()) return;
  const TempDir dir("sweep_window");
  const std::string out = (dir / "r.jsonl").string();
  const std::string spec = sweep_spec(dir, *model, "sweep_window", "snapkv, streamingllm", out);
  CHECK_NOTHROW(Sweep(load_experiment(spec, {"budgets=[64]"})));
  CHECK_NOTHROW(Sweep(load_experiment(spec, {"budgets=[32]"})));  // the window alone
  require_error([&] { Sweep(load_experiment(spec, {"budgets=[31]"})); },
                {"sweep_window.yaml: method snapkv at KV size 31", "no room beyond the 32-token window"});
  // Paged H2O keeps its recent window beside T, the evictable middle: T below the window is fine.
  CHECK_NOTHROW(Sweep(
      load_experiment(spec, {"budgets=[64]", "methods=[{name: h2o, params: {paging: 32, start: 32, window: 128}}]"})));
  require_error(
      [&] {
        Sweep(load_experiment(spec,
                              {"budgets=[16]", "methods=[{name: h2o, params: {paging: 32, start: 32, window: 128}}]"}));
      },
      {"method h2o at KV size 16", "paging"});
  // Wrappers ask their base; StreamingLLM its sinks; a budget no prompt exceeds is never used.
  require_error(
      [&] {
        Sweep(load_experiment(spec, {"budgets=[16]", "methods=[{name: kvcrush, params: {base: snapkv}}]"}));
      },
      {"method kvcrush at KV size 16", "32-token window"});
  require_error(
      [&] {
        Sweep(load_experiment(spec, {"budgets=[4]", "methods=[streamingllm]"}));
      },
      {"method streamingllm at KV size 4", "must exceed the 4 sink tokens"});
  CHECK_NOTHROW(Sweep(load_experiment(spec, {"budgets=[100000]"})));
  CHECK_FALSE(std::filesystem::exists(out));
}

TEST_CASE("a sweep killed part-way resumes with every cell recorded once, shards union to the whole",
          "[experiment][sweep]") {
  const auto model = model_file(kDefaultModel);
  if (!model || !essays_present()) return;
  const TempDir dir("sweep");
  const std::string whole = (dir / "whole.jsonl").string();
  const std::string spec_path = sweep_spec(dir, *model, "sweep_whole", "fullkv, snapkv, streamingllm", whole);

  // The real command line, killed (SIGKILL, no chance to clean up) once two cells are recorded.
  const std::string cli = KVBENCH_CLI;
  std::vector<char*> argv = {const_cast<char*>(cli.c_str()), const_cast<char*>("run"),
                             const_cast<char*>(spec_path.c_str()), nullptr};
  pid_t pid = 0;
  REQUIRE(posix_spawn(&pid, cli.c_str(), nullptr, nullptr, argv.data(), environ) == 0);
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::minutes(2);
  int status = 0;
  bool exited = false;
  while (lines_in(whole) < 2 && std::chrono::steady_clock::now() < deadline && !exited) {
    std::this_thread::sleep_for(std::chrono::milliseconds(10));
    exited = waitpid(pid, &status, WNOHANG) == pid;
  }
  if (!exited) {
    kill(pid, SIGKILL);
    waitpid(pid, &status, 0);
  }
  REQUIRE(WIFSIGNALED(status));  // killed, not finished
  const size_t before = lines_in(whole);
  REQUIRE(before >= 2);
  REQUIRE(before < 12);

  const ExperimentSpec spec = load_experiment(spec_path);
  const SweepOutcome resumed = Sweep(spec).run(false);
  CHECK(resumed.already == before);
  CHECK(resumed.run == 12 - before);
  const auto all = records_by_key({whole});
  REQUIRE(all.size() == 12);

  // Shards write separate files; their union is the unsharded sweep, record for record.
  std::vector<std::string> shard_files;
  size_t shard_cells = 0;
  for (int i = 0; i < 2; ++i) {
    ExperimentSpec part = spec;
    part.out = (dir / fmt::format("shard{}.jsonl", i)).string();
    shard_files.push_back(part.out);
    shard_cells += Sweep(part, parse_shard(fmt::format("{}/2", i))).run(false).run;
  }
  CHECK(shard_cells == 12);
  const auto merged = records_by_key(shard_files);
  REQUIRE(merged.size() == all.size());
  for (const auto& [key, r] : all) {
    INFO(key);
    REQUIRE(merged.count(key));
    for (const char* k : {"prediction", "score", "kv_bytes", "full_kv_bytes", "prompt_tokens"})
      CHECK(merged.at(key)[k] == r[k]);
  }

  // A method that changes prefill gets its own; the others share one.
  ExperimentSpec own =
      load_experiment(sweep_spec(dir, *model, "sweep_own", "snapkv, test_own_prefill", (dir / "own.jsonl").string()));
  own.limit = 1;
  CHECK(Sweep(own).run(false).run == 2);
  for (const auto& [key, r] : records_by_key({own.out}))
    CHECK(r["prefill_shared"] == (r["config"]["method"] == "snapkv"));
  // Two entries of the same configuration are one cell.
  ExperimentSpec twice = load_experiment(sweep_spec(
      dir, *model, "sweep_twice", "snapkv, {name: snapkv, params: {window: 32}}", (dir / "twice.jsonl").string()));
  twice.limit = 1;
  REQUIRE(twice.configs.size() == 2);
  CHECK(Sweep(twice).run(false).run == 1);
  CHECK(lines_in(twice.out) == 1);
  // Cells decoded together (batch) are the cells run one by one, times aside.
  const ExperimentSpec batched = load_experiment(
      sweep_spec(dir, *model, "sweep_batched", "fullkv, snapkv, streamingllm, h2o", (dir / "batched.jsonl").string()),
      {"batch=3"});
  REQUIRE(batched.batch == 3);
  ExperimentSpec single = batched;
  single.batch = 1;
  single.out = (dir / "single.jsonl").string();
  CHECK(Sweep(batched).run(false).run == 16);
  CHECK(Sweep(single).run(false).run == 16);
  const auto by_batch = records_by_key({batched.out}), one_by_one = records_by_key({single.out});
  REQUIRE(by_batch.size() == 16);
  for (const auto& [key, r] : one_by_one) {
    INFO(key);
    REQUIRE(by_batch.count(key));
    for (const char* k : {"prediction", "score", "kv_bytes", "prompt_tokens"}) CHECK(by_batch.at(key)[k] == r[k]);
    CHECK(by_batch.at(key).contains("decode_batch"));
    CHECK_FALSE(r.contains("decode_batch"));
  }
  // A method that makes its own weights (Atom) decodes apart from the methods keeping the model's.
  const ExperimentSpec mixed = load_experiment(
      sweep_spec(dir, *model, "sweep_mixed",
                 "test_own_prefill, {name: atom, params: {reorder: false, act_group_size: 64, weight_group_size: 64}}",
                 (dir / "mixed.jsonl").string()),
      {"batch=2"});
  CHECK(Sweep(mixed).run(false).run == 8);
  require_error([&] { load_experiment(spec_path, {"batch=0"}); }, {"'batch' must be at least 1"});
  require_error([] { parse_shard("2/2"); }, {"--shard 2/2", "0 <= i < N"});
  require_error([] { parse_shard("1/2x"); }, {"--shard 1/2x"});
}

TEST_CASE("a record's key leaves out the code version, also for records that carry it in their config",
          "[experiment]") {
  const nlohmann::json cfg = {
      {"task", "ruler"}, {"options", {{"length", "4096"}}},    {"model", "m.gguf"}, {"method", "snapkv"},
      {"budget", 64},    {"params", nlohmann::json::object()}, {"gqa", "native"}};
  nlohmann::json old_style = cfg;
  old_style["version"] = "65d6cac-dirty";
  const std::string key = cell_key(cfg, "s0");
  CHECK(record_key({{"key", cell_key(old_style, "s0")}, {"id", "s0"}, {"config", old_style}}) == key);
  CHECK(record_key({{"key", key}, {"id", "s0"}, {"config", cfg}, {"version", "1234abc"}}) == key);
  CHECK(cell_key(old_style, "s0") != key);
}

TEST_CASE("a cell that fails is logged beside the results and retried, the other cells recorded",
          "[experiment][sweep]") {
  const auto model = model_file(kDefaultModel);
  if (!model || !essays_present()) return;
  const TempDir dir("sweep_fail");
  const std::string out = (dir / "r.jsonl").string();
  // StreamingLLM cannot keep its 4 sink tokens in the 1% of a prompt a ratio of 0.99 leaves: every such
  // cell fails as it runs (a KV size of 4 would be refused before any cell).
  const std::string path = write_spec(dir, "fail.yaml",
                                      "name: fail\nmodel: " + *model +
                                          "\ntask: niah\ntask_options: {s_len: 300, e_len: 400, step: 100, depths: 2}\n"
                                          "methods: [fullkv, streamingllm]\nratios: [0.99]\nout: " +
                                          out + "\n");
  const ExperimentSpec spec = load_experiment(path);
  const SweepOutcome o = Sweep(spec).run(false);
  CHECK(o.run == 4);
  CHECK(o.failed == 4);
  REQUIRE(o.failures == out + ".failed");
  const auto failures = read_jsonl(o.failures);
  REQUIRE(failures.size() == 4);
  for (const auto& f : failures) {
    CHECK(f["config"]["method"] == "streamingllm");
    CHECK(f["error"].get<std::string>().find("must exceed the 4 sink tokens") != std::string::npos);
    CHECK(f["key"].get<std::string>().size() == 16);
  }
  CHECK(read_jsonl(out).size() == 4);
  const SweepOutcome again = Sweep(spec).run(false);  // the failed cells are tried again, the rest skipped
  CHECK(again.run == 0);
  CHECK(again.already == 4);
  CHECK(again.failed == 4);
}

// What `kvbench ARGS` prints (stdout and stderr) and its exit status.
static std::pair<std::string, int> cli_output(const std::string& args) {
  FILE* pipe = popen(fmt::format("{} {} 2>&1", KVBENCH_CLI, args).c_str(), "r");
  REQUIRE(pipe != nullptr);
  std::string out;
  char buf[4096];
  for (size_t got; (got = fread(buf, 1, sizeof buf, pipe)) > 0;) out.append(buf, got);
  return {out, pclose(pipe)};
}

TEST_CASE("kvbench bench and dump-prefill refuse values they cannot honour before any work", "[experiment][bench]") {
  const TempDir dir("bench_args");
  const std::string model = tiny_random_model(dir);
  const auto refused = [&](const std::string& args, const std::string& message) {
    const auto [out, status] = cli_output(args);
    INFO(args << "\n" << out);
    CHECK(status != 0);
    CHECK(out.find(message) != std::string::npos);
  };
  const std::string bench = "bench " + model + " -c 48 -r 1 --decode-tokens 2 ";
  // Found by an audit: 0 and NaN turned the cap off or overflowed the batch size.
  for (const char* cap : {"0", "1e-12", "nan", "inf", "1e10"})
    refused(bench + "--memory-cap " + cap, "must be a number of GiB, at least one byte");
  refused(bench + "--method snapkv --budget 0", "--budget 0: must be a positive number");
  refused(bench + "--method snapkv:window=5,window=6 --budget 8", "parameter 'window' given twice");
  refused(bench + "--plot " + (dir / "no" / "plot").string(), "does not exist");
  // A method's label holds commas: the CSV quotes it.
  const auto [csv, status] =
      cli_output(bench + "--method snapkv:window=2,kernel=3 --budget 8 --format csv 2>/dev/null");
  REQUIRE(status == 0);
  CHECK(csv.find("\"snapkv(window=2,kernel=3) T=8\"") != std::string::npos);
  // dump-prefill read queries from before its buffer for a window past the prompt.
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  std::ofstream((dir / "t.jsonl").string())
      << R"({"id": "a", "context": "The quick brown fox jumps over the lazy dog.", "question": "Who?", "answers": ["x"]})"
      << "\n";
  const std::string dump = fmt::format("dump-prefill jsonl -m {} -o file={} -o chat=false --out {} ", *path,
                                       (dir / "t.jsonl").string(), (dir / "dump").string());
  refused(dump + "--window 100", "--window 100: sample 0 has");
  refused(dump + "--layers 30", "--layers 30: the model has layers 0 to 29");
  refused(dump + "--layers -1", "--layers -1");
}

TEST_CASE("kvbench bench: each compressed row's decode speed-up beside the speed-up its bytes promise",
          "[experiment][bench]") {
  const TempDir dir("bench_bytes");
  const std::string model = tiny_random_model(dir);
  auto bench = [&](const std::string& args) {
    return cli_output(fmt::format("bench {} -c 96 --decode-tokens 4 --format json {}", model, args));
  };
  const std::string plot = (dir / "throughput").string();
  const auto [out, status] = bench("--method snapkv --budget 32 -b 1 -b 3 --plot " + plot);
  INFO(out);
  REQUIRE(status == 0);
  for (const char* ext : {".png", ".svg"}) CHECK(std::filesystem::file_size(plot + ext) > 1000);
  std::ifstream csv(plot + ".csv");
  std::vector<std::string> lines;
  for (std::string l; std::getline(csv, l);) lines.push_back(l);
  REQUIRE(lines.size() == 5);  // the header, two configurations at two batch sizes
  CHECK(lines[0] == "cache,batch,decode_tokens_per_s");
  CHECK(lines[2].rfind("full,3,", 0) == 0);
  CHECK(lines[4].rfind("snapkv T=32,3,", 0) == 0);
  const auto rows = nlohmann::json::parse(out.substr(out.find('{'), out.rfind('}') + 1 - out.find('{')))["rows"];
  REQUIRE(rows.size() == 4);  // full and SnapKV at batch 1, then at batch 3
  const auto& full = rows[0];
  const auto& snap = rows[1];
  CHECK(full["batch"] == 1);
  CHECK(rows[2]["batch"] == 3);
  CHECK(rows[3]["cache"] == "snapkv T=32");
  // Three sequences' caches, each of one prompt's size (the prompts differ, the kept sizes do not).
  CHECK(rows[2]["kv_bytes"].get<size_t>() == 3 * full["kv_bytes"].get<size_t>());
  CHECK(rows[3]["kv_bytes"].get<size_t>() == 3 * snap["kv_bytes"].get<size_t>());
  const size_t weights = full["decode_step_bytes"].get<size_t>() - full["kv_bytes"].get<size_t>();
  CHECK(snap["decode_step_bytes"].get<size_t>() == weights + snap["kv_bytes"].get<size_t>());
  CHECK(snap["kv_bytes"].get<size_t>() < full["kv_bytes"].get<size_t>());
  CHECK(snap["decode_bytes_ratio_vs_full"].get<double>() ==
        Approx(double(full["decode_step_bytes"].get<size_t>()) / double(snap["decode_step_bytes"].get<size_t>())));
  CHECK(snap["decode_bytes_ratio_vs_full"].get<double>() > 1.0);
  CHECK(full["decode_bytes_ratio_vs_full"].get<double>() == 0.0);  // the full cache is the reference
  CHECK(snap["decode_speedup_vs_full"].get<double>() > 0.0);
  // Each row's bound again at the rate its own step's bytes are read (a small model's stay in a cache).
  for (const auto& r : rows) {
    const double gbs = r["working_set_bandwidth_gbs"].get<double>();
    CHECK(gbs > 0.0);
    CHECK(r["decode_working_set_bound_tokens_per_s"].get<double>() ==
          Approx(r["batch"].get<double>() * gbs * 1e9 / r["decode_step_bytes"].get<double>()));
    CHECK(r["decode_working_set_efficiency"].get<double>() ==
          Approx(r["decode_tokens_per_s"][0].get<double>() / r["decode_working_set_bound_tokens_per_s"].get<double>()));
  }

  // Under a memory cap each configuration decodes at the largest batch whose weights, caches and decode
  // buffers fit: about 3.5 times what one full-cache sequence needs holds three, SnapKV's more.
  const double one = full["accounted_bytes"].get<double>(), cap = 3.5 * one;
  const auto [capped, capped_status] =
      bench(fmt::format("--method snapkv --budget 32 --memory-cap {:.9f}", cap / 1073741824.0));
  INFO(capped);
  REQUIRE(capped_status == 0);
  const auto fit = nlohmann::json::parse(capped.substr(capped.find('{')))["rows"];
  REQUIRE(fit.size() == 2);
  CHECK(fit[0]["batch"].get<int>() >= 3);
  CHECK(fit[1]["batch"].get<int>() > fit[0]["batch"].get<int>());
  for (const auto& r : fit) CHECK(r["accounted_bytes"].get<double>() <= cap);
  const auto [refused, refused_status] = bench(fmt::format("--memory-cap {:.9f}", 0.5 * one / 1073741824.0));
  CHECK(refused_status != 0);
  CHECK_THAT(refused, Catch::Matchers::Contains("is below what one sequence needs"));

  // Several methods in one run, each with parameters of its own, every one's rows against the same full
  // cache; --param goes to all.
  const auto [two, two_status] =
      bench("--method snapkv --method streamingllm:sinks=2,gqa=repeat --budget 32 --budget 48 --param gqa=native -r 2");
  INFO(two);
  REQUIRE(two_status == 0);
  const auto both = nlohmann::json::parse(two.substr(two.find('{')))["rows"];
  REQUIRE(both.size() == 5);
  CHECK(both[0]["cache"] == "full");
  CHECK(both[1]["cache"] == "snapkv T=32");
  CHECK(both[2]["cache"] == "snapkv T=48");
  CHECK(both[3]["cache"] == "streamingllm(sinks=2,gqa=repeat) T=32");
  CHECK(both[4]["cache"] == "streamingllm(sinks=2,gqa=repeat) T=48");
  // Its own gqa=repeat over --param's native: a cache per query head, two per KV head here.
  CHECK(both[3]["kv_bytes"].get<size_t>() == 2 * both[1]["kv_bytes"].get<size_t>());
  for (size_t i = 1; i < both.size(); ++i) CHECK(both[i]["decode_speedup_vs_full"].get<double>() > 0.0);
  // Each row's per-operation figures are medians over its runs, one profiled prefill each.
  for (const auto& r : both) CHECK(r["profiled_prefills"].get<int>() == 2);
  for (const auto& [args, message] : std::vector<std::pair<std::string, std::string>>{
           {"--budget 32", "--budget needs --method"},
           {"--method snapkv", "--method snapkv needs --budget"},
           {"--method snapkv:sinks --budget 32", "'sinks' is not key=value"},
           {"--method streamingllm:sinks=x --budget 32", "sinks"}}) {
    const auto [bad, bad_status] = bench(args);
    INFO(args << ": " << bad);
    CHECK(bad_status != 0);
    CHECK_THAT(bad, Catch::Matchers::Contains(message));
  }
}
