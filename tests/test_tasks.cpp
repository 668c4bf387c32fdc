// Task registry, Python string semantics for metrics, and the Needle-in-a-Haystack task against the
// reference protocol (KVCache-Factory's run_needle_in_haystack.py).
#include <fmt/format.h>

#include <cmath>
#include <filesystem>
#include <fstream>
#include <vector>

#include "harness/model/model_file.hpp"
#include "harness/report/heatmap.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

TEST_CASE("Python str.split, lower and strip semantics", "[tasks]") {
  using V = std::vector<std::string>;
  CHECK(python_split("  a b\t\nc  ") == V{"a", "b", "c"});
  CHECK(python_split("") == V{});
  // \x1c-\x1f, NBSP, ideographic space and U+2028 separate; U+200B (zero width space) does not.
  CHECK(python_split("a\x1c"
                     "b\xC2\xA0"
                     "c\xE3\x80\x80"
                     "d\xE2\x80\xA8"
                     "e") == V{"a", "b", "c", "d", "e"});
  CHECK(python_split("a\xE2\x80\x8B"
                     "b") == V{"a\xE2\x80\x8B"
                               "b"});
  CHECK(python_lower("DAY. \xC3\x89T\xC3\x89 \xCE\xA3") == "day. \xC3\xA9t\xC3\xA9 \xCF\x83");
  CHECK(python_strip("\xC2\xA0 x y \n\xE3\x80\x80") == "x y");
  CHECK(python_strip(" \t ").empty());
}

TEST_CASE("task registry lists niah and rejects unknown tasks and options", "[tasks]") {
  const auto names = TaskRegistry::get().names();
  CHECK(std::find(names.begin(), names.end(), "niah") != names.end());
  require_error([] { TaskRegistry::get().info("nope"); }, {"unknown task 'nope'", "niah"});
}

namespace {

// A small haystack of invented essays in a data directory under root.
std::string write_haystack(const TempDir& root) {
  const auto dir = root / "PaulGrahamEssays";
  std::filesystem::create_directories(dir);
  for (int f = 0; f < 3; ++f) {
    std::ofstream out(dir / ("essay" + std::to_string(f) + ".txt"));
    for (int i = 0; i < 400; ++i)
      out << "Essay " << f << " sentence " << i << " talks about startups, painting and programming. ";
  }
  return dir.parent_path().string();
}

}  // namespace

TEST_CASE("niah: grid, context sizing, needle at a sentence boundary, heatmap score", "[tasks]") {
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  TaskContext ctx;
  ctx.tokenizer = tok.get();
  const TempDir data("haystack");
  ctx.data_dir = write_haystack(data);
  ctx.options = {{"s_len", "1000"}, {"e_len", "3001"}, {"step", "1000"}, {"depths", "10"}};
  auto task = TaskRegistry::get().create("niah", ctx);
  REQUIRE(task->size() == 30);
  const std::vector<int> depths = {0, 11, 22, 33, 44, 56, 67, 78, 89, 100};
  const std::string needle =
      "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n";
  for (size_t i = 0; i < task->size(); ++i) {
    const Sample s = task->sample(i);
    const int L = s.meta["length"], d = s.meta["depth"];
    INFO(s.id);
    CHECK(L == 1000 * static_cast<int>(1 + i / 10));
    CHECK(d == depths[i % 10]);
    // The context keeps 200 tokens for the wrapper and the question: the needle plus haystack fit in L - 200.
    CHECK(s.meta["context_tokens"].get<int>() <= L - 200);
    CHECK(s.meta["context_tokens"].get<int>() >= L - 200 - 5);
    const size_t at = s.prompt.find(needle);
    REQUIRE(at != std::string::npos);
    CHECK(s.prompt.find(needle, at + 1) == std::string::npos);
    if (d == 0)
      CHECK(s.prompt.compare(at - 6, 6, "book> ") == 0);
    else if (d == 100)
      CHECK(s.prompt.compare(at + needle.size(), 8, " </book>") == 0);
    else
      CHECK(s.prompt[at - 1] == '.');  // snapped back to the end of a sentence
    CHECK(s.prompt.rfind("Question: The best thing to do in San Francisco is: \nAnswer:") != std::string::npos);
    CHECK(s.max_new_tokens == 30);
  }
  const Sample s = task->sample(0);
  CHECK(task->score(s, " eat a sandwich and sit in Dolores Park on a sunny day.") == 1.0);
  CHECK(task->score(s, "EAT A SANDWICH AND SIT IN DOLORES PARK ON A SUNNY DAY.") == 1.0);
  CHECK(task->score(s, "eat a sandwich and sit in Dolores Park on a sunny day") == Approx(10.0 / 11));
  CHECK(task->score(s, "eat a sandwich and eat it again.") == Approx(4.0 / 11));
  CHECK(task->score(s, "") == 0.0);

  ctx.options["s_len"] = "250";
  require_error([&] { TaskRegistry::get().create("niah", ctx); }, {"s_len", "250", "[300, 10000000]"});
  ctx.options = {{"lengths", "5"}};
  require_error([&] { TaskRegistry::get().create("niah", ctx); }, {"lengths", "s_len"});
  ctx.options = {};
  ctx.data_dir = "/nonexistent";
  require_error([&] { TaskRegistry::get().create("niah", ctx); }, {"/nonexistent/PaulGrahamEssays", "setup.sh"});
}

TEST_CASE("niah heatmap: colour scale and PNG, SVG, CSV files", "[tasks][report]") {
  const Rgb lo = heatmap_colour(0), mid = heatmap_colour(0.5), hi = heatmap_colour(1), q = heatmap_colour(0.25);
  CHECK((lo.r == 0xF0 && lo.g == 0x49 && lo.b == 0x6E));
  CHECK((mid.r == 0xEB && mid.g == 0xB8 && mid.b == 0x39));
  CHECK((hi.r == 0x0C && hi.g == 0xD7 && hi.b == 0x9F));
  CHECK(q.r == Approx((0xF0 + 0xEB) / 2.0));
  Heatmap h;
  h.title = "Pressure Testing test";
  h.caption = "FullKV Score: 50.00";
  h.cols = {"1000", "2000"};
  h.rows = {"0", "100"};
  h.cells = {{1.0, 0.0}, {0.5, std::nan("")}};
  const TempDir dir("heatmap");
  const std::string stem = (dir / "heatmap").string();
  write_heatmap(h, stem);
  std::ifstream png(stem + ".png", std::ios::binary);
  char sig[8] = {};
  png.read(sig, 8);
  CHECK(std::string(sig + 1, 3) == "PNG");
  std::ifstream svg(stem + ".svg");
  std::string svg_text((std::istreambuf_iterator<char>(svg)), std::istreambuf_iterator<char>());
  CHECK(svg_text.find("<svg") != std::string::npos);
  std::ifstream csv(stem + ".csv");
  std::string csv_text((std::istreambuf_iterator<char>(csv)), std::istreambuf_iterator<char>());
  CHECK(csv_text == "depth_percent,1000,2000\n0,1.0000,0.0000\n100,0.5000,\n");
}

TEST_CASE("benchmark_percent: each script's order of operations, numpy's pairwise mean", "[tasks]") {
  // Found by an audit: 21.75 / 40 is 54.37 to RULER (sum / n * 100) and 54.38 to eval.py (100 * sum / n).
  std::vector<double> s(40, 0.0);
  for (int i = 0; i < 21; ++i) s[size_t(i)] = 1.0;
  s[21] = 0.75;
  CHECK(fmt::format("{:.2f}", benchmark_percent(s, PercentRule::MeanTimes100)) == "54.37");
  CHECK(fmt::format("{:.2f}", benchmark_percent(s, PercentRule::HundredTimesSum)) == "54.38");
  // np.mean's bits (numpy 2.4) where its pairwise sum and an in-order sum differ.
  for (const auto& [n, mean] : {std::pair{300, 0x1.093368a48095ep-1}, std::pair{1000, 0x1.0394417b4646bp-1}}) {
    std::vector<double> v;
    for (int i = 0; i < n; ++i) v.push_back(double((i * 7919) % 1000) / 997.0 + 1.0 / (i + 3));
    CHECK(benchmark_percent(v, PercentRule::NumpyMean) == 100 * mean);
    CHECK(benchmark_percent(v, PercentRule::MeanTimes100) != 100 * mean);
  }
  CHECK(std::isnan(benchmark_percent({}, PercentRule::NumpyMean)));
}

TEST_CASE("predictions made elsewhere are scored through the task registry", "[tasks]") {
  const test::TempDir dir("score_elsewhere");
  auto write = [&](const std::string& name, const std::string& text) {
    const auto path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  };
  // RULER: string_match_all (share of references found) and string_match_part for the QA tasks.
  const auto ruler = write("ruler.jsonl", R"({"pred": "the keys are 12 and 34", "answers": ["12", "56"]})"
                                          "\n"
                                          R"({"pred": "nothing", "answers": ["12"]})"
                                          "\n");
  CHECK(score_predictions_file("ruler/niah_multikey_1", ruler, false, "").score == 25.0);
  CHECK(score_predictions_file("ruler/qa_1", ruler, false, "").score == 50.0);
  CHECK(score_prediction("ruler/qa_2", {.prediction = "56", .answers = {"12", "56"}}) == 1.0);
  // NIAH: the fixed needle's words, answers unused.
  CHECK(score_prediction("niah", {.prediction = "You should eat a sandwich and sit in Dolores Park on a sunny day."}) ==
        1.0);
  // jsonl: the metric named after the task.
  CHECK(score_prediction("jsonl/exact_match", {.prediction = "The Paris.", .answers = {"paris"}}) == 1.0);
  test::require_error([&] { score_prediction("ruler", {.prediction = "x", .answers = {"x"}}); },
                      {"score ruler: no variant given; name the task after the slash", "niah_single_1"});
  test::require_error([&] { score_prediction("jsonl/bleu", {.prediction = "x", .answers = {"x"}}); },
                      {"unknown metric 'bleu'", "qa_f1"});
  test::require_error([&] { score_prediction("niah/x", {.prediction = "x"}); }, {"task niah takes no variant"});
  // The variant is checked before the file is read: its error names no line.
  test::require_error([&] { score_predictions_file("longbench/nope", write("any.jsonl", "not json\n"), false, ""); },
                      {"score longbench/nope: unknown dataset 'nope'"});
  // RULER's evaluator fails on a prediction without references; so does kvbench, naming the line.
  test::require_error(
      [&] { score_predictions_file("ruler/vt", write("none.jsonl", R"({"pred": "a", "answers": []})"), false, ""); },
      {"none.jsonl:1", "'answers' is empty"});
  test::require_error([&] { score_prediction("nosuch/x", {}); }, {"unknown task 'nosuch'"});
  test::require_error([&] { score_predictions_file("ruler/vt", write("bad.jsonl", R"({"pred": "a"})"), false, ""); },
                      {"bad.jsonl:1", "'answers' is missing"});
}
