// The parsers a user feeds files to, fed arbitrary bytes. They read paths, not buffers, so each input
// is written to a file in this process's own temporary directory (parallel fuzzing jobs never share
// one) and the parser is called on it, then whatever consumes the parsed result: the sweep expansion,
// the report, a tokenizer's encode and decode, a task's samples and scores. Any outcome but success
// or kvb::Error (a crash, a sanitizer report, a hang, another exception) is a bug.
//
// One source, one binary per parser: KVB_FUZZ_PARSER names the parser (see kParsers).
#include <fmt/format.h>
#include <unistd.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <functional>
#include <map>
#include <span>
#include <string>
#include <string_view>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/model/config.hpp"
#include "harness/report/report.hpp"
#include "harness/task/longbench_metrics.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"

namespace fs = std::filesystem;

namespace {

using Bytes = std::span<const uint8_t>;

fs::path& scratch() {
  static fs::path dir;
  return dir;
}

std::string write_input(const std::string& rel, Bytes data) {
  const fs::path p = scratch() / rel;
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary).write(reinterpret_cast<const char*>(data.data()), std::streamsize(data.size()));
  return p.string();
}

// Tasks count tokens; a small tokenizer.json from the test fixtures keeps every run fast.
const kvb::Tokenizer& task_tokenizer() {
  static const auto tok =
      kvb::load_tokenizer_file(KVBENCH_SOURCE_DIR "/tests/fixtures/tokenizer/synthetic/digits_grouped.json");
  return *tok;
}

void exercise(const kvb::Task& task) {
  for (size_t i = 0; i < std::min<size_t>(task.size(), 3); ++i) {
    const kvb::Sample s = task.sample(i);
    (void)task.score(s, "The answer is 42, Paragraph 3. def f(x):\n  return x");
    for (const auto& a : s.answers) (void)task.score(s, a);
  }
}

kvb::TaskContext task_context(std::map<std::string, std::string> options) {
  kvb::TaskContext ctx;
  ctx.tokenizer = &task_tokenizer();
  ctx.data_dir = scratch().string();
  ctx.options = std::move(options);
  return ctx;
}

// The first byte picks a variant (a dataset, a file layout); the rest is the file.
template <size_t N>
std::pair<const char*, Bytes> pick(const std::array<const char*, N>& variants, Bytes data) {
  if (data.empty()) return {variants[0], data};
  return {variants[data[0] % N], data.subspan(1)};
}

void fuzz_spec(Bytes data) { (void)kvb::load_experiment(write_input("spec.yaml", data)); }

void fuzz_results(Bytes data) {
  const std::string path = write_input("results.jsonl", data);
  (void)kvb::recorded_keys(path);
  kvb::for_each_record(path, [](const nlohmann::json& r, int) { (void)kvb::record_key(r); });
  kvb::write_report({path}, (scratch() / "report").string(), {"md", "csv", "tex"});
}

void fuzz_tokenizer_json(Bytes data) {
  const auto tok = kvb::load_tokenizer_file(write_input("tokenizer.json", data));
  const auto ids = tok->encode("Hello, world! 12345 <|im_start|>user\n\u00e9\u4e2d\U0001F600 \t\n");
  (void)tok->decode(ids);
}

void fuzz_config(Bytes data) {
  write_input("model/config.json", data);
  (void)kvb::config_from_hf_dir((scratch() / "model").string());
}

void fuzz_longbench(Bytes data) {
  // One English dataset per metric (Chinese ones need the jieba dictionary, which the tests cover).
  static constexpr std::array<const char*, 6> kDatasets = {"qasper",        "gov_report",           "trec",
                                                           "passage_count", "passage_retrieval_en", "lcc"};
  const auto [dataset, file] = pick(kDatasets, data);
  write_input(fmt::format("longbench/{}.jsonl", dataset), file);
  exercise(*kvb::TaskRegistry::get().create("longbench", task_context({{"dataset", dataset}, {"max_len", "256"}})));
}

void fuzz_longbench_pred(Bytes data) {
  // A predictions file for `kvbench score`, scored by length range; one dataset per English metric.
  static constexpr std::array<const char*, 6> kDatasets = {"qasper",        "gov_report",           "trec",
                                                           "passage_count", "passage_retrieval_en", "lcc"};
  const auto [dataset, file] = pick(kDatasets, data);
  (void)kvb::score_predictions_file(std::string("longbench/") + dataset, write_input("pred.jsonl", file), true, "");
}

void fuzz_ruler(Bytes data) {
  static constexpr std::array<const char*, 4> kLayouts = {"2024", "2025", "squad", "hotpotqa"};
  const auto [layout, file] = pick(kLayouts, data);
  const std::string_view l = layout;
  std::map<std::string, std::string> options = {{"length", "512"}, {"samples", "2"}};
  if (l == "2024" || l == "2025") {
    write_input(l == "2024" ? "ruler/512/niah_single_1.jsonl" : "ruler/niah_single_1/validation.jsonl", file);
    options.insert({{"task", "niah_single_1"}, {"source", "files"}, {"dir", (scratch() / "ruler").string()}});
  } else {
    options.insert(
        {{"task", l == "squad" ? "qa_1" : "qa_2"}, {"qa_file", write_input(fmt::format("{}.json", layout), file)}});
  }
  exercise(*kvb::TaskRegistry::get().create("ruler", task_context(std::move(options))));
}

const std::map<std::string_view, void (*)(Bytes)> kParsers = {
    {"spec", fuzz_spec},     {"results", fuzz_results},     {"tokenizer_json", fuzz_tokenizer_json},
    {"config", fuzz_config}, {"longbench", fuzz_longbench}, {"longbench_pred", fuzz_longbench_pred},
    {"ruler", fuzz_ruler}};

void (*parser)(Bytes) = nullptr;

}  // namespace

extern "C" int LLVMFuzzerInitialize(int*, char***) {
  parser = kParsers.at(KVB_FUZZ_PARSER);
  std::string tmpl = (fs::temp_directory_path() / "kvbench_fuzz_XXXXXX").string();
  if (!mkdtemp(tmpl.data())) {
    fmt::print(stderr, "cannot create a temporary directory under {}\n", fs::temp_directory_path().string());
    std::exit(1);
  }
  scratch() = tmpl;
  std::atexit([] { fs::remove_all(scratch()); });
  (void)task_tokenizer();
  return 0;
}

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  // Each input starts from an empty directory, so a run never depends on the files of the last one.
  for (const auto& e : fs::directory_iterator(scratch())) fs::remove_all(e.path());
  try {
    parser(Bytes(data, size));
  } catch (const kvb::Error&) {
  }
  return 0;
}
