// NLTK's Punkt sentence splitter (English tables), against nltk itself on constructed texts and on the
// 49 essays of the haystack, whole and whitespace-collapsed as RULER uses them
// (tools/reference/punkt_reference.py).
#include <fmt/format.h>

#include <filesystem>
#include <fstream>

#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "tasks/ruler/punkt.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

std::string read_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  return {std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>()};
}

std::string fnv(const std::vector<std::string>& sentences) {
  uint64_t h = 0xcbf29ce484222325ull;
  for (size_t i = 0; i < sentences.size(); ++i) {
    if (i) h = (h ^ 0x01u) * 0x100000001b3ull;
    for (unsigned char c : sentences[i]) h = (h ^ c) * 0x100000001b3ull;
  }
  return fmt::format("{:016x}", h);
}

}  // namespace

TEST_CASE("Punkt splits sentences as nltk's sent_tokenize does", "[tasks][ruler][punkt]") {
  if (!setup_data("punkt/english/ortho_context.tab")) return;
  const Punkt& punkt = Punkt::english(default_data_dir());
  const auto golden = nlohmann::json::parse(std::ifstream(fixture("ruler/punkt_cases.json")));
  int same = 0;
  for (const auto& c : golden["cases"]) {
    const std::string text = c["text"];
    INFO(text);
    const bool ok = punkt.sentences(text) == c["sentences"].get<std::vector<std::string>>();
    CHECK(ok);
    same += ok;
  }
  WARN(same << "/" << golden["cases"].size() << " constructed texts split as nltk splits them");
  if (!setup_data("PaulGrahamEssays/addiction.txt")) return;
  int essays = 0;
  for (const auto& e : golden["essays"]) {
    std::string text = read_file(default_data_dir() + "/PaulGrahamEssays/" + e["essay"].get<std::string>());
    if (e["form"] == "collapsed") {
      // RULER: " ".join(re.sub(r"\s+", " ", essay).split(" ")), stripped.
      text = python_strip(python_collapse_space(text));
    }
    INFO(e["essay"] << " " << e["form"]);
    const auto sentences = punkt.sentences(text);
    CHECK(sentences.size() == e["count"].get<size_t>());
    const bool ok = fnv(sentences) == e["fnv1a64"].get<std::string>();
    CHECK(ok);
    essays += ok;
  }
  WARN(essays << "/" << golden["essays"].size() << " essay texts split as nltk splits them");
}

TEST_CASE("Punkt: missing or malformed tables are named", "[tasks][ruler][punkt]") {
  const TempDir tmp("punkt");
  const auto& dir = tmp.path();
  require_error([&] { Punkt p(dir.string()); }, {"abbrev_types.txt", "not found"});
  for (const char* f : {"abbrev_types.txt", "sent_starters.txt", "collocations.tab"}) std::ofstream(dir / f) << "mr\n";
  require_error([&] { Punkt p(dir.string()); }, {"collocations.tab:1", "two fields"});
  std::ofstream(dir / "collocations.tab") << "s.\tbach\n";
  std::ofstream(dir / "ortho_context.tab") << "the\t32\nbach\tx\n";
  require_error([&] { Punkt p(dir.string()); }, {"ortho_context.tab:2", "'bach'", "integer"});
}
