// LongBench metrics against golden scores from the reference packages (rouge 1.0.1, fuzzywuzzy with
// python-Levenshtein) and LongBench's metric rules: tools/reference/longbench_metrics.py.
#include "tasks/longbench/metrics.hpp"
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
