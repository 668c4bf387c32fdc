// jieba precise mode against jieba 0.42.1 itself (tools/reference/jieba_segment.py).
#include "harness/task/jieba.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

TEST_CASE("jieba segmentation equals jieba 0.42.1 on the fixture", "[tasks][longbench][jieba]") {
  if (!setup_data("jieba/dict.txt")) return;
  const auto& jieba = longbench::Jieba::load(default_data_dir());
  std::ifstream in(fixture("longbench/jieba_cases.json"));
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  size_t n = 0, same = 0;
  for (const auto& c : j.at("cases")) {
    const std::string text = c.at("text");
    const auto want = c.at("segments").get<std::vector<std::string>>();
    const auto got = jieba.cut(text);
    INFO("text: " << text << " | got: " << nlohmann::json(got).dump() << " | jieba: " << nlohmann::json(want).dump());
    CHECK(got == want);
    ++n;
    same += got == want;
  }
  CHECK(n >= 300);
  CHECK(same == n);
}

TEST_CASE("jieba: the dictionary route, the HMM, non-Han characters, missing tables", "[tasks][longbench][jieba]") {
  require_error([] { longbench::Jieba::load("/nonexistent-kvbench-data"); },
                {"/nonexistent-kvbench-data/jieba/dict.txt", "scripts/setup.sh"});
  {
    const TempDir tmp("jieba");
    const auto& dir = tmp.path();
    std::filesystem::create_directories(dir / "jieba");
    std::ofstream(dir / "jieba/dict.txt") << "北京 100 ns\n北京大学 x nt\n";
    require_error([&] { longbench::Jieba::load(dir.string()); }, {"jieba/dict.txt:2", "'word frequency [tag]'"});
    std::ofstream(dir / "jieba/dict.txt") << "北京 100 ns\n";
    require_error([&] { longbench::Jieba::load(dir.string()); }, {"jieba/prob_start.json", "scripts/setup.sh"});
  }
  if (!setup_data("jieba/dict.txt")) return;
  const auto& jieba = longbench::Jieba::load(default_data_dir());
  CHECK(&jieba == &longbench::Jieba::load(default_data_dir()));  // loaded once
  using V = std::vector<std::string>;
  CHECK(jieba.cut("").empty());
  CHECK(jieba.cut("我来到北京清华大学") == V{"我", "来到", "北京", "清华大学"});
  CHECK(jieba.cut("a\r\n b") == V{"a", "\r\n", " ", "b"});
  CHECK(jieba.cut("😀中") == V{"😀", "中"});
}

// Not run by default: compares the whole contexts of multifieldqa_zh and passage_retrieval_zh with
// the output of `tools/reference/jieba_segment.py --compare` (too large for a fixture), named by
// KVBENCH_JIEBA_COMPARE, and reports how many records agree.
TEST_CASE("jieba on the real LongBench contexts equals jieba 0.42.1", "[.][jieba-compare]") {
  const char* cmp = std::getenv("KVBENCH_JIEBA_COMPARE");
  REQUIRE(cmp);
  REQUIRE(setup_data("jieba/dict.txt"));
  const auto& jieba = longbench::Jieba::load(default_data_dir());
  const auto want = read_jsonl(cmp);
  std::map<std::string, std::vector<nlohmann::json>> files;
  size_t same = 0;
  for (const auto& w : want) {
    const std::string file = w.at("file");
    auto& rows = files[file];
    if (rows.empty()) rows = read_jsonl(default_data_dir() + "/longbench/" + file + ".jsonl");
    const auto got = jieba.cut(rows.at(w.at("index").get<size_t>()).at("context").get<std::string>());
    const bool ok = got == w.at("segments").get<std::vector<std::string>>();
    if (!ok) WARN(file << " record " << w.at("index") << " differs");
    same += ok;
  }
  WARN(same << " of " << want.size() << " records segment identically");
  CHECK(same == want.size());
}
