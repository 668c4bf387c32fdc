// Paper tables as data: published.csv parsing and its checks against a spec, spec overrides (--set,
// ${VAR}, --model), ours beside published (kvbench report --compare), the context check before a
// sweep runs, and one transcribed table against the paper's text.
#include <fmt/format.h>

#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <numeric>
#include <sstream>

#include "harness/experiment/coverage.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/published.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/report/comparison.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;
using nlohmann::json;

namespace {

std::string write_file(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto path = (dir / name).string();
  std::ofstream(path) << text;
  return path;
}

// Rows of a CSV whose fields hold no commas or quotes.
std::vector<std::vector<std::string>> read_csv_rows(const std::string& path) {
  std::ifstream in(path);
  REQUIRE(in.good());
  std::vector<std::vector<std::string>> rows;
  for (std::string line; std::getline(in, line);) {
    std::vector<std::string> f(1);
    for (char c : line) {
      if (c == ',')
        f.emplace_back();
      else
        f.back().push_back(c);
    }
    rows.push_back(f);
  }
  return rows;
}

const std::string kHeader = "table,model,method,params,budget,task,length,column,score\n";

json config(const std::string& method, int budget, json params, const std::string& dataset) {
  return {{"task", "longbench"},
          {"options", {{"dataset", dataset}, {"max_len", "7950"}}},
          {"model", "m.gguf"},
          {"method", method},
          {"budget", budget},
          {"params", std::move(params)},
          {"gqa", method == "fullkv" ? "-" : "native"}};
}

}  // namespace

TEST_CASE("published.csv: rows are read and bad fields are named", "[published]") {
  const TempDir dir("published");
  const auto ok = write_file(dir, "ok.csv",
                             kHeader +
                                 "t1,Llama,snapkv,window=8 kernel=7,128,longbench,,qasper,16.92\n"
                                 "t1,Llama,vector,base=snapkv,r0.5,longbench,,avg,\"40.10\"\n"
                                 "t2,Llama,fullkv,,full,ruler,8192,niah_single_1,100\n"
                                 "t3,Llama,dynakv,,full,ruler,,vt,55.5\n");
  const auto rows = load_published(ok);
  REQUIRE(rows.size() == 4);
  CHECK(rows[0].params == std::map<std::string, std::string>{{"kernel", "7"}, {"window", "8"}});
  CHECK(rows[0].budget == KvBudget(128));
  CHECK(rows[0].score == 16.92);
  CHECK(rows[0].line == 2);
  CHECK(rows[1].budget.is_ratio());
  CHECK(rows[1].budget.ratio == 0.5);
  CHECK(rows[1].score == 40.10);
  CHECK(rows[2].budget.is_full());
  CHECK(rows[2].length == 8192);
  CHECK(rows[3].length == 0);  // the mean over the spec's lengths

  auto bad = [&](const std::string& row, std::initializer_list<std::string> fragments) {
    const auto p = write_file(dir, "bad.csv", kHeader + row + "\n");
    require_error([&] { load_published(p); }, fragments);
  };
  bad("t1,L,snapkv,,0,longbench,,qasper,1", {"bad.csv:2", "budget", "'0'"});
  bad("t1,L,snapkv,,r1.5,longbench,,qasper,1", {"budget", "r1.5"});
  bad("t1,L,snapkv,,128,longbench,,qasper,n/a", {"bad.csv:2", "score", "n/a"});
  bad("t1,L,snapkv,,128,longbench,4096,qasper,1", {"length", "only rows of tasks with a length option"});
  bad("t1,L,snapkv,,128,ruler,4k,vt,1", {"length", "4k"});
  bad("t1,L,snapkv,,128,mmlu,,x,1", {"task", "mmlu"});
  bad("t1,L,snapkv,window,128,longbench,,qasper,1", {"params", "'window'"});
  bad("t1,L,snapkv,,128,longbench,qasper,1", {"8 fields, expected 9"});
  bad("t1,L,,,128,longbench,,qasper,1", {"field 'method' is empty"});
  const auto header = write_file(dir, "h.csv", "table,method,score\nt1,snapkv,1\n");
  require_error([&] { load_published(header); }, {"h.csv:1", "expected the header"});
}

TEST_CASE("published.csv: names kvbench lacks are declared in external.yaml, any other is an error", "[published]") {
  const TempDir dir("external");
  std::filesystem::create_directories(dir.path() / "paper");
  write_file(dir, "external.yaml",
             "methods:\n  palu2: {what: low-rank K/V, reference: someone/Palu}\n"
             "parameters:\n  kvcrush: {clusters: k-means grouping (KVCrush Figure 3)}\n"
             "tasks:\n  gsm9k: {what: math, columns: [strict, flexible]}\n"
             "models:\n  L: llama\n  F: falcon\n");
  auto csv = [&](const std::string& rows) { return write_file(dir, "paper/published.csv", kHeader + rows); };
  const auto rows =
      load_published(csv("t,L,palu2,rank_ratio=0.4,full,longbench,,qasper,1\n"
                         "t,F,kvcrush,clusters=8,512,gsm9k,,strict,2\n"
                         "t,L,snapkv,,128,longbench,,avg,3\n"));
  CHECK(rows.size() == 3);
  auto bad = [&](const std::string& row, std::initializer_list<std::string> fragments) {
    require_error([&] { load_published(csv(row + "\n")); }, fragments);
  };
  bad("t,L,palu3,,full,longbench,,qasper,1", {"published.csv:2", "field 'method'", "palu3", "external.yaml"});
  bad("t,L,snapkv,,128,longbench,,qaspr,1", {"published.csv:2", "field 'column'", "qaspr"});
  bad("t,L,kvcrush,cluster=8,128,longbench,,qasper,1", {"field 'params'", "kvcrush", "cluster"});
  bad("t,L,h2o,,128,gsm9k,,acc,1", {"field 'column'", "gsm9k", "strict, flexible"});
  bad("t,Q,snapkv,,128,longbench,,qasper,1", {"field 'model'", "'Q'"});
  // A declaration of what kvbench has is stale: it would count a runnable row as blocked.
  write_file(dir, "external.yaml", "methods:\n  snapkv: {what: window attention}\n");
  require_error([&] { load_published(csv("t,L,snapkv,,128,longbench,,qasper,1\n")); },
                {"external.yaml", "snapkv", "kvbench method now"});
}

TEST_CASE("report --coverage: printed cells per table, regenerable from the registries and specs, and blockers",
          "[published]") {
  const auto tables = paper_coverage(source_path("experiments/papers"));
  auto find = [&](const std::string& paper, const std::string& table) {
    for (const auto& t : tables)
      if (t.paper == paper && t.table == table) return t;
    FAIL("no table " << paper << "/" << table);
    return TableCoverage{};
  };
  // Hand counts from the papers. KVmix Table 2: FP16 and five methods on 8 datasets + Average (9 cells
  // each), KVQuant's included.
  const auto kvmix = find("kvmix", "table2_longbench");
  CHECK(kvmix.cells == 54);
  CHECK(kvmix.regenerable == 54);
  CHECK(kvmix.blockers.empty());
  // KVmix Table 1: five rows x 9 cells on five models, Falcon-7B's included.
  const auto kvmix_t1 = find("kvmix", "table1_longbench");
  CHECK(kvmix_t1.cells == 180);
  CHECK(kvmix_t1.regenerable == 180);
  // KVCrush Table 2: GSM8K strict and flexible for H2O and three KVCrush anchors on three models, with
  // page-level eviction (Phi-3-mini-4k-instruct runs since the phi3 architecture landed).
  const auto gsm = find("kvcrush", "table2_gsm8k");
  CHECK(gsm.cells == 24);
  CHECK(gsm.regenerable == 24);  // paged H2O and paged KVCrush
  CHECK(gsm.blockers.empty());
  CHECK(gsm.blockers.count("architecture phi3") == 0);
  // MixedDimKV Table 9: Full, MixedDimKV, MixedDimKV-H and Palu at 40% on 16 datasets + Avg, two models.
  const auto t9 = find("mixeddimkv", "table9_longbench");
  CHECK(t9.cells == 136);
  CHECK(t9.regenerable == 136);
  // DynaKV Table 1 (zero-shot multiple choice): five benchmarks + Avg for Full, DynaKV x3, Palu x3 and (Llama
  // only) MatryoshkaKV x3; all run.
  const auto mc = find("dynakv", "table1_mc");
  CHECK(mc.cells == 60);
  CHECK(mc.regenerable == 60);
  CHECK(mc.blockers.empty());
  const auto mc_qwen3 = find("dynakv", "table1_mc_qwen3");
  CHECK(mc_qwen3.cells == 42);
  CHECK(mc_qwen3.regenerable == 42);
  // DynaKV Table 4 (perplexity): C4 and PG-19 for Full, DynaKV x3, Palu x3 (and MatryoshkaKV x3 on Llama).
  const auto ppl = find("dynakv", "table4_perplexity");
  CHECK(ppl.cells == 20);
  CHECK(ppl.regenerable == 20);
  CHECK(find("dynakv", "table4_perplexity_qwen3").regenerable == 14);
  // KVmix Table 3: both columns of FP16, RTN x2, KVmix-2bit, random, KIVI, QJL, KVQuant, KVmix and Atom-4bit (with
  // GPTQ weights) run.
  for (const char* column : {"table3_gsm8k", "table3_perplexity"}) {
    const auto t3 = find("kvmix", column);
    CHECK(t3.cells == 10);
    CHECK(t3.regenerable == 10);
    CHECK(t3.blockers.empty());
  }
  // VECTOR Table 5 with its K-only rows (approximate=keys).
  const auto konly = find("vector", "table5_longbench_keydiff");
  CHECK(konly.cells == 48);
  CHECK(konly.regenerable == 48);
  // VECTOR's KVzip blocks run from their specs.
  const auto kvzip = find("vector", "table2_longbench_kvzip");
  CHECK(kvzip.cells == 272);
  CHECK(kvzip.regenerable == 272);
  // The printed averages the papers get wrong are found, not listed by hand.
  std::string report = coverage_markdown(tables);
  CHECK(report.find("avg printed 47.31, its 16 cells give 46.922") != std::string::npos);  // VECTOR PyramidKV+VECTOR
  CHECK(report.find("avg printed 21.94, its 16 cells give 22.069") != std::string::npos);  // DynaKV 12%
}

TEST_CASE("published.csv: every row of a table must name a cell of its spec", "[published]") {
  const TempDir dir("published_check");
  const std::vector<json> configs = {
      config("fullkv", 0, json::object(), "qasper"),
      config("snapkv", 128, {{"window", "8"}, {"kernel", "7"}}, "qasper"),
  };
  const std::vector<std::map<std::string, std::string>> variants = {{{"dataset", "qasper"}, {"max_len", "7950"}},
                                                                    {{"dataset", "trec"}, {"max_len", "7950"}}};
  auto check = [&](const std::string& rows, PublishedChecks checks = {}) {
    const auto p = write_file(dir, "p.csv", kHeader + rows);
    check_published(load_published(p), "t1", "spec.yaml", "longbench", configs, variants, checks);
  };
  check(
      "t1,L,snapkv,window=8,128,longbench,,qasper,1\nt1,L,fullkv,,full,longbench,,trec,2\nt1,L,fullkv,,full,"
      "longbench,,avg,3\nt9,L,h2o,,64,longbench,,lcc,4\n");  // rows of other tables are not this spec's
  require_error([&] { check("t1,L,h2o,,128,longbench,,qasper,1\n"); }, {"p.csv:2", "does not run method h2o"});
  require_error([&] { check("t1,L,snapkv,window=32,128,longbench,,qasper,1\n"); },
                {"p.csv:2", "no configuration of snapkv", "window=32"});
  require_error([&] { check("t1,L,snapkv,,256,longbench,,qasper,1\n"); }, {"and this budget"});
  require_error([&] { check("t1,L,snapkv,,128,longbench,,lcc,1\n"); }, {"column lcc", "no task variant"});
  require_error([&] { check("t1,L,snapkv,,128,ruler,4096,vt,1\n"); }, {"its task is ruler"});
  require_error([&] { check("t2,L,snapkv,,128,longbench,,qasper,1\n"); }, {"no rows for table 't1'"});
  // A run that overrides the budgets or the task options is checked for its methods only.
  check("t1,L,snapkv,,256,longbench,,lcc,1\n", {.budgets = false, .columns = false});
  check("t1,L,snapkv,window=8,128,longbench,,qasper,1\nt1,L,h2o,,128,longbench,,qasper,1\n", {.methods = false});
}

TEST_CASE("experiment specs: ${VAR}, --set overrides, max_new_tokens and published", "[published][experiment]") {
  const TempDir dir("spec_overrides");
  const std::string model = source_path("tests/test_published.cpp");  // the loader only checks it exists
  write_file(dir, "published.csv", kHeader + "s,L,fullkv,,full,niah,,score,90\n");
  const auto spec = write_file(dir, "s.yaml", R"(
model: ${KVB_TEST_MODEL}
task: niah
task_options: {s_len: 1000, e_len: 2000, step: 1000}
methods: [fullkv, snapkv]
budgets: [64]
published: published.csv
)");
  ::unsetenv("KVB_TEST_MODEL");
  require_error([&] { load_experiment(spec); }, {"s.yaml:2", "KVB_TEST_MODEL", "not set", "--model"});
  ::setenv("KVB_TEST_MODEL", model.c_str(), 1);
  ExperimentSpec s = load_experiment(spec);
  CHECK(s.model == model);
  CHECK(s.published == (dir / "published.csv").lexically_normal().string());
  CHECK(s.max_new_tokens == 0);
  CHECK(s.overridden.empty());
  ::unsetenv("KVB_TEST_MODEL");

  s = load_experiment(spec, {"model=" + model, "limit=2", "max_new_tokens=8", "budgets=[32, 128]",
                             "task_options.e_len=3000", "task_options.depths=[2, 4]"});
  CHECK(s.model == model);
  CHECK(s.limit == 2);
  CHECK(s.max_new_tokens == 8);
  CHECK(s.configs.size() == 1 + 2);
  REQUIRE(s.task_variants.size() == 2);
  CHECK(s.task_variants[0].at("e_len") == "3000");
  CHECK(s.task_variants[1].at("depths") == "4");
  CHECK(s.overridden == std::set<std::string>{"budgets", "limit", "max_new_tokens", "model", "task_options"});

  require_error([&] { load_experiment(spec, {"model=" + model, "limit"}); }, {"'limit'", "KEY=VALUE"});
  require_error([&] { load_experiment(spec, {"model=" + model, "limit=[1"}); }, {"not YAML"});
  require_error([&] { load_experiment(spec, {"model=" + model, "limit=abc"}); }, {"'limit' must be an integer"});
  // An overridden value has no place in the file: its errors name the override, not a line of the spec.
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "limit=-3"});
      },
      {"s.yaml: --set limit=-3: 'limit' must be at least 0"});
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "limt=3"});
      },
      {"s.yaml: --set limt=3: unknown key 'limt'"});
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "budgets=[32, 0]"});
      },
      {"s.yaml: --set budgets=[32, 0]: a budget must be a positive integer"});
  // Set inside an entry of the file, an error names the entry's line and the override.
  const auto mapped = write_file(dir, "m.yaml", "model: " + model + R"(
task: niah
methods: [{name: snapkv, params: {window: 8}}]
budgets: [64]
)");
  require_error([&] { load_experiment(mapped, {"methods.0.name=snapkvv"}); },
                {"m.yaml:3:11 (with --set methods.0.name=snapkvv): unknown method 'snapkvv'"});
  require_error([&] { load_experiment(mapped, {"methods.0.params.window=0"}); },
                {"(with --set methods.0.params.window=0)", "'window' = '0' is invalid"});
  require_error(
      [&] {
        load_experiment(mapped, {"methods.0={name: snapkv}", "methods.0.name=snapkvv"});
      },
      {"m.yaml: --set methods.0.name=snapkvv: unknown method 'snapkvv'"});
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "task.x=1"});
      },
      {"'task' is neither a mapping nor a list"});
  // In a list a key is an index: one method's parameter.
  s = load_experiment(spec,
                      {"model=" + model, "methods.1={name: snapkv, params: {window: 8}}", "methods.1.params.kernel=5"});
  REQUIRE(s.configs.size() == 2);
  CHECK(s.configs[1].params.at("window") == "8");
  CHECK(s.configs[1].params.at("kernel") == "5");
  CHECK(s.overridden.count("methods") == 1);
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "methods.2.params.window=8"});
      },
      {"'2' is not an index of the list's 2 entries"});
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "methods.99999999999999999999.x=1"});
      },
      {"is not an index of the list's 2 entries"});
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "methods.0.params.x=1"});
      },
      {"entry 0 of the list is 'fullkv', not a mapping", "methods.0={name: ..., params: {...}}"});
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "max_new_tokens=0"});
      },
      {"max_new_tokens", "at least 1"});
  require_error([&] { load_experiment(spec, {"model=" + model, "publshed=x.csv"}); }, {"unknown key 'publshed'"});
  require_error(
      [&] {
        load_experiment(spec, {"model=" + model, "published=none.csv"});
      },
      {"published table", "none.csv"});
}

TEST_CASE("report --compare: ours beside published, per cell and averaged, ambiguity refused", "[published][report]") {
  const TempDir dir("compare");
  std::ofstream records(dir / "r.jsonl");
  int id = 0;
  auto record = [&](json cfg, double score) {
    records << json{{"id", "s" + std::to_string(id++)}, {"config", std::move(cfg)}, {"score", score}}.dump() << "\n";
  };
  for (int i = 0; i < 5; ++i) {
    record(config("fullkv", 0, json::object(), "qasper"), 0.30);
    record(config("fullkv", 0, json::object(), "qasper"), 0.50);
  }
  record(config("fullkv", 0, json::object(), "trec"), 0.70);
  record(config("snapkv", 128, {{"window", "8"}}, "qasper"), 0.20);
  records.close();
  const auto published = write_file(dir, "published.csv",
                                    kHeader +
                                        "t1,Llama,fullkv,,full,longbench,,qasper,32.30\n"
                                        "t1,Llama,fullkv,,full,longbench,,trec,74.00\n"
                                        "t1,Llama,fullkv,,full,longbench,,avg,53.15\n"
                                        "t1,Llama,snapkv,window=8,128,longbench,,qasper,15.98\n"
                                        "t1,Llama,snapkv,window=8,128,longbench,,trec,65.50\n"
                                        "t1,Llama,snapkv,window=8,128,longbench,,avg,40.74\n"
                                        "t1,Mistral,fullkv,,full,longbench,,qasper,41.54\n");
  const std::string out = (dir / "out").string();
  write_comparison({(dir / "r.jsonl").string()}, published, "", "", out, {"md", "csv"});
  const auto cells = read_csv_rows(out + "/compare-t1-cells.csv");
  // table,model,method,params,budget,task,length,column,published,ours,ci_low,ci_high,samples,difference,
  // published_inside,coverage
  REQUIRE(cells.size() == 1 + 6);  // the first model the table lists
  auto find = [&](const std::string& method, const std::string& column) {
    for (const auto& c : cells)
      if (c[2] == method && c[7] == column) return c;
    FAIL("no cell " << method << " " << column);
    return std::vector<std::string>{};
  };
  CHECK(find("fullkv", "qasper")[9] == "40.0000");  // mean of five 30s and five 50s
  // The resampled means are 0.3 + 0.02 k for k ~ Binomial(10, 1/2), whose 2.5% and 97.5% points are
  // k = 2 and 8 (P(k <= 1) = 1.1%, P(k <= 2) = 5.5%).
  CHECK(find("fullkv", "qasper")[10] == "34.0000");
  CHECK(find("fullkv", "qasper")[11] == "46.0000");
  CHECK(find("fullkv", "qasper")[12] == "10");
  CHECK(find("fullkv", "qasper")[13] == "7.7000");
  CHECK(find("fullkv", "qasper")[14] == "no");   // 32.30 published lies outside [34, 46]
  CHECK(find("fullkv", "avg")[10].empty());      // an average over columns has no interval of ours
  CHECK(find("fullkv", "avg")[9] == "55.0000");  // (40 + 70) / 2
  CHECK(find("snapkv", "trec")[9].empty());      // not run: no number of ours
  CHECK(find("snapkv", "avg")[9] == "20.0000");  // over the one column we have
  // Found by an audit: a partial average was subtracted from the paper's full one.
  CHECK(find("snapkv", "avg")[13].empty());
  CHECK(find("snapkv", "avg")[15] == "1/2");
  CHECK(find("fullkv", "avg")[13] == "1.8500");
  std::stringstream md;
  md << std::ifstream(out + "/compare-t1.md").rdbuf();
  CHECK(md.str().find("20.00 (1/2)") != std::string::npos);
  CHECK(md.str().find("| FullKV | 40.00 [34.00, 46.00] |") != std::string::npos);
  CHECK(md.str().find("3 of 4 published cells have ours") != std::string::npos);  // the averages aside
  // Our model (m.gguf) is not the paper's: no value is marked as inside our interval.
  CHECK(md.str().find("(in)") == std::string::npos);
  CHECK(md.str().find("Our model is not the paper's") != std::string::npos);
  CHECK(md.str().find("snapkv (window=8), published") != std::string::npos);
  CHECK(std::filesystem::exists(out + "/compare-t1.png"));
  CHECK(std::filesystem::exists(out + "/compare-t1.svg"));

  write_comparison({(dir / "r.jsonl").string()}, published, "t1", "Mistral", out, {"md"});
  CHECK(read_csv_rows(out + "/compare-t1-cells.csv").size() == 1 + 1);
  require_error([&] { write_comparison({(dir / "r.jsonl").string()}, published, "t1", "Qwen", out, {"md"}); },
                {"--published-model Qwen", "Llama, Mistral"});
  require_error([&] { write_comparison({(dir / "r.jsonl").string()}, published, "t7", "", out, {"md"}); },
                {"--table t7", "t1"});
  // Without --table, a table none of our records reach is not written (with none reached, a warning).
  const auto two = write_file(dir, "two.csv",
                              kHeader +
                                  "t1,Llama,fullkv,,full,longbench,,qasper,32.30\n"
                                  "t2,Llama,fullkv,,full,niah,,score,100\n");
  write_comparison({(dir / "r.jsonl").string()}, two, "", "", (dir / "two").string(), {"md"});
  CHECK(std::filesystem::exists(dir / "two" / "compare-t1.md"));
  CHECK_FALSE(std::filesystem::exists(dir / "two" / "compare-t2.md"));
  // A table of averages alone: ours over the task's columns our records hold ((40 + 70) / 2 for FullKV).
  const auto avg_only = write_file(dir, "avg.csv", kHeader + "ta,Llama,fullkv,,full,longbench,,avg,50\n");
  write_comparison({(dir / "r.jsonl").string()}, avg_only, "", "", (dir / "avg").string(), {"md", "csv"});
  const auto avg_cells = read_csv_rows((dir / "avg" / "compare-ta-cells.csv").string());
  REQUIRE(avg_cells.size() == 2);
  CHECK(avg_cells[1][9] == "55.0000");
  std::stringstream avg_md;
  avg_md << std::ifstream(dir / "avg" / "compare-ta.md").rdbuf();
  CHECK(avg_md.str().find("55.00 (over 2 of ours)") != std::string::npos);
  CHECK(avg_md.str().find("1 of 1 published cells have ours") != std::string::npos);
  const auto none = write_file(dir, "none.csv", kHeader + "t2,Llama,fullkv,,full,niah,,score,100\n");
  write_comparison({(dir / "r.jsonl").string()}, none, "", "", (dir / "none").string(), {"md"});
  CHECK_FALSE(std::filesystem::exists(dir / "none" / "compare-t2.md"));
  // The same errors before anything is written (kvbench report checks first).
  require_error([&] { check_comparison(published, "t1", "Qwen"); }, {"--published-model Qwen", "Llama, Mistral"});
  require_error([&] { check_comparison(published, "t7", ""); }, {"--table t7", "t1"});
  check_comparison(published, "t1", "Mistral");

  // Two of our configurations under one published row: a mean of both would be neither's.
  std::ofstream(dir / "r.jsonl", std::ios::app)
      << json{{"id", "x"},
              {"config", config("snapkv", 128, {{"window", "8"}, {"kernel", "5"}}, "qasper")},
              {"score", 0.9}}
             .dump()
      << "\n";
  require_error([&] { write_comparison({(dir / "r.jsonl").string()}, published, "", "", out, {"md"}); },
                {"published.csv:5", "matches 2 configurations"});

  // Found by a review: two NIAH runs over overlapping grids (depths 3, then 5) were two configurations
  // (refused); as in the report's tables they are one, and the three depths they share count once.
  std::ofstream niah(dir / "niah.jsonl");
  for (const auto& [depths, scores] : std::vector<std::pair<std::string, std::vector<std::pair<int, double>>>>{
           {"3", {{0, 1}, {50, 1}, {100, 1}}}, {"5", {{0, 1}, {25, 0}, {50, 1}, {75, 0}, {100, 1}}}})
    for (const auto& [depth, score] : scores)
      niah << json{{"id", fmt::format("L1000_d{}", depth)},
                   {"config",
                    {{"task", "niah"},
                     {"options", {{"s_len", "1000"}, {"e_len", "1000"}, {"depths", depths}}},
                     {"model", "m.gguf"},
                     {"method", "fullkv"},
                     {"budget", 0},
                     {"params", json::object()},
                     {"gqa", "-"}}},
                   {"score", score}}
                  .dump()
           << "\n";
  niah.close();
  write_comparison({(dir / "niah.jsonl").string()}, two, "t2", "", (dir / "niah").string(), {"csv"});
  const auto niah_cells = read_csv_rows((dir / "niah" / "compare-t2-cells.csv").string());
  REQUIRE(niah_cells.size() == 2);
  CHECK(niah_cells[1][9] == "60.0000");  // 3 of the 5 distinct needles, not 6 of 8
  CHECK(niah_cells[1][12] == "5");
}

// The MixedDimKV paper's Table 2, Llama-3-8B-Instruct blocks, as printed (arXiv:2603.20616): the
// published.csv the paper specs carry must hold exactly these numbers.
TEST_CASE("report --compare: our model file is the paper's model only by its whole name", "[published][report]") {
  // Found by an independent check: a substring test took an Instruct model for its base model.
  CHECK(names_model("Meta-Llama-3-8B-Instruct.Q4_K_M.gguf", "Llama-3-8B-Instruct"));
  CHECK(names_model("/models/Llama-3.1-8B-Instruct", "llama-3.1-8b-instruct"));
  CHECK(names_model("SmolLM2-135M-Instruct.Q4_1.gguf", "SmolLM2-135M-Instruct"));
  CHECK(names_model("mistral-7b-instruct-v0.2.f16.gguf", "Mistral-7B-Instruct-v0.2"));
  CHECK(names_model("qwen3-8b-iq2_xs.gguf", "Qwen3-8B"));
  CHECK(names_model("mistral-7b-instruct-v0.2.Q4_K_M.gguf", "Mistral-7B-Instruct"));  // the papers' name
  CHECK(names_model("Llama-3-8B-Instruct-Q4_K_M-00001-of-00002.gguf", "Llama-3-8B-Instruct"));
  CHECK_FALSE(names_model("Meta-Llama-3-8B-Instruct.Q4_K_M.gguf", "Llama-3-8B"));
  CHECK_FALSE(names_model("Llama-3.1-8B", "Llama-3-8B"));
  CHECK_FALSE(names_model("MyLlama-3-8B", "Llama-3-8B"));
  CHECK_FALSE(names_model("Qwen3-8B-iq", "Qwen3-8B"));
  CHECK_FALSE(names_model("m.gguf", ""));
}

TEST_CASE("published numbers: MixedDimKV Table 2, Llama-3 rows, transcribed exactly", "[published]") {
  std::vector<std::string> columns = test::longbench_english();
  columns.push_back("avg");
  const std::string paper =
      R"(128 fullkv 25.56 32.30 39.71 43.56 35.49 21.14 28.58 23.22 26.67 74.00 90.48 42.29 4.80 69.75 59.13 54.02 41.92
128 h2o 23.52 13.74 25.26 29.07 22.72 14.67 21.94 21.34 24.01 46.50 87.99 35.12 5.36 68.21 54.77 48.73 33.93
128 snapkv 22.39 15.98 30.97 40.78 28.60 19.35 19.76 21.88 21.40 65.50 89.72 38.77 5.75 69.00 58.76 54.73 37.71
128 pyramidkv 21.40 16.92 31.62 38.45 28.72 18.59 19.97 22.48 20.96 66.50 89.35 38.39 5.92 69.00 57.86 51.80 37.37
128 mixeddimkv 25.22 29.07 38.30 43.20 33.84 19.58 24.53 23.12 26.03 72.00 90.61 42.16 5.54 69.50 59.32 55.16 41.07
512 h2o 23.76 21.56 31.57 40.54 30.36 17.79 24.89 22.15 25.74 69.00 90.67 40.33 6.05 68.07 61.00 56.26 39.36
512 snapkv 25.53 23.59 38.58 43.78 33.33 19.85 23.10 22.52 24.19 71.00 90.57 40.48 5.51 69.50 61.10 57.23 40.62
512 pyramidkv 24.83 23.33 35.20 43.29 31.87 20.55 23.43 22.80 24.29 71.50 90.61 40.81 5.91 69.50 59.60 54.71 40.14
512 mixeddimkv 25.56 32.11 39.71 43.56 35.55 21.18 28.66 23.29 26.70 73.50 90.48 42.47 4.80 69.25 59.15 54.13 41.88
)";
  std::map<std::tuple<std::string, std::string, std::string>, double> want;  // (method, budget, column)
  std::istringstream in(paper);
  std::string budget, method;
  while (in >> budget >> method) {
    for (const auto& c : columns) {
      double v = 0;
      in >> v;
      want[{method, method == "fullkv" ? "full" : budget, c}] = v;
    }
  }
  REQUIRE(want.size() == 9 * columns.size());
  std::map<std::tuple<std::string, std::string, std::string>, double> got;
  for (const auto& r : load_published(source_path("experiments/papers/mixeddimkv/published.csv"))) {
    if (r.table != "table2_longbench" || r.model != "Llama-3-8B-Instruct") continue;
    const std::string b = r.budget.is_full() ? "full" : std::to_string(r.budget.tokens);
    INFO(r.method << " " << b << " " << r.column << " (line " << r.line << ")");
    CHECK(got.emplace(std::tuple(r.method, b, r.column), r.score).second);  // each cell once
  }
  CHECK(got == want);
}

TEST_CASE("sweeps: a prompt longer than the model's context is an error before any cell runs", "[published][model]") {
  const auto model = model_file(kDefaultModel);
  if (!model || !setup_data("PaulGrahamEssays")) return;
  const TempDir dir("context_check");
  const auto spec = write_file(dir, "long.yaml", "model: " + *model + R"(
task: niah
task_options: {s_len: 9000, e_len: 9000, depths: 1}
methods: [fullkv]
)" + "out: " + (dir / "r.jsonl").string() + "\n");
  require_error([&] { Sweep sweep(load_experiment(spec)); }, {"long.yaml", "context of 8192 tokens", "longer context"});
  CHECK(!std::filesystem::exists(dir / "r.jsonl"));
}

TEST_CASE("KVCrush*: per column the best of our kvcrush configurations, as the paper derives it",
          "[published][report]") {
  const TempDir dir("compare_best_of");
  std::ofstream records(dir / "r.jsonl");
  int id = 0;
  auto record = [&](const std::string& base, const std::string& dataset, double score) {
    records << json{{"id", "s" + std::to_string(id++)},
                    {"config", config("kvcrush", 2048, {{"base", base}, {"ratio", "0.25"}}, dataset)},
                    {"score", score}}
                   .dump()
            << "\n";
  };
  // qasper: snapkv's configuration is best (mean 0.5); trec: h2o's (0.8).
  record("h2o", "qasper", 0.2);
  record("h2o", "qasper", 0.4);
  record("snapkv", "qasper", 0.5);
  record("snapkv", "qasper", 0.5);
  record("h2o", "trec", 0.8);
  record("snapkv", "trec", 0.6);
  records.close();
  const auto published = write_file(dir, "published.csv",
                                    kHeader +
                                        "t3,L,kvcrush*,,2048,longbench,,qasper,31.00\n"
                                        "t3,L,kvcrush*,,2048,longbench,,trec,71.00\n"
                                        "t3,L,kvcrush*,,2048,longbench,,avg,51.00\n");
  const std::string out = (dir / "out").string();
  write_comparison({(dir / "r.jsonl").string()}, published, "", "", out, {"md"});
  const auto cells = read_csv_rows(out + "/compare-t3-cells.csv");
  REQUIRE(cells.size() == 1 + 3);
  CHECK(cells[1][9] == "50.0000");  // qasper: the better of 30 (h2o) and 50 (snapkv)
  CHECK(cells[1][10].empty());      // no interval for a best of several means
  CHECK(cells[1][12] == "2");
  CHECK(cells[2][9] == "80.0000");  // trec: h2o's
  CHECK(cells[3][9] == "65.0000");  // the Average: the mean of the per-column bests
  // The spec check: a derived row needs the configurations it is the best of.
  const std::vector<std::map<std::string, std::string>> variants = {{{"dataset", "qasper"}, {"max_len", "7950"}}};
  const std::vector<json> with = {config("kvcrush", 2048, {{"base", "h2o"}}, "qasper")},
                          without = {config("snapkv", 2048, json::object(), "qasper")};
  const auto rows = load_published(write_file(dir, "p.csv", kHeader + "t3,L,kvcrush*,,2048,longbench,,qasper,31\n"));
  check_published(rows, "t3", "spec.yaml", "longbench", with, variants, {});
  require_error([&] { check_published(rows, "t3", "spec.yaml", "longbench", without, variants, {}); },
                {"p.csv:2", "kvcrush*", "does not run method kvcrush"});
  require_error(
      [&] {
        check_published(
            load_published(write_file(dir, "q.csv", kHeader + "t3,L,kvcrush*,base=h2o,2048,longbench,,qasper,31\n")),
            "t3", "spec.yaml", "longbench", with, variants, {});
      },
      {"q.csv:2", "derived from the kvcrush rows lists no parameters"});
}

// VECTOR's KeyDiff blocks of Table 2 and Appendix Table 3 (Qwen3-0.6B, whose labels the paper shifts by one
// block), read from the paper's tab-separated rows: each row's average equals the mean of its 16 cells, and
// the numbers the paper's text and Table 5 quote sit where they belong.
TEST_CASE("published numbers: VECTOR's KeyDiff rows and Appendix Table 3", "[published]") {
  using Key = std::tuple<std::string, std::string, std::string, std::string, std::string, std::string>;
  std::map<Key, double> cell;  // (table, model, method, params, budget, column)
  std::map<std::tuple<std::string, std::string, std::string, std::string, std::string>, std::vector<double>> rows;
  for (const auto& r : load_published(source_path("experiments/papers/vector/published.csv"))) {
    const std::string b = budget_text(r.budget), params = params_text(r.params);
    cell[{r.table, r.model, r.method, params, b, r.column}] = r.score;
    if (r.column != "avg") rows[{r.table, r.model, r.method, params, b}].push_back(r.score);
  }
  size_t checked = 0;
  for (const auto& [k, v] : rows) {
    const auto& [table, model, method, params, b] = k;
    // The KeyDiff blocks and Appendix Table 3; `report --coverage` lists the printed averages elsewhere
    // that differ from their cells.
    if (table != "table2_longbench_keydiff" && table.rfind("appendix_table3_longbench", 0) != 0) continue;
    if (method == "kvzip" || params == "base=kvzip") continue;
    INFO(table << " " << model << " " << method << " " << params << " " << b);
    REQUIRE(v.size() == 16);
    const double mean = std::accumulate(v.begin(), v.end(), 0.0) / 16;
    CHECK(std::abs(mean - cell.at({table, model, method, params, b, "avg"})) <= 0.006);
    ++checked;
  }
  CHECK(checked == 16 + 8 + 1 + 16);  // Table 2 KeyDiff blocks, Table 3 KeyDiff blocks, its No Comp., the rest
  auto avg = [&](const std::string& table, const std::string& model, const std::string& method,
                 const std::string& params) {
    std::vector<double> out;
    for (const char* b : {"r0.25", "r0.5", "r0.75", "r0.9"})
      out.push_back(cell.at({table, model, method, params, b, "avg"}));
    return out;
  };
  const std::string t2 = "table2_longbench_keydiff", t3 = "appendix_table3_longbench";
  CHECK(avg(t2, "Llama-3.1-8B-Instruct", "keydiff", "") == std::vector<double>{47.70, 46.15, 41.65, 35.28});
  CHECK(avg(t2, "Llama-3.1-8B-Instruct", "vector", "base=keydiff") == std::vector<double>{46.16, 47.68, 44.86, 38.75});
  CHECK(avg(t2, "Qwen3-14B", "keydiff", "") == std::vector<double>{46.61, 40.72, 32.23, 22.71});
  CHECK(avg(t2, "Qwen3-14B", "vector", "base=keydiff") == std::vector<double>{49.48, 47.75, 41.38, 32.44});
  CHECK(avg(t3, "Qwen3-0.6B", "snapkv", "") == std::vector<double>{30.80, 31.18, 31.05, 29.85});
  CHECK(avg(t3, "Qwen3-0.6B", "vector", "base=snapkv") == std::vector<double>{30.99, 30.47, 30.96, 31.48});
  CHECK(cell.at({t3, "Qwen3-0.6B", "fullkv", "", "full", "avg"}) == 30.93);
  // Table 5 (Llama-3.1-8B-Instruct, p_c 0.9) repeats Table 2's KeyDiff cells.
  for (const auto& [method, params, want] :
       {std::tuple{"keydiff", "", std::vector<double>{17.00, 40.03, 26.18, 16.01}},
        std::tuple{"vector", "base=keydiff", std::vector<double>{23.96, 49.88, 30.72, 20.72}}}) {
    std::vector<double> got;
    for (const char* c : {"qasper", "hotpotqa", "2wikimqa", "musique"})
      got.push_back(cell.at({t2, "Llama-3.1-8B-Instruct", method, params, "r0.9", c}));
    CHECK(got == want);
  }
}
