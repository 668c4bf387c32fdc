// LongBench metrics against golden scores from the reference packages (rouge 1.0.1, fuzzywuzzy with
// python-Levenshtein, jieba 0.42.1) and LongBench's metric rules: tools/reference/longbench_metrics.py.
#include <unistd.h>

#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "tasks/longbench/jieba.hpp"
#include "tasks/longbench/metrics.hpp"
#include "tasks/task.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

TEST_CASE("LongBench metrics equal the reference on 745 constructed cases", "[tasks][longbench]") {
  std::ifstream in(fixture("longbench/metric_cases.json"));
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  // The Chinese cases (314 of them) need jieba's tables from scripts/setup.sh.
  const longbench::Jieba* jieba = setup_data("jieba/dict.txt") ? &longbench::Jieba::load(default_data_dir()) : nullptr;
  int n = 0;
  for (const auto& c : j.at("cases")) {
    const std::string metric = c.at("metric"), pred = c.at("prediction"), ans = c.at("answer");
    if (!jieba && metric.ends_with("_zh") && metric != "retrieval_zh") continue;
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
    else if (metric == "qa_f1_zh") got = longbench::qa_f1_zh(pred, ans, *jieba);
    else if (metric == "rouge_zh") got = longbench::rouge_zh(pred, ans, *jieba);
    INFO(metric << " | prediction: " << pred << " | answer: " << ans);
    CHECK(std::abs(got - want) <= 1e-6);
    ++n;
  }
  CHECK(n >= (jieba ? 745 : 431));
}

TEST_CASE("LongBench spec examples and dataset metric table", "[tasks][longbench]") {
  CHECK(longbench::normalize_answer("The  Cat, an apple!") == "cat apple");
  CHECK(longbench::retrieval("Paragraph 3 or Paragraph 13", "Paragraph 3", false) == 0.5);
  CHECK(longbench::first_line("\n\nLocation\nHuman") == "Location");
  CHECK(longbench::score("multi_news", "", {"a summary."}, {}) == 0.0);
  CHECK(longbench::score("triviaqa", "\nParis\nLondon", {"London", "Paris"}, {}) == 1.0);
  CHECK(longbench::metric_of("repobench-p") == "code_sim");
  require_error([] { longbench::metric_of("nope"); }, {"unknown LongBench dataset 'nope'"});
  CHECK(longbench::normalize_zh_answer("《北京》，Beijing！ \u3000 ok.") == "《北京beijingok");
  require_error([] { longbench::score("dureader", "x", {"y"}, {}); }, {"dureader", "rouge_zh", "jieba"});
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
}

TEST_CASE("LongBench Chinese datasets on the official files: templates, reference answers score 1",
          "[tasks][longbench][jieba]") {
  std::string real;
  for (const std::string& dir : {default_data_dir() + "/longbench", std::string("/work/shared/data/longbench")})
    if (real.empty() && std::filesystem::exists(dir + "/multifieldqa_zh.jsonl") &&
        std::filesystem::exists(dir + "/passage_retrieval_zh.jsonl"))
      real = dir;
  if (real.empty()) {
    WARN("skipped: no longbench/multifieldqa_zh.jsonl and passage_retrieval_zh.jsonl");
    return;
  }
  const auto path = model_file(kDefaultModel);
  if (!path || !setup_data("jieba/dict.txt")) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  // A data directory holding the real files next to jieba's tables.
  const auto dir = std::filesystem::temp_directory_path() / fmt::format("kvbench-longbench-zh-{}", ::getpid());
  std::filesystem::create_directories(dir);
  std::filesystem::create_directory_symlink(real, dir / "longbench");
  std::filesystem::create_directory_symlink(std::filesystem::absolute(default_data_dir() + "/jieba"), dir / "jieba");
  TaskContext ctx;
  ctx.tokenizer = tok.get();
  ctx.data_dir = dir.string();
  struct Want {
    std::string dataset, head, tail;
    size_t template_chars;
  };
  // Template lengths from spec/benchmarks.md 1.3; prompts start and end as dataset2prompt.json's do.
  for (const Want& w : {Want{"multifieldqa_zh", "阅读以下文字并用中文简短回答：\n\n", "\n回答：", 80},
                        Want{"passage_retrieval_zh", "以下是若干段落文字，以及其中一个段落的摘要。", "\"段落2\"等格式\n\n答案是：", 107}}) {
    ctx.options = {{"dataset", w.dataset}, {"max_len", "100000"}};
    auto task = TaskRegistry::get().create("longbench", ctx);
    REQUIRE(task->size() == 200);
    const auto raw = read_jsonl(real + "/" + w.dataset + ".jsonl").at(0);
    size_t ones = 0;
    for (size_t i = 0; i < task->size(); ++i) {
      const Sample s = task->sample(i);
      if (i == 0) {
        CHECK(s.prompt.rfind(w.head, 0) == 0);
        CHECK(s.prompt.ends_with(w.tail));
        const auto chars = [](const std::string& x) {
          return static_cast<size_t>(std::count_if(x.begin(), x.end(), [](char c) { return (c & 0xC0) != 0x80; }));
        };
        CHECK(chars(s.prompt) == w.template_chars - 16 + chars(raw.at("context")) + chars(raw.at("input")));
      }
      INFO(w.dataset << " record " << i << ": " << s.answers.at(0));
      const double score = task->score(s, s.answers.at(0));
      CHECK(score == 1.0);
      ones += score == 1.0;
    }
    CHECK(ones == 200);
  }
  std::filesystem::remove_all(dir);
}
