// The jsonl task: a researcher's own samples (context, question, answers) scored with a chosen
// metric, its errors by line and field, and a sweep over it on the default model.
#include <filesystem>
#include <fstream>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

// The task reads no tokens; the registry still hands every task the model's tokenizer.
const Tokenizer& any_tokenizer() {
  static const auto tok = load_tokenizer_file(fixture("tokenizer/synthetic/qwen2.json"));
  return *tok;
}

std::unique_ptr<Task> jsonl_task(const std::string& file, std::map<std::string, std::string> options = {}) {
  options["file"] = file;
  TaskContext ctx;
  ctx.tokenizer = &any_tokenizer();
  ctx.options = options;
  ctx.data_dir = default_data_dir();
  return TaskRegistry::get().create("jsonl", ctx);
}

std::string write(const TempDir& dir, const std::string& name, const std::string& text) {
  const auto p = (dir / name).string();
  std::ofstream(p) << text;
  return p;
}

}  // namespace

TEST_CASE("jsonl task: samples from the file, the template, ids that follow the content", "[tasks][jsonl]") {
  const TempDir dir("jsonl_task");
  const std::string f = write(
      dir, "qa.jsonl",
      R"({"context": "Paris is in France. {x}", "question": "Where is Paris?", "answers": ["France", "in France"]})"
      "\n\n"
      R"({"id": "q2", "context": "Two plus two is four.", "question": "2+2?", "answers": "four", "max_new_tokens": 5})"
      "\n");
  auto t = jsonl_task(f, {{"metric", "exact_match"}});
  REQUIRE(t->size() == 2);
  const Sample a = t->sample(0), b = t->sample(1);
  // The context's own braces stay as they are: inserted text is not read as a template.
  CHECK(a.prompt == "Paris is in France. {x}\n\nQuestion: Where is Paris?\nAnswer:");
  CHECK(a.chat);
  CHECK(a.max_new_tokens == 64);
  CHECK(b.max_new_tokens == 5);
  CHECK(a.id.rfind("line1-", 0) == 0);
  CHECK(b.id.rfind("q2-", 0) == 0);
  CHECK(b.answers == std::vector<std::string>{"four"});
  CHECK(t->score(a, "France.") == 1.0);  // SQuAD normalisation: case, punctuation, articles
  CHECK(t->score(a, "in  france") == 1.0);
  CHECK(t->score(a, "Paris") == 0.0);
  CHECK(jsonl_task(f, {{"metric", "qa_f1"}})->score(a, "it is in France") ==
        Approx(2.0 / 3));  // vs "in France": P 2/4, R 1
  CHECK(jsonl_task(f, {{"metric", "string_match_part"}})->score(a, "Somewhere in France, I think") == 1.0);
  auto custom = jsonl_task(f, {{"template", "Q: {question}\n{{notes}}\n{context}"}, {"chat", "false"}});
  CHECK(custom->sample(1).prompt == "Q: 2+2?\n{notes}\nTwo plus two is four.");
  CHECK_FALSE(custom->sample(1).chat);
  // An edited sample gets a new id, so a sweep runs it again instead of keeping the old result.
  const std::string g =
      write(dir, "qa2.jsonl",
            R"({"context": "Paris is in France. {x}", "question": "Where is Paris?", "answers": ["France"]})"
            "\n");
  CHECK(jsonl_task(g)->sample(0).id != a.id);
}

TEST_CASE("jsonl task: bad samples and options name the file, the line and the field", "[tasks][jsonl]") {
  const TempDir dir("jsonl_errors");
  auto bad = [&](const std::string& line, std::initializer_list<std::string> want) {
    const std::string f = write(dir, "bad.jsonl",
                                R"({"context": "c", "question": "q", "answers": ["a"]})"
                                "\n" +
                                    line + "\n");
    require_error([&] { jsonl_task(f); }, want);
  };
  bad(R"({"context": "c", "answers": ["a"]})", {"bad.jsonl:2", "field 'question' is missing"});
  bad(R"({"context": "c", "question": "q"})", {"bad.jsonl:2", "field 'answers' is missing"});
  bad(R"({"context": "c", "question": "q", "answers": []})", {"bad.jsonl:2", "'answers'", "non-empty list"});
  bad(R"({"context": 5, "question": "q", "answers": ["a"]})", {"bad.jsonl:2", "'context' must be a string"});
  bad(R"({"context": "c", "question": "q", "answers": ["a"], "max_new_tokens": 0})", {"bad.jsonl:2", "max_new_tokens"});
  bad("{not json", {"bad.jsonl:2", "not JSON"});
  bad(R"({"id": "x", "context": "c", "question": "q", "answers": ["a"]})"
      "\n"
      R"({"id": "x", "context": "d", "question": "q", "answers": ["a"]})",
      {"bad.jsonl:3", "id 'x' was used on line 2"});
  const std::string ok = write(dir, "ok.jsonl",
                               R"({"context": "c", "question": "q", "answers": ["a"]})"
                               "\n");
  require_error([&] { jsonl_task(ok, {{"template", "{context} only"}}); }, {"option 'template'", "{question}"});
  require_error(
      [&] {
        jsonl_task(ok, {{"template", "{context} {question} {extra}"}});
      },
      {"option 'template'", "{extra}"});
  require_error([&] { jsonl_task(ok, {{"metric", "bleu"}}); }, {"metric", "bleu", "qa_f1"});
  require_error([&] { jsonl_task((dir / "none.jsonl").string()); }, {"none.jsonl", "cannot read"});
  require_error([&] { jsonl_task(write(dir, "empty.jsonl", "\n")); }, {"empty.jsonl", "no samples"});
}

TEST_CASE("jsonl task in a sweep on the default model: records per sample, resumed without rerunning",
          "[tasks][jsonl][model]") {
  const auto model = model_file(kDefaultModel);
  if (!model) return;
  const TempDir dir("jsonl_sweep");
  std::string lines;
  const char* facts[][3] = {
      {"The capital of France is Paris.", "What is the capital of France?", "Paris"},
      {"Mount Everest is the highest mountain on Earth.", "What is the highest mountain?", "Mount Everest"},
      {"Water boils at 100 degrees Celsius at sea level.", "At what temperature does water boil?", "100 degrees"}};
  for (const auto& f : facts)
    lines += nlohmann::json{{"context", std::string(f[0]) + " Some filler text about other things. "},
                            {"question", f[1]},
                            {"answers", {f[2]}},
                            {"max_new_tokens", 12}}
                 .dump() +
             "\n";
  const std::string data = write(dir, "facts.jsonl", lines);
  const std::string out = (dir / "r.jsonl").string();
  const std::string spec = write(dir, "s.yaml",
                                 "model: " + *model + "\ntask: jsonl\ntask_options: {file: " + data +
                                     ", metric: qa_f1}\nmethods: [fullkv, streamingllm]\nbudgets: [16]\n"
                                     "threads: 2\nout: " +
                                     out + "\n");
  const SweepOutcome first = Sweep(load_experiment(spec)).run(false);
  CHECK(first.run == 6);
  CHECK(first.failed == 0);
  int n = 0;
  double full = 0;
  for_each_record(out, [&](const nlohmann::json& r, int) {
    ++n;
    CHECK(r["score"].get<double>() >= 0.0);
    CHECK(r["meta"]["metric"] == "qa_f1");
    CHECK(r["kernels"].get<std::string>().find(", clones ") != std::string::npos);  // the CPU path it ran on
    if (r["config"]["method"] == "fullkv") full += r["score"].get<double>();
  });
  CHECK(n == 6);
  CHECK(full > 0);  // the model answers some of these from the context
  CHECK(Sweep(load_experiment(spec)).run(false).run == 0);
}
