// rouge_score's stemmed ROUGE and NLTK's Porter stemmer against golden output of the Python packages
// (tools/reference/rouge_reference.py).
#include <fstream>

#include "harness/task/rouge_score.hpp"
#include "test_util.hpp"

using namespace kvb;
using kvb::test::fixture;

TEST_CASE("Porter stemmer equals NLTK's on every essay word and its special cases", "[rouge]") {
  const auto golden = nlohmann::json::parse(std::ifstream(fixture("rouge/cases.json")));
  size_t same = 0, total = 0;
  for (const auto& [word, stem] : golden["stems"].items()) {
    ++total;
    if (porter_stem(word) == stem.get<std::string>())
      ++same;
    else
      UNSCOPED_INFO(word << ": ours " << porter_stem(word) << ", nltk " << stem.get<std::string>());
  }
  CHECK(total > 5000);
  CHECK(same == total);
}

TEST_CASE("Stemmed ROUGE-1 and ROUGE-2 equal rouge_score's", "[rouge]") {
  const auto golden = nlohmann::json::parse(std::ifstream(fixture("rouge/cases.json")));
  for (const auto& c : golden["rouge"]) {
    const std::string t = c["target"], p = c["prediction"];
    for (int n : {1, 2}) {
      const auto want = c[n == 1 ? "rouge1" : "rouge2"];
      const RougeScore s = rouge_n(t, p, n);
      INFO(t << " | " << p << " | rouge" << n);
      CHECK(s.precision == Approx(want[0].get<double>()).margin(1e-12));
      CHECK(s.recall == Approx(want[1].get<double>()).margin(1e-12));
      CHECK(s.fmeasure == Approx(want[2].get<double>()).margin(1e-12));
    }
  }
}

TEST_CASE("rouge_score's tokenizer: separators, short words unstemmed, U+0130 splits", "[rouge]") {
  CHECK(rouge_tokens("Running dogs ran, it's x86-64!") ==
        std::vector<std::string>{"run", "dog", "ran", "it", "s", "x86", "64"});
  CHECK(rouge_tokens("\xC4\xB0stanbul") == std::vector<std::string>{"i", "stanbul"});
  CHECK(rouge_tokens("  ").empty());
}
