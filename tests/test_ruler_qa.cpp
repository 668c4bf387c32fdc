// RULER qa_1/qa_2 generated natively from SQuAD/HotpotQA files, against RULER's own qa.py on the same
// files (tools/reference/ruler_qa_generate.py), and the errors for missing or malformed files.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "ruler_fixture.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

std::unique_ptr<Task> qa(const Tokenizer& tok, const std::string& task, int length, int samples,
                         const std::string& file) {
  TaskContext ctx;
  ctx.tokenizer = &tok;
  ctx.data_dir = default_data_dir();
  ctx.options = {
      {"task", task}, {"length", std::to_string(length)}, {"samples", std::to_string(samples)}, {"qa_file", file}};
  return TaskRegistry::get().create("ruler", ctx);
}

std::string qa_fixture(const std::string& task) {
  return fixture(task == "qa_1" ? "ruler/qa/squad.json" : "ruler/qa/hotpotqa.json");
}

}  // namespace

TEST_CASE("RULER qa_1/qa_2 generated here equal RULER's qa.py on the same files", "[tasks][ruler]") {
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  int total = 0;
  const int same = compare_with_ruler_fixture(
      "ruler/qa_generator.json",
      [&](const std::string& task, int length, int n) { return qa(*tok, task, length, n, qa_fixture(task)); }, total);
  CHECK(total == 15);  // qa_1 at 1024, 2048, 4096 (every document, repeated); qa_2 at 1024, 4096; 3 each
  if (total) {         // string_match_part: any one reference found is full marks
    auto t = qa(*tok, "qa_1", 1024, 1, qa_fixture("qa_1"));
    const Sample s = t->sample(0);
    CHECK(t->score(s, "It is " + s.answers.front() + ".") == 1.0);
    CHECK(t->score(s, "no idea") == 0.0);
  }
  WARN(same << "/" << total << " RULER qa samples byte-identical to RULER's qa.py");
}

TEST_CASE("RULER qa: missing and malformed SQuAD/HotpotQA files are named with the field", "[tasks][ruler]") {
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  const TempDir dir("ruler_qa");
  require_error([&] { qa(*tok, "qa_1", 1024, 1, (dir / "nope.json").string()); },
                {"nope.json", "not found", "SQuAD 2.0"});
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  require_error([&] { qa(*tok, "qa_1", 1024, 1, write("bad.json", "{\"data\": [")); }, {"bad.json", "not JSON"});
  require_error(
      [&] {
        qa(*tok, "qa_1", 1024, 1,
           write("v1.json",
                 R"({"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q", "answers": []}]}]}]})"));
      },
      {"v1.json", "data[0].paragraphs[0].qas", "is_impossible"});
  require_error(
      [&] {
        qa(*tok, "qa_2", 1024, 1, write("h.json", R"([{"question": "q", "answer": "a", "context": [["t", "s"]]}])"));
      },
      {"h.json", "[0].context", "[title, [sentences]]"});
  require_error([&] { qa(*tok, "qa_2", 1024, 99, qa_fixture("qa_2")); }, {"99 samples", "14 questions"});
}
