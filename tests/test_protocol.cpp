// kvpress's question-after-compression protocol: the tasks' split of their prompts, the chat template
// cut around the context, and answers against kvpress's own pipeline on the default model
// (tools/reference/kvpress_pipeline.py).
#include <algorithm>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/chat_template.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "tasks/longbench/longbench.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

std::unique_ptr<Task> make(const std::string& name, const Tokenizer& tok, const std::string& data,
                           std::map<std::string, std::string> options) {
  TaskContext ctx;
  ctx.tokenizer = &tok;
  ctx.data_dir = data;
  ctx.options = std::move(options);
  return TaskRegistry::get().create(name, ctx);
}

}  // namespace

TEST_CASE("kvpress's split of every LongBench template joins back to the template", "[tasks][longbench][protocol]") {
  // Every dataset the task offers (its `dataset` option's choices).
  const auto& options = TaskRegistry::get().info("longbench").options;
  const auto dataset = std::find_if(options.begin(), options.end(), [](const auto& o) { return o.name == "dataset"; });
  REQUIRE(dataset != options.end());
  CHECK(dataset->choices.size() == 21);
  for (const auto& d : dataset->choices) {
    INFO(d);
    const auto t = longbench::kvpress_template(d);
    const std::string joined = t.context + t.question + (t.prefix_ends_input ? "" : t.answer_prefix);
    CHECK(joined == longbench::prompt_template(d));
    CHECK(t.context.find("{context}") != std::string::npos);
  }
  // kvpress's cuts: the instruction after the context is compressed with it; "Question:" is not.
  const auto n = longbench::kvpress_template("narrativeqa");
  CHECK(n.context.ends_with("Do not provide any explanation.\n\n"));
  CHECK(n.question == "Question: {input}\n\n");
  CHECK(n.answer_prefix == "Answer:");
  CHECK(longbench::kvpress_template("trec").prefix_ends_input);
  CHECK(longbench::kvpress_template("gov_report").question == "Now, write a one-page summary of the report.\n\n");
}

TEST_CASE("protocol=kvpress splits LongBench, RULER, NIAH and jsonl samples, and query-aware compresses the question",
          "[tasks][protocol]") {
  const auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  const std::string papers = test::fixture("papers/data");
  // LongBench: the three parts join to the benchmark's own prompt (untruncated) for all 16 English
  // datasets of the VECTOR tables; kvpress's limits and chat template.
  for (const auto& d : test::longbench_english()) {
    INFO(d);
    auto native = make("longbench", *tok, papers, {{"dataset", d}, {"max_len", "10000000"}});
    auto kv = make("longbench", *tok, papers, {{"dataset", d}, {"protocol", "kvpress"}});
    auto aware = make("longbench", *tok, papers, {{"dataset", d}, {"protocol", "kvpress-query-aware"}});
    const Sample a = native->sample(0), b = kv->sample(0), c = aware->sample(0);
    REQUIRE(b.split);
    // trec, triviaqa and samsum: kvpress appends the prefix it cut from the input, so an input
    // without it (these made-up records; the official ones end with it) gains it.
    const auto t = longbench::kvpress_template(d);
    const std::string gained = t.prefix_ends_input && !a.prompt.ends_with(t.answer_prefix) ? t.answer_prefix : "";
    CHECK(b.split->context + b.split->question + b.split->answer_prefix == a.prompt + gained);
    CHECK(b.prompt == a.prompt + gained);
    CHECK(b.id == a.id);
    CHECK(b.chat);
    CHECK(b.stop.empty());
    CHECK(b.min_new_tokens == 0);
    CHECK(b.max_new_tokens == a.max_new_tokens + 20);
    CHECK(!a.split);
    REQUIRE(c.split);
    CHECK(c.split->context == b.split->context + b.split->question);
    CHECK(c.split->question.empty());
    CHECK(c.split->answer_prefix == b.split->answer_prefix);
  }
  // An official trec record (its input ends with "Type:"): the parts join to the prompt exactly.
  {
    auto native = make("longbench", *tok, test::fixture("longbench/data"), {{"dataset", "trec"}});
    auto kv = make("longbench", *tok, test::fixture("longbench/data"), {{"dataset", "trec"}, {"protocol", "kvpress"}});
    const Sample a = native->sample(0), b = kv->sample(0);
    CHECK(b.split->question.ends_with("?\n"));
    CHECK(b.split->answer_prefix == "Type:");
    CHECK(b.split->context + b.split->question + b.split->answer_prefix == a.prompt);
  }
  // RULER: cut at the last question pattern and the answer pattern after it.
  const std::string data = test::source_path("data");
  for (const char* t : {"niah_single_1", "niah_multivalue", "vt", "cwe", "fwe", "qa_1"}) {
    INFO(t);
    // qa's documents need more room than the others' haystacks.
    std::map<std::string, std::string> o = {
        {"task", t}, {"length", std::string(t) == "qa_1" ? "4096" : "1024"}, {"samples", "1"}};
    if (std::string(t) == "qa_1") o["qa_file"] = papers + "/ruler/squad.json";
    auto native = make("ruler", *tok, data, o);
    o["protocol"] = "kvpress";
    auto kv = make("ruler", *tok, data, o);
    const Sample a = native->sample(0), b = kv->sample(0);
    REQUIRE(b.split);
    CHECK(b.split->context + b.split->question + b.split->answer_prefix == a.prompt);
    CHECK(b.max_new_tokens == a.max_new_tokens);
    CHECK(!b.split->question.empty());
    CHECK(b.split->context.size() > 10 * b.split->question.size());
  }
  {
    auto kv = make("ruler", *tok, data,
                   {{"task", "niah_single_1"}, {"length", "1024"}, {"samples", "1"}, {"protocol", "kvpress"}});
    const Sample s = kv->sample(0);
    CHECK(s.split->question.starts_with("What is the special magic"));
    CHECK(s.split->answer_prefix.starts_with("The special magic"));
  }
  // NIAH: the book compressed, the question and "Answer:" after.
  auto niah =
      make("niah", *tok, data, {{"s_len", "1000"}, {"e_len", "1000"}, {"depths", "1"}, {"protocol", "kvpress"}});
  const Sample ns = niah->sample(0);
  REQUIRE(ns.split);
  CHECK(ns.split->context.ends_with(" </book>.\n"));
  CHECK(ns.split->question ==
        " Based on the content of the book, Question: The best thing to do in San Francisco is: \n");
  CHECK(ns.split->answer_prefix == "Answer:");
  // jsonl: the sample's own context and question, the option's answer prefix.
  const test::TempDir dir("protocol_jsonl");
  const std::string file = (dir / "mine.jsonl").string();
  std::ofstream(file)
      << R"({"context": "Alice lives in Paris.", "question": "Where does Alice live?", "answers": ["Paris"]})"
      << "\n";
  auto mine = make("jsonl", *tok, "", {{"file", file}, {"protocol", "kvpress"}, {"answer_prefix", "Answer: "}});
  const Sample js = mine->sample(0);
  REQUIRE(js.split);
  CHECK(js.split->context == "Alice lives in Paris.");
  CHECK(js.split->question == "Where does Alice live?");
  CHECK(js.split->answer_prefix == "Answer: ");
  // A protocol a task does not know is an error naming the option.
  test::require_error(
      [&] {
        make("longbench", *tok, papers, {{"dataset", "qasper"}, {"protocol", "after"}});
      },
      {"protocol", "after"});
  // max_context: kvpress's max_context_length keeps the head of the prefill (template head + context).
  {
    auto whole = make("longbench", *tok, papers, {{"dataset", "qasper"}, {"protocol", "kvpress"}});
    auto capped =
        make("longbench", *tok, papers, {{"dataset", "qasper"}, {"protocol", "kvpress"}, {"max_context", "100"}});
    const PromptIds a = sample_prompt(*m, *tok, whole->sample(0)), b = sample_prompt(*m, *tok, capped->sample(0));
    REQUIRE(a.prefill.size() > 100);
    CHECK(b.prefill == std::vector<int32_t>(a.prefill.begin(), a.prefill.begin() + 100));
    CHECK(b.after == a.after);
    test::require_error(
        [&] {
          make("longbench", *tok, papers, {{"dataset", "qasper"}, {"max_context", "100"}});
        },
        {"max_context=100", "not native"});
  }
}

TEST_CASE("kvpress's pipeline: the same context and question ids, the same answers with KeyDiff and the full cache",
          "[protocol][keydiff][model][reference]") {
  const auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  std::ifstream in(test::fixture("kvpress_pipeline.json"));
  REQUIRE(in.good());
  const auto ref = nlohmann::json::parse(in);
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  Engine engine(*m);
  size_t runs = 0, same = 0;
  for (const auto& s : ref["samples"]) {
    const PromptIds ids = build_split_prompt(*m, *tok, s["context"], s["question"], s["answer_prefix"]);
    CHECK(ids.prefill == s["context_ids"].get<std::vector<int32_t>>());
    CHECK(ids.after == s["question_ids"].get<std::vector<int32_t>>());
    for (const auto& r : s["runs"]) {
      const double ratio = r["compression_ratio"].get<double>();
      INFO("sample of " << ids.prefill.size() << " context tokens, compression ratio " << ratio);
      std::unique_ptr<Method> method;
      std::unique_ptr<MethodRunner> runner;
      if (ratio > 0) {
        method = MethodRegistry::get().create("keydiff", {}, engine.config());
        runner = std::make_unique<MethodRunner>(*method, KvBudget::compression_ratio(ratio));
      }
      GenerateOptions opt;
      opt.max_new_tokens = ref["max_new_tokens"].get<int>();
      opt.after_prefill = ids.after;
      opt.first_token_can_stop = false;
      const Generation g = generate(engine, *tok, ids.prefill, opt, runner.get());
      ++runs;
      same += g.text == r["answer"].get<std::string>();
      CHECK(g.text == r["answer"].get<std::string>());
    }
  }
  WARN("kvpress pipeline: identical answers on " << same << "/" << runs << " (sample, ratio) runs");
  CHECK(runs >= 24);
}
