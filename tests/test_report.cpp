// Reports: the papers' table layouts (LongBench categories over datasets, RULER per length and across
// lengths), method x KV size tables and heatmaps, the three table formats, directory inputs.
#include <filesystem>
#include <fstream>
#include <functional>
#include <nlohmann/json.hpp>

#include "harness/report/paired.hpp"
#include "harness/report/report.hpp"
#include "harness/report/table.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;
using nlohmann::json;

namespace {

json record(const std::string& task, json options, const std::string& method, int budget, double score,
            const std::string& prediction = "x") {
  static int serial = 0;  // each record its own cell, as samples are
  return {{"config",
           {{"task", task},
            {"options", options},
            {"method", method},
            {"budget", budget},
            {"gqa", "native"},
            {"params", json::object()},
            {"model", "m.gguf"},
            {"version", "test"}}},
          {"key", fmt::format("{}-{}-{}-{}-{}", task, options.dump(), method, budget, ++serial)},
          {"score", score},
          {"prediction", prediction},
          {"kv_bytes", budget ? 25 : 100},
          {"full_kv_bytes", 100}};
}

std::string read(const std::filesystem::path& p) {
  std::ifstream in(p);
  REQUIRE(in.good());
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

}  // namespace

TEST_CASE("reports: LongBench and RULER in the papers' layouts, method x KV size, formats", "[report]") {
  const TempDir dir("report");
  std::filesystem::create_directories(dir / "runs");
  {
    std::ofstream out(dir / "runs" / "a.jsonl");
    // LongBench: three datasets in two categories; snapkv listed before the full cache on purpose.
    for (const auto& [ds, full, snap] :
         {std::tuple{"qasper", 0.40, 0.30}, {"multifieldqa_en", 0.50, 0.45}, std::tuple{"hotpotqa", 0.30, 0.20}}) {
      out << record("longbench", {{"dataset", ds}}, "snapkv", 128, snap).dump() << "\n";
      out << record("longbench", {{"dataset", ds}}, "fullkv", 0, full).dump() << "\n";
    }
    // LongBench-E: two datasets, records in two length ranges.
    for (const auto& [ds, len, score] : {std::tuple{"qasper", 3000, 0.6},
                                         {"qasper", 9000, 0.2},
                                         std::tuple{"hotpotqa", 3500, 0.4},
                                         {"hotpotqa", 3900, 0.2}}) {
      json r = record("longbench-e", {{"dataset", ds}}, "fullkv", 0, score);
      r["meta"] = {{"length", len}};
      out << r.dump() << "\n";
    }
    // RULER: two tasks at two lengths, two samples each (one empty prediction).
    for (int L : {4096, 8192})
      for (const char* t : {"vt", "niah_single_1"}) {
        out << record("ruler", {{"task", t}, {"length", std::to_string(L)}}, "fullkv", 0, 1.0).dump() << "\n";
        out << record("ruler", {{"task", t}, {"length", std::to_string(L)}}, "fullkv", 0,
                      std::string(t) == "vt" ? 0.0 : 1.0,
                      std::string(t) != "vt" ? "x"
                      : L == 4096            ? " "
                                             : "\x01 \x02")
                   .dump()
            << "\n";
      }
  }
  write_report({(dir / "runs").string()}, (dir / "rep").string(), {"md", "csv", "tex"});
  const auto rep = dir / "rep";
  const std::string lb = read(rep / "longbench.md");
  INFO(lb);
  // Categories head the columns; the dataset names open the body, in the papers' order.
  CHECK(lb.find("| Method | Single-Doc QA |  | Multi-Doc QA | Avg. | Bits |") != std::string::npos);
  CHECK(lb.find("|  | Qasper | MF-en | HotpotQA |  |  |") != std::string::npos);
  // One block per KV size, the full cache first; Avg. is the mean of the datasets shown; Bits counts
  // the fp32 full cache as 32 bits per element.
  const size_t block = lb.find("*KV size = 128*"), full = lb.find("| FullKV | 40.00 | 50.00 | 30.00 | 40.00 | 32.00 |"),
               snap = lb.find("| snapkv | 30.00 | 45.00 | 20.00 | 31.67 | 8.00 |");
  CHECK(block < full);
  CHECK(full < snap);
  CHECK(snap != std::string::npos);
  const std::string tex = read(rep / "longbench.tex");
  CHECK(tex.find("\\multicolumn{2}{c}{Single-Doc QA} & \\multicolumn{1}{c}{Multi-Doc QA}") != std::string::npos);
  CHECK(tex.find("\\cmidrule(lr){2-3}\\cmidrule(lr){4-4}") != std::string::npos);
  CHECK(read(rep / "longbench.csv")
            .find("block,Method,Single-Doc QA/Qasper,Single-Doc QA/MF-en,Multi-Doc QA/HotpotQA,Avg.,Bits") == 0);
  // LongBench-E per length range: the mean of the datasets' means (qasper 0.6, hotpotqa 0.3 below 4k).
  const std::string lbe = read(rep / "longbench-e-lengths.md");
  INFO(lbe);
  CHECK(lbe.find("| Method | 0-4k | 4-8k | 8k+ | Avg. |") != std::string::npos);
  CHECK(lbe.find("| FullKV | 45.00 | - | 20.00 | 32.50 |") != std::string::npos);
  // RULER per length: tasks in the papers' order (S1 before VT), Nulls counts empty predictions.
  const std::string r4 = read(rep / "ruler-4096.md");
  INFO(r4);
  CHECK(r4.find("| Method | S1 | VT | Avg. | Nulls | Bits |") != std::string::npos);
  CHECK(r4.find("| FullKV | 100.00 | 50.00 | 75.00 | 1 | 32.00 |") != std::string::npos);
  CHECK(read(rep / "ruler-lengths.md").find("| FullKV | 75.00 | 75.00 | 75.00 |") != std::string::npos);
  // Found by an audit: RULER counts a prediction of control characters as empty.
  CHECK(read(rep / "ruler-8192.md").find("| FullKV | 100.00 | 50.00 | 75.00 | 1 | 32.00 |") != std::string::npos);
  // Method x KV size, with the share of the full cache kept (and of a full fp16 cache: these fp32
  // records hold twice its bytes), its heatmap and the score-memory plot.
  CHECK(read(rep / "longbench-method-budget.md").find("| snapkv | - | 31.67 (25.0%, 50.0% fp16, n=3) |") !=
        std::string::npos);
  CHECK(read(rep / "longbench-memory.csv").find("snapkv,0.500000,0.3167") != std::string::npos);
  // The table's CSV and the heatmap's cells are separate files.
  CHECK(read(rep / "longbench-method-budget.csv").find("31.67 (25.0%, 50.0% fp16, n=3)") != std::string::npos);
  CHECK(read(rep / "longbench-method-budget-cells.csv").find("snapkv,,0.3167") != std::string::npos);
  for (const char* f : {"longbench-method-budget.png", "longbench-method-budget.svg", "ruler-method-budget.png",
                        "longbench-memory.png", "longbench-memory.svg"})
    CHECK(std::filesystem::file_size(rep / f) > 2000);
  CHECK(read(rep / "ruler-4096.tex").find("string\\_match\\_all") != std::string::npos);
  require_error([&] { write_report({(dir / "runs").string()}, (rep).string(), {"html"}); }, {"html", "md, csv or tex"});
  require_error([&] { write_report({(dir / "nope.jsonl").string()}, rep.string()); }, {"nope.jsonl", "not found"});
}

TEST_CASE("a method x KV size cell of one record per sample gives the summary's interval", "[report]") {
  // Both resample the same samples; the cell took them sorted by id, the summary in the records' order,
  // so one report printed two intervals for one cell.
  const TempDir dir("report_same_interval");
  {
    std::ofstream out(dir / "r.jsonl");
    for (int i = 0; i < 14; ++i) {
      json r = record("longbench", {{"dataset", "qasper"}}, "snapkv", 64, 0.05 * ((i * 7) % 13));
      r["id"] = "s" + std::to_string(14 - i);  // ids out of order: s14, s13, ..., s1
      out << r.dump() << "\n";
    }
  }
  write_report({(dir / "r.jsonl").string()}, (dir / "rep").string(), {"md"});
  const std::string summary = read(dir / "rep" / "summary.md"), cell = read(dir / "rep" / "longbench-method-budget.md");
  INFO(summary << cell);
  // summary: | ... | samples | score | ci_low | ci_high | ...; the cell: score [low, high]
  const size_t row = summary.find("| longbench |");
  REQUIRE(row != std::string::npos);
  std::vector<std::string> fields;
  for (size_t at = row + 1, bar; (bar = summary.find('|', at)) != std::string::npos && summary[at] != '\n';
       at = bar + 1)
    fields.push_back(summary.substr(at + 1, bar - at - 2));
  REQUIRE(fields.size() > 10);
  CHECK(cell.find(fmt::format("{} [{}, {}]", fields[8], fields[9], fields[10])) != std::string::npos);
}

TEST_CASE("tables: a cell's | and line breaks stay in its Markdown cell, CSV quotes what it must", "[report]") {
  Table t;
  t.columns = {"method", "score"};
  t.blocks.push_back({"", {{"jsonl(template=a|b\nc)", "1.0"}, {"x,\"y\"", "2.0"}}});
  const std::string md = to_markdown(t);
  CHECK(md.find("| jsonl(template=a\\|b<br>c) | 1.0 |") != std::string::npos);
  const std::string csv = to_csv(t);
  CHECK(csv.find("\"jsonl(template=a|b\nc)\",1.0") != std::string::npos);
  CHECK(csv.find("\"x,\"\"y\"\"\",2.0") != std::string::npos);
}

TEST_CASE("reports: a method's rows name only the parameters that differ between its settings", "[report]") {
  const TempDir dir("report_labels");
  {
    std::ofstream out(dir / "a.jsonl");
    for (const char* base : {"h2o", "snapkv"}) {
      json r = record("ruler", {{"task", "vt"}, {"length", "4096"}}, "kvcrush", 64, 1.0);
      r["config"]["params"] = {{"base", base}, {"base.window", "32"}, {"ratio", "0.25"}};
      r["key"] = std::string("k-") + base;
      out << r.dump() << "\n";
    }
    out << record("ruler", {{"task", "vt"}, {"length", "4096"}}, "snapkv", 64, 0.0).dump() << "\n";
    // Settings that differ only in the GQA mode: each row names its mode (one label for both, before).
    for (const char* gqa : {"native", "repeat"}) {
      json r = record("ruler", {{"task", "vt"}, {"length", "4096"}}, "h2o", 64, 0.5);
      r["config"]["gqa"] = gqa;
      out << r.dump() << "\n";
    }
  }
  write_report({dir.path().string()}, (dir / "rep").string(), {"md"});
  const std::string t = read(dir / "rep" / "ruler-method-budget.md");
  INFO(t);
  CHECK(t.find("| kvcrush (base=h2o) |") != std::string::npos);
  CHECK(t.find("| kvcrush (base=snapkv) |") != std::string::npos);
  CHECK(t.find("| snapkv |") != std::string::npos);
  CHECK(t.find("| h2o (gqa=native) |") != std::string::npos);
  CHECK(t.find("| h2o (gqa=repeat) |") != std::string::npos);
}

TEST_CASE("reports: parameters as text leave out empty ones (a default file)", "[report]") {
  CHECK(params_text({{"index", ""}, {"keeper", "128"}, {"wbits", "4"}}) == "keeper=128 wbits=4");
  CHECK(params_text({{"index", ""}}) == "-");
}

TEST_CASE("reports: compression-ratio runs get their own columns and blocks beside KV sizes", "[report]") {
  const TempDir dir("report_ratios");
  {
    std::ofstream out(dir / "a.jsonl");
    out << record("longbench", {{"dataset", "multi_news"}}, "fullkv", 0, 0.30).dump() << "\n";
    out << record("longbench", {{"dataset", "multi_news"}}, "snapkv", 128, 0.20).dump() << "\n";
    for (const auto& [p, score] : {std::pair{0.5, 0.28}, {0.9, 0.10}}) {
      json r = record("longbench", {{"dataset", "multi_news"}}, "snapkv", 0, score);
      r["config"]["compression_ratio"] = p;
      r["key"] = fmt::format("r{}", p);
      r["kv_bytes"] = 100 * (1 - p);
      out << r.dump() << "\n";
    }
  }
  write_report({dir.path().string()}, (dir / "rep").string(), {"md"});
  const std::string mb = read(dir / "rep" / "longbench-method-budget.md");
  INFO(mb);
  CHECK(mb.find("| Method | Full | p_c=0.5 | p_c=0.9 | 128 |") != std::string::npos);
  CHECK(mb.find("| snapkv | - | 28.00 (50.0%, 100.0% fp16, n=1) | 10.00 (10.0%, 20.0% fp16, n=1) | 20.00 (25.0%, 50.0% "
                "fp16, n=1) |") != std::string::npos);
  const std::string lb = read(dir / "rep" / "longbench.md");
  CHECK(lb.find("Compression ratio = 0.9") != std::string::npos);
  CHECK(lb.find("KV size = 128") != std::string::npos);
}

TEST_CASE("reports: a cell recorded twice counts once, a disagreeing copy is an error", "[report]") {
  const TempDir dir("report_dups");
  json a = record("longbench", {{"dataset", "multi_news"}}, "snapkv", 128, 0.20);
  a["key"] = "k1";
  json b = record("longbench", {{"dataset", "multi_news"}}, "snapkv", 128, 0.40);
  b["key"] = "k2";
  {
    std::ofstream out(dir / "a.jsonl");
    out << a.dump() << "\n" << b.dump() << "\n" << a.dump() << "\n";
  }
  write_report({(dir / "a.jsonl").string()}, (dir / "rep").string(), {"md"});
  const std::string mb = read(dir / "rep" / "longbench-method-budget.md");
  INFO(mb);
  CHECK(mb.find("| snapkv | 30.00") != std::string::npos);  // (20 + 40) / 2, not (20 + 40 + 20) / 3
  a["score"] = 0.9;
  {
    std::ofstream out(dir / "a.jsonl", std::ios::app);
    out << a.dump() << "\n";
  }
  test::require_error([&] { write_report({(dir / "a.jsonl").string()}, (dir / "rep").string(), {"md"}); },
                      {"a.jsonl:4", "cell k1", "score 0.9"});
}

TEST_CASE("reports: fp16 records and a method without a budget on one memory axis", "[report][kv_dtype]") {
  const TempDir dir("report_fp16");
  {
    std::ofstream out(dir / "a.jsonl");
    for (const auto& [method, score, kept] : {std::tuple{"fullkv", 0.5, 100}, {"kvmix", 0.4, 22}}) {
      json r = record("longbench", {{"dataset", "qasper"}}, method, 0, score);
      r["config"]["kv_dtype"] = "fp16";
      r["kv_dtype"] = "fp16";
      r["kv_bytes"] = kept;
      r["prompt_tokens"] = 1000;
      out << r.dump() << "\n";
    }
    // The same full cache at fp32: its own row, twice the fp16 bytes.
    json r = record("longbench", {{"dataset", "qasper"}}, "fullkv", 0, 0.5);
    r["kv_bytes"] = r["full_kv_bytes"] = 200;
    r["prompt_tokens"] = 1000;
    out << r.dump() << "\n";
  }
  write_report({dir.path().string()}, (dir / "rep").string(), {"md"});
  const std::string lb = read(dir / "rep" / "longbench.md");
  INFO(lb);
  CHECK(lb.find("| FullKV [fp16] | 50.00 | 50.00 | 16.00 |") != std::string::npos);
  CHECK(lb.find("| FullKV | 50.00 | 50.00 | 32.00 |") != std::string::npos);
  CHECK(lb.find("| kvmix [fp16] | 40.00 | 40.00 | 3.52 |") != std::string::npos);
  const std::string s = read(dir / "rep" / "summary.md");
  INFO(s);
  // KV kept, vs fp16 full, bits per element, T_eq (fp16 token units of the 1,000-token prompt).
  CHECK(s.find("| kvmix | Full | fp16 | native | - | 1 | 40.00 | - | - | 22.0% | 22.0% | 3.52 | 220 |") !=
        std::string::npos);
  CHECK(s.find("| fullkv | Full | fp32 | native | - | 1 | 50.00 | - | - | 100.0% | 200.0% | 32.00 | 2000 |") !=
        std::string::npos);
  const std::string mem = read(dir / "rep" / "longbench-memory.csv");
  CHECK(mem.find("kvmix [fp16],0.220000,0.4000") != std::string::npos);
}

TEST_CASE("reports: records of the wrong shape are errors naming the line and field", "[report]") {
  const TempDir dir("report_shapes");
  auto report_of = [&](const std::string& line) {
    {
      std::ofstream out(dir / "r.jsonl");
      out << line << "\n";
    }
    write_report({(dir / "r.jsonl").string()}, (dir / "rep").string(), {"md"});
  };
  test::require_error([&] { report_of("[1]"); }, {"r.jsonl:1", "a JSON object expected"});
  test::require_error([&] { report_of(R"({"score": 1})"); }, {"r.jsonl:1", "field 'config' is missing"});
  test::require_error([&] { report_of(R"({"config": {}, "score": "1"})"); }, {"'score' must be a number"});
  test::require_error([&] { report_of(R"({"config": {"options": {"length": 4096}}, "score": 1})"); },
                      {"'config.options' must be an object of text values"});
  test::require_error([&] { report_of(R"({"config": {"task": "niah"}, "score": 1, "meta": {"depth": "5"}})"); },
                      {"'meta.depth' must be an integer"});
  test::require_error([&] { report_of(R"({"config": {"task": "ruler", "options": {"length": "4k"}}, "score": 1})"); },
                      {"r.jsonl:1", "'config.options.length' must be a positive whole number", "'4k'"});
  // Found by fuzz/results: a parameter value holding '|' broke the report's label, which kept the
  // parameters as text split at that character.
  report_of(R"({"config": {"task": "niah", "method": "snapkv", "params": {"pooling": "max|avg"}}, "score": 1})");
  CHECK(read(dir / "rep" / "summary.md").find("pooling=max\\|avg") != std::string::npos);
  // Found by fuzz/results: a NIAH record with a depth but no length read a missing key.
  report_of(R"({"config": {"task": "niah", "method": "fullkv"}, "score": 1, "meta": {"depth": 0}})");
  // Found by fuzz/results: a config without options made the report throw a JSON library exception.
  report_of(R"({"config": {"task": "niah", "method": "fullkv"}, "score": 1, "meta": {"depth": 0, "length": 1000}})");
  CHECK(std::filesystem::exists(dir / "rep" / "summary.md"));
}

TEST_CASE("reports: paired differences from a baseline on the same samples, with intervals", "[report][stats]") {
  const TempDir dir("report_paired");
  {
    std::ofstream out(dir / "r.jsonl");
    for (int i = 0; i < 30; ++i) {
      const json opts = {{"task", "vt"}, {"length", "4096"}, {"sample", std::to_string(i)}};
      const double full = 0.5 + 0.01 * (i % 7);
      auto rec = [&](const std::string& m, int budget, double score) {
        json r = record("ruler", opts, m, budget, score);
        r["id"] = fmt::format("s{}", i);
        return r.dump() + "\n";
      };
      out << rec("fullkv", 0, full);
      out << rec("snapkv", 128, full - 0.1 + (i % 2 ? 0.05 : -0.05));  // 10 points worse, every sample
      out << rec("h2o", 128, full + (i % 2 ? 0.1 : -0.1));             // no better nor worse on average
      out << rec("streamingllm", 128, full);                           // the same score on every sample
    }
  }
  const std::string rep = (dir / "rep").string();
  std::filesystem::create_directories(rep);
  write_paired_comparison({(dir / "r.jsonl").string()}, "fullkv", rep, {"md", "csv"});
  const std::string t = read(dir / "rep" / "ruler-vs-fullkv.md");
  INFO(t);
  CHECK(t.find("| h2o | +0.00 [") != std::string::npos);
  CHECK(t.find("| snapkv | -10.00 [") != std::string::npos);
  CHECK(t.find("] * (n=30, p=<0.001) |") != std::string::npos);  // snapkv's difference holds after Holm
  CHECK(t.find("] (n=30, p=") != std::string::npos);             // h2o's does not
  CHECK(t.find("over the table's 2 comparisons with an interval") != std::string::npos);  // streamingllm has none
  Table escaped;
  escaped.columns = {"Method", "x"};
  escaped.blocks.emplace_back().rows.push_back({"pooling=max|avg", "(p=<0.001, a>b)"});
  CHECK(to_latex(escaped).find("pooling=max\\textbar{}avg & (p=\\textless{}0.001, a\\textgreater{}b)") !=
        std::string::npos);  // OT1 would print < as an inverted exclamation mark
  CHECK(t.find("| streamingllm | +0.00 (n=30, constant) |") != std::string::npos);  // no zero-width interval
  require_error([&] { write_paired_comparison({(dir / "r.jsonl").string()}, "pyramidkv", rep, {"md"}); },
                {"--baseline pyramidkv", "recorded: fullkv, h2o, snapkv, streamingllm"});
  require_error([&] { write_paired_comparison({(dir / "r.jsonl").string()}, "snapkv:window=8", rep, {"md"}); },
                {"no recorded setting"});
  // Against snapkv at its own KV size: the full cache has no KV size 128, so only h2o pairs.
  write_paired_comparison({(dir / "r.jsonl").string()}, "snapkv", rep, {"md"});
  const std::string s = read(dir / "rep" / "ruler-vs-snapkv.md");
  CHECK(s.find("| h2o | +10.00 [") != std::string::npos);
  CHECK(s.find("fullkv") == std::string::npos);
}

TEST_CASE("reports: a baseline named by a parameter added later picks the records made without it", "[report][stats]") {
  // Palu's group_size was added after results were recorded: at its earlier behaviour (0) records leave it
  // out, so naming group_size=0 must pick them and not the G-LRD setting.
  const TempDir dir("report_added_later");
  {
    std::ofstream out(dir / "r.jsonl");
    for (int i = 0; i < 12; ++i) {
      const json opts = {{"task", "vt"}, {"length", "4096"}};
      auto rec = [&](const json& params, double score) {
        json r = record("ruler", opts, "palu", 0, score);
        r["config"]["params"] = params;
        r["id"] = fmt::format("s{}", i);
        return r.dump() + "\n";
      };
      out << rec({{"rank_ratio", "0.5"}}, 0.5 + 0.01 * (i % 3));
      out << rec({{"rank_ratio", "0.5"}, {"group_size", "1"}}, 0.4 + 0.01 * (i % 3));
    }
  }
  const std::string rep = (dir / "rep").string();
  std::filesystem::create_directories(rep);
  require_error([&] { write_paired_comparison({(dir / "r.jsonl").string()}, "palu", rep, {"md"}); },
                {"2 recorded settings of palu on ruler match"});
  write_paired_comparison({(dir / "r.jsonl").string()}, "palu:group_size=0", rep, {"md"});
  const std::string t = read(dir / "rep" / "ruler-vs-palu-group_size_0.md");
  INFO(t);
  CHECK(t.find("| palu (group_size=1) | -10.00 (n=12, constant) |") != std::string::npos);
  // The score tables keep the two settings apart (they once pooled them into one row of 24 samples).
  write_report({(dir / "r.jsonl").string()}, rep, {"md"});
  const std::string mb = read(dir / "rep" / "ruler-method-budget.md");
  INFO(mb);
  CHECK(mb.find("| palu (group_size=0) | 51.00 [") != std::string::npos);
  CHECK(mb.find("| palu (group_size=1) | 41.00 [") != std::string::npos);
  CHECK(mb.find("n=24") == std::string::npos);
}

TEST_CASE("reports: a paired table's marks hold for the table's comparisons together (Holm)", "[report][stats]") {
  // Six methods, each 4 points better than the full cache on 30 samples give or take 10: alone, each
  // interval excludes 0 (p about 0.03); as a family of six, none survives Holm's adjustment.
  const TempDir dir("report_holm");
  const std::vector<std::string> methods = {"snapkv", "h2o", "pyramidkv", "streamingllm", "kvzip", "keydiff"};
  {
    std::ofstream out(dir / "r.jsonl");
    for (int i = 0; i < 30; ++i) {
      const json opts = {{"task", "vt"}, {"length", "4096"}};
      auto rec = [&](const std::string& m, int budget, double score) {
        json r = record("ruler", opts, m, budget, score);
        r["id"] = fmt::format("s{}", i);
        return r.dump() + "\n";
      };
      out << rec("fullkv", 0, 0.5);
      for (const auto& m : methods) out << rec(m, 128, 0.54 + (i % 2 ? 0.1 : -0.1));
    }
  }
  const std::string rep = (dir / "rep").string();
  std::filesystem::create_directories(rep);
  write_paired_comparison({(dir / "r.jsonl").string()}, "fullkv", rep, {"md"});
  const std::string t = read(dir / "rep" / "ruler-vs-fullkv.md");
  INFO(t);
  for (const auto& m : methods) CHECK(t.find("| " + m + " | +4.00 [+0.") != std::string::npos);  // excludes 0
  CHECK(t.find("] * (") == std::string::npos);
  CHECK(t.find("over the table's 6 comparisons") != std::string::npos);
}

TEST_CASE("reports: runs of another KV dtype or model are rows of their own, never pooled", "[report][stats]") {
  // The same 20 samples run in fp32 and fp16 on one model, and in fp32 on a second: each row keeps its
  // 20 pairs (pooled, one row counted every sample two or three times and narrowed the interval).
  const TempDir dir("report_apart");
  {
    std::ofstream out(dir / "r.jsonl");
    for (const auto& [dtype, model] : {std::pair{"fp32", "a.gguf"}, {"fp16", "a.gguf"}, {"fp32", "b.gguf"}})
      for (int i = 0; i < 20; ++i) {
        const json opts = {{"task", "vt"}, {"length", "4096"}};
        for (const auto& [m, budget, score] :
             {std::tuple{"fullkv", 0, 0.5 + 0.02 * (i % 5)}, {"snapkv", 128, 0.45 + 0.03 * (i % 4)}}) {
          json r = record("ruler", opts, m, budget, score);
          r["id"] = fmt::format("s{}", i);
          r["config"]["model"] = model;
          if (std::string(dtype) != "fp32") r["config"]["kv_dtype"] = dtype;
          out << r.dump() << "\n";
        }
      }
  }
  const std::string rep = (dir / "rep").string();
  std::filesystem::create_directories(rep);
  write_paired_comparison({(dir / "r.jsonl").string()}, "fullkv", rep, {"md"});
  const std::string t = read(dir / "rep" / "ruler-vs-fullkv.md");
  INFO(t);
  CHECK(t.find("| snapkv on a.gguf |") != std::string::npos);
  CHECK(t.find("| snapkv [fp16] on a.gguf |") != std::string::npos);
  CHECK(t.find("| snapkv on b.gguf |") != std::string::npos);
  CHECK(t.find("(n=40)") == std::string::npos);
  CHECK(t.find("(n=20, p=") != std::string::npos);
  write_report({(dir / "r.jsonl").string()}, rep, {"md"});
  const std::string mb = read(dir / "rep" / "ruler-method-budget.md");
  INFO(mb);
  CHECK(mb.find("| snapkv on b.gguf |") != std::string::npos);
  CHECK(mb.find("n=40") == std::string::npos);
}

TEST_CASE("reports: runs differing in max_new_tokens are rows of their own, overlapping grids count a sample once",
          "[report][stats]") {
  // Found by a walkthrough: a smoke run (max_new_tokens=2) appended to a sweep's file was pooled with it
  // into one FullKV cell (n=26 of 20 samples), and --baseline silently paired against it.
  const TempDir dir("report_context");
  const json opts = {{"task", "vt"}, {"length", "4096"}};
  {
    std::ofstream out(dir / "r.jsonl");
    for (int i = 0; i < 20; ++i) {
      json full = record("ruler", opts, "fullkv", 0, 0.8), snap = record("ruler", opts, "snapkv", 128, 0.6 + 0.01 * i);
      full["id"] = snap["id"] = fmt::format("s{}", i);
      out << full.dump() << "\n" << snap.dump() << "\n";
      if (i < 6) {
        json smoke = record("ruler", opts, "fullkv", 0, 0.1);
        smoke["id"] = full["id"];
        smoke["config"]["max_new_tokens"] = 2;
        out << smoke.dump() << "\n";
      }
    }
  }
  const std::string rep = (dir / "rep").string(), file = (dir / "r.jsonl").string();
  std::filesystem::create_directories(rep);
  write_report({file}, rep, {"md"});
  const std::string mb = read(dir / "rep" / "ruler-method-budget.md");
  INFO(mb);
  CHECK(mb.find("| FullKV (max_new_tokens=default) | 80.00") != std::string::npos);
  CHECK(mb.find("| FullKV (max_new_tokens=2) | 10.00") != std::string::npos);
  CHECK(mb.find("n=26") == std::string::npos);
  CHECK(read(dir / "rep" / "summary.md").find("| max_new_tokens=2 | 6 |") != std::string::npos);
  test::require_error([&] { write_paired_comparison({file}, "fullkv", rep, {"md"}); },
                      {"2 recorded settings of fullkv on ruler match", "max_new_tokens=2"});
  write_paired_comparison({file}, "fullkv:max_new_tokens=default", rep, {"md"});
  const std::string t = read(dir / "rep" / "ruler-vs-fullkv-max_new_tokens_default.md");
  INFO(t);
  CHECK(t.find("| snapkv | - | -10.50 [") != std::string::npos);
  CHECK(t.find("(n=20, p=") != std::string::npos);

  // Review mends: records of two commits are one setting for --baseline too; a field varying on one task
  // labels that task's rows only, and "default" picks the run leaving it out on every task; an option
  // given at its default and left out are one setting, a sample of both counted once.
  {
    std::ofstream out(dir / "v.jsonl");
    for (int i = 0; i < 12; ++i)
      for (const char* version : {"aaa", "bbb"}) {
        const json niah = {{"chat", i % 2 ? "false" : "true"}};  // NIAH's chat defaults to true
        json full = record("ruler", opts, "fullkv", 0, 0.8), snap = record("ruler", opts, "snapkv", 128, 0.7);
        json nfull = record("niah", niah, "fullkv", 0, 0.9), nsnap = record("niah", niah, "snapkv", 128, 0.6);
        for (json* r : {&full, &snap, &nfull, &nsnap}) {
          (*r)["id"] = fmt::format("s{}", i);
          (*r)["config"]["version"] = version;
        }
        nfull["config"]["max_new_tokens"] = i < 6 ? 2 : 64;
        if (i % 2 == 0) nfull["config"]["options"] = nsnap["config"]["options"] = json::object();
        for (const json* r : {&full, &snap, &nfull, &nsnap}) out << r->dump() << "\n";
      }
  }
  const std::string v = (dir / "v.jsonl").string();
  write_report({v}, rep, {"md"});
  const std::string ruler = read(dir / "rep" / "ruler-method-budget.md"),
                    niah = read(dir / "rep" / "niah-method-budget.md");
  INFO(ruler << niah);
  CHECK(ruler.find("| FullKV | 80.00") != std::string::npos);
  CHECK(ruler.find("| snapkv | - | 70.00") != std::string::npos);
  CHECK(niah.find("| FullKV (max_new_tokens=2) | 90.00 (100.0%, 200.0% fp16, n=6) |") != std::string::npos);
  CHECK(niah.find("| snapkv | - | 60.00 (25.0%, 50.0% fp16, n=12) |") != std::string::npos);
  write_paired_comparison({v}, "fullkv:max_new_tokens=64", rep, {"md"});
  CHECK(read(dir / "rep" / "ruler-vs-fullkv-max_new_tokens_64.md").find("| snapkv | -10.00 (n=12, constant) |") !=
        std::string::npos);
  CHECK(read(dir / "rep" / "niah-vs-fullkv-max_new_tokens_64.md").find("| snapkv | -30.00 (n=6, constant) |") !=
        std::string::npos);

  // NIAH over depths 0/50/100 and then 0/25/50/75/100: the three shared samples pool once (5, not 8).
  {
    std::ofstream out(dir / "n.jsonl");
    for (const auto& [depths, ids] :
         {std::pair{"3", std::vector<int>{0, 50, 100}}, {"5", std::vector<int>{0, 25, 50, 75, 100}}})
      for (int d : ids) {
        json r = record("niah", {{"s_len", "1000"}, {"e_len", "1000"}, {"depths", depths}}, "snapkv", 64, d / 100.0);
        r["id"] = fmt::format("L1000_d{}", d);
        out << r.dump() << "\n";
      }
  }
  write_report({(dir / "n.jsonl").string()}, rep, {"md"});
  CHECK(read(dir / "rep" / "summary.md").find("| snapkv | 64 | fp32 | native | - | 5 | 50.00 |") != std::string::npos);
  {
    std::ofstream out(dir / "n.jsonl", std::ios::app);
    json r = record("niah", {{"s_len", "1000"}, {"e_len", "1000"}, {"depths", "2"}}, "snapkv", 64, 0.3);
    r["id"] = "L1000_d100";
    out << r.dump() << "\n";
  }
  test::require_error([&] { write_report({(dir / "n.jsonl").string()}, rep, {"md"}); },
                      {"n.jsonl:9", "sample 'L1000_d100'", "recorded again with score 0.3"});
  // A score off its task's scale (an edited record) printed as 500.00; perplexity records hold NLLs.
  {
    std::ofstream out(dir / "s.jsonl");
    out << record("niah", json::object(), "snapkv", 64, 5.0).dump() << "\n";
  }
  for (const auto& run : std::vector<std::function<void()>>{
           [&] { write_report({(dir / "s.jsonl").string()}, rep, {"md"}); },
           [&] { write_paired_comparison({(dir / "s.jsonl").string()}, "snapkv", rep, {"md"}); }})
    test::require_error(run, {"s.jsonl:1", "score 5 is outside [0, 1]"});
  {
    std::ofstream out(dir / "p.jsonl");
    out << record("perplexity", json::object(), "fullkv", 0, 2.5).dump() << "\n";
  }
  write_report({(dir / "p.jsonl").string()}, rep, {"md"});
}

TEST_CASE("reports: a sample scored two ways counts once, a row short of a column is marked", "[report][stats]") {
  // Found by an independent check: GSM8K's strict and flexible scores pooled as 2n samples (n=80 of 40),
  // intervals too narrow; a RULER row missing a task averaged fewer tasks unmarked; records without ids
  // all paired as one sample.
  const TempDir dir("report_units");
  {
    std::ofstream out(dir / "g.jsonl");
    for (int i = 0; i < 20; ++i)
      for (const char* metric : {"strict", "flexible"}) {
        const bool strict = metric[0] == 's';
        json full = record("gsm8k", {{"metric", metric}}, "fullkv", 0, strict ? i % 2 : 1);
        json snap = record("gsm8k", {{"metric", metric}}, "snapkv", 128, strict ? 0 : i % 3 == 0);
        full["id"] = snap["id"] = fmt::format("g{}", i);
        out << full.dump() << "\n" << snap.dump() << "\n";
      }
    for (const char* task : {"vt", "qa_1"})
      for (int i = 0; i < 4; ++i)
        for (const char* method : {"fullkv", "snapkv"}) {
          if (std::string(method) == "snapkv" && std::string(task) == "qa_1") continue;
          json r = record("ruler", {{"task", task}, {"length", "4096"}}, method, method[0] == 's' ? 128 : 0, 0.5);
          r["id"] = fmt::format("{}{}", task, i);
          out << r.dump() << "\n";
        }
  }
  const std::string rep = (dir / "rep").string(), file = (dir / "g.jsonl").string();
  std::filesystem::create_directories(rep);
  write_report({file}, rep, {"md"});
  const std::string mb = read(dir / "rep" / "gsm8k-method-budget.md"), ruler = read(dir / "rep" / "ruler-4096.md");
  INFO(mb << ruler);
  CHECK(mb.find("n=20)") != std::string::npos);
  CHECK(mb.find("n=40") == std::string::npos);
  CHECK(ruler.find("| snapkv | 50.00 | - | 50.00 | 0 | 8.00 | 1/2 |") != std::string::npos);
  CHECK(ruler.find("| FullKV | 50.00 | 50.00 | 50.00 | 0 | 32.00 |  |") != std::string::npos);
  CHECK(ruler.find("Results k/n: the row has results in k of the n columns") != std::string::npos);
  write_paired_comparison({file}, "fullkv", rep, {"md"});
  const std::string paired = read(dir / "rep" / "gsm8k-vs-fullkv.md");
  INFO(paired);
  CHECK(paired.find("(n=20, p=") != std::string::npos);
  // Samples of two RULER seeds share their ids but are samples of their own (found by a review).
  {
    std::ofstream out(dir / "seeds.jsonl");
    for (const char* seed : {"42", "7"})
      for (int i = 0; i < 12; ++i)
        for (const char* method : {"fullkv", "snapkv"}) {
          json r = record("ruler", {{"task", "vt"}, {"length", "4096"}, {"seed", seed}}, method,
                          method[0] == 's' ? 128 : 0, method[0] == 's' ? 0.1 * (i % 4) : 0.5);
          r["id"] = fmt::format("vt_4096_{}", i);
          out << r.dump() << "\n";
        }
  }
  write_paired_comparison({(dir / "seeds.jsonl").string()}, "fullkv", rep, {"md"});
  const std::string seeds = read(dir / "rep" / "ruler-vs-fullkv.md");
  INFO(seeds);
  CHECK(seeds.find("(n=24, p=") != std::string::npos);
  {
    std::ofstream out(dir / "n.jsonl");
    out << record("niah", json::object(), "fullkv", 0, 1).dump() << "\n";
  }
  test::require_error([&] { write_paired_comparison({(dir / "n.jsonl").string()}, "fullkv", rep, {"md"}); },
                      {"n.jsonl:1", "no 'id'"});
}
