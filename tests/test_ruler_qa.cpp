// RULER qa_1/qa_2 generated natively from SQuAD/HotpotQA files, against RULER's own qa.py on the same
// files (tools/reference/ruler_qa_generate.py), and the errors for missing or malformed files.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <map>

#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "tasks/task.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

std::unique_ptr<Task> qa(const Tokenizer& tok, const std::string& task, int length, int samples, const std::string& file) {
  TaskContext ctx;
  ctx.tokenizer = &tok;
  ctx.data_dir = default_data_dir();
  ctx.options = {{"task", task}, {"length", std::to_string(length)}, {"samples", std::to_string(samples)},
                 {"qa_file", file}};
  return TaskRegistry::get().create("ruler", ctx);
}

std::string qa_fixture(const std::string& task) { return fixture(task == "qa_1" ? "ruler/qa/squad.json" : "ruler/qa/hotpotqa.json"); }

}  // namespace

TEST_CASE("RULER qa_1/qa_2 generated here equal RULER's qa.py on the same files", "[tasks][ruler]") {
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  const auto golden = nlohmann::json::parse(std::ifstream(fixture("ruler/qa_generator.json")));
  const int n = golden["samples_per_task"];
  std::map<std::pair<std::string, int>, std::unique_ptr<Task>> tasks;
  int same = 0, total = 0;
  for (const auto& r : golden["records"]) {
    const std::string name = r["task"];
    const int length = r["length"];
    auto& t = tasks[{name, length}];
    if (!t) t = qa(*tok, name, length, n, qa_fixture(name));
    const Sample s = t->sample(r["index"].get<size_t>());
    INFO(name << " L=" << length << " #" << r["index"]);
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s.prompt) h = (h ^ c) * 0x100000001b3ull;
    const bool equal = fmt::format("{:016x}", h) == r["fnv1a64"].get<std::string>();
    CHECK(equal);
    const size_t chars = static_cast<size_t>(
        std::count_if(s.prompt.begin(), s.prompt.end(), [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; }));
    CHECK(chars == r["chars"].get<size_t>());
    CHECK(s.answers == r["outputs"].get<std::vector<std::string>>());
    CHECK(s.meta["length"] == r["stored_length"]);
    CHECK(s.meta["length"].get<int>() <= length);
    // string_match_part: any one reference found is full marks.
    CHECK(t->score(s, "It is " + s.answers.back() + ".") == 1.0);
    CHECK(t->score(s, "no idea") == 0.0);
    same += equal;
    ++total;
  }
  CHECK(total == 15);  // qa_1 at 1024, 2048, 4096 (every document, repeated); qa_2 at 1024, 4096; 3 each
  WARN(same << "/" << total << " RULER qa samples byte-identical to RULER's qa.py");
}

TEST_CASE("RULER qa: missing and malformed SQuAD/HotpotQA files are named with the field", "[tasks][ruler]") {
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  const auto dir = std::filesystem::temp_directory_path() / "kvbench_ruler_qa";
  std::filesystem::create_directories(dir);
  require_error([&] { qa(*tok, "qa_1", 1024, 1, (dir / "nope.json").string()); }, {"nope.json", "not found", "SQuAD 2.0"});
  auto write = [&](const std::string& name, const std::string& text) {
    std::ofstream(dir / name) << text;
    return (dir / name).string();
  };
  require_error([&] { qa(*tok, "qa_1", 1024, 1, write("bad.json", "{\"data\": [")); }, {"bad.json", "not JSON"});
  require_error([&] { qa(*tok, "qa_1", 1024, 1, write("v1.json", R"({"data": [{"paragraphs": [{"context": "c", "qas": [{"question": "q", "answers": []}]}]}]})")); },
                {"v1.json", "data[0].paragraphs[0].qas", "is_impossible"});
  require_error([&] { qa(*tok, "qa_2", 1024, 1, write("h.json", R"([{"question": "q", "answer": "a", "context": [["t", "s"]]}])")); },
                {"h.json", "[0].context", "[title, [sentences]]"});
  require_error([&] { qa(*tok, "qa_2", 1024, 99, qa_fixture("qa_2")); }, {"99 samples", "14 questions"});
}
