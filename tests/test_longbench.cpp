// LongBench metrics against golden scores from the reference packages (rouge 1.0.1, fuzzywuzzy with
// python-Levenshtein) and LongBench's metric rules: tools/reference/longbench_metrics.py.
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "tasks/longbench/metrics.hpp"
#include "tasks/task.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

TEST_CASE("LongBench metrics equal the reference on 431 constructed cases", "[tasks][longbench]") {
  std::ifstream in(fixture("longbench/metric_cases.json"));
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  int n = 0;
  for (const auto& c : j.at("cases")) {
    const std::string metric = c.at("metric"), pred = c.at("prediction"), ans = c.at("answer");
    const double want = c.at("score");
    std::vector<std::string> classes;
    if (c.contains("all_classes")) classes = c.at("all_classes").get<std::vector<std::string>>();
    double got = -1;
    if (metric == "qa_f1") got = longbench::qa_f1(pred, ans);
    else if (metric == "rouge") got = longbench::rouge_l(pred, ans);
    else if (metric == "classification") got = longbench::classification(pred, ans, classes);
    else if (metric == "classification_first_line") got = longbench::score("trec", pred, {ans}, classes);
    else if (metric == "count") got = longbench::count(pred, ans);
    else if (metric == "retrieval") got = longbench::retrieval(pred, ans, false);
    else if (metric == "retrieval_zh") got = longbench::retrieval(pred, ans, true);
    else if (metric == "code_sim") got = longbench::code_sim(pred, ans);
    INFO(metric << " | prediction: " << pred << " | answer: " << ans);
    CHECK(std::abs(got - want) <= 1e-6);
    ++n;
  }
  CHECK(n >= 300);
}

TEST_CASE("LongBench spec examples and dataset metric table", "[tasks][longbench]") {
  CHECK(longbench::normalize_answer("The  Cat, an apple!") == "cat apple");
  CHECK(longbench::retrieval("Paragraph 3 or Paragraph 13", "Paragraph 3", false) == 0.5);
  CHECK(longbench::first_line("\n\nLocation\nHuman") == "Location");
  CHECK(longbench::score("multi_news", "", {"a summary."}, {}) == 0.0);
  CHECK(longbench::score("triviaqa", "\nParis\nLondon", {"London", "Paris"}, {}) == 1.0);
  CHECK(longbench::metric_of("repobench-p") == "code_sim");
  require_error([] { longbench::metric_of("nope"); }, {"unknown LongBench dataset 'nope'"});
  require_error([] { longbench::score("dureader", "x", {"y"}, {}); }, {"dureader", "jieba"});
  require_error([] { longbench::retrieval("1", "no id here", false); }, {"names no paragraph"});
}

namespace {

std::unique_ptr<Task> longbench_task(const Tokenizer& tok, const std::string& dir,
                                     std::map<std::string, std::string> options) {
  TaskContext ctx;
  ctx.tokenizer = &tok;
  ctx.data_dir = fixture(dir);
  ctx.options = std::move(options);
  return TaskRegistry::get().create("longbench", ctx);
}

}  // namespace

TEST_CASE("LongBench task: official files, templates, middle truncation, profiles, scoring", "[tasks][longbench]") {
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  auto qasper = longbench_task(*tok, "longbench/data", {{"dataset", "qasper"}});
  REQUIRE(qasper->size() == 2);
  const Sample s = qasper->sample(1);
  CHECK(s.id == "q2");
  // The qasper template: its leading-space quirk and the filled question.
  CHECK(s.prompt.rfind("You are given a scientific article and a question.", 0) == 0);
  CHECK(s.prompt.find("\n\n Answer the question based on the above article") != std::string::npos);
  CHECK(s.prompt.find("Question: Who wrote the letter?\n\nAnswer:") != std::string::npos);
  CHECK(s.max_new_tokens == 128);
  CHECK(s.min_new_tokens == 1);  // pyramidkv2024 sets min_length on every dataset
  CHECK_FALSE(s.chat);
  CHECK(qasper->score(s, "Mara wrote it.") == 1.0);

  // Middle truncation keeps max_len tokens' worth of text from both ends.
  auto cut = longbench_task(*tok, "longbench/data", {{"dataset", "qasper"}, {"max_len", "100"}});
  const Sample c = cut->sample(0);
  CHECK(c.meta["truncated"] == true);
  const auto n = tok->encode_prompt(c.prompt).size();
  CHECK(n >= 96);
  CHECK(n <= 104);
  CHECK(c.prompt.rfind("You are given a scientific article", 0) == 0);
  CHECK(c.prompt.size() > 20);
  CHECK(c.prompt.substr(c.prompt.size() - 9) == "\n\nAnswer:");

  auto official = longbench_task(*tok, "longbench/data", {{"dataset", "qasper"}, {"profile", "official"}});
  CHECK(official->sample(0).chat);
  CHECK(official->sample(0).min_new_tokens == 0);

  auto trec = longbench_task(*tok, "longbench/data", {{"dataset", "trec"}});
  const Sample t = trec->sample(0);
  CHECK(t.prompt.substr(t.prompt.size() - 5) == "Type:");
  CHECK(trec->score(t, " Location\nQuestion: next") == 1.0);  // first line only
  CHECK(trec->score(t, "Other location") == 0.0);

  require_error([&] { longbench_task(*tok, "longbench/bad", {{"dataset", "qasper"}}); },
                {"bad/longbench/qasper.jsonl:2", "'answers'"});
  require_error([&] { longbench_task(*tok, "longbench/data", {{"dataset", "narrativeqa"}}); },
                {"longbench/narrativeqa.jsonl", "not found"});
  require_error([&] { longbench_task(*tok, "longbench/data", {{"dataset", "vcsum"}}); }, {"vcsum", "jieba"});
}
