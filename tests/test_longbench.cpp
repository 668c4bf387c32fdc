// LongBench metrics against golden scores from the reference packages (rouge 1.0.1, fuzzywuzzy with
// python-Levenshtein, jieba 0.42.1) and LongBench's metric rules: tools/reference/longbench_metrics.py.
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/model/model_file.hpp"
#include "harness/task/jieba.hpp"
#include "harness/task/longbench_metrics.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "tasks/longbench/longbench.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

TEST_CASE("LongBench metrics equal the reference on 772 constructed cases", "[tasks][longbench]") {
  std::ifstream in(fixture("longbench/metric_cases.json"));
  REQUIRE(in.good());
  const auto j = nlohmann::json::parse(in);
  // The Chinese cases (324 of them) need jieba's tables from scripts/setup.sh.
  const longbench::Jieba* jieba = setup_data("jieba/dict.txt") ? &longbench::Jieba::load(default_data_dir()) : nullptr;
  int n = 0;
  for (const auto& c : j.at("cases")) {
    const std::string metric = c.at("metric"), pred = c.at("prediction"), ans = c.at("answer");
    if (!jieba && metric.ends_with("_zh") && metric != "retrieval_zh") continue;
    const double want = c.at("score");
    std::vector<std::string> classes;
    if (c.contains("all_classes")) classes = c.at("all_classes").get<std::vector<std::string>>();
    double got = -1;
    if (metric == "qa_f1")
      got = longbench::qa_f1(pred, ans);
    else if (metric == "rouge")
      got = longbench::rouge_l(pred, ans);
    else if (metric == "classification")
      got = longbench::classification(pred, ans, classes);
    else if (metric == "classification_first_line")
      got = longbench::score("trec", pred, {ans}, classes);
    else if (metric == "count")
      got = longbench::count(pred, ans);
    else if (metric == "retrieval")
      got = longbench::retrieval(pred, ans, false);
    else if (metric == "retrieval_zh")
      got = longbench::retrieval(pred, ans, true);
    else if (metric == "code_sim")
      got = longbench::code_sim(pred, ans);
    else if (metric == "qa_f1_zh")
      got = longbench::qa_f1_zh(pred, ans, *jieba);
    else if (metric == "rouge_zh")
      got = longbench::rouge_zh(pred, ans, *jieba);
    INFO(metric << " | prediction: " << pred << " | answer: " << ans);
    CHECK(std::abs(got - want) <= 1e-6);
    ++n;
  }
  CHECK(n >= (jieba ? 772 : 448));
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

// Length in code points, as Python's len() on the decoded string.
size_t chars(const std::string& s) {
  return static_cast<size_t>(std::count_if(s.begin(), s.end(), [](char c) { return (c & 0xC0) != 0x80; }));
}

// SHA-256 (FIPS 180-4) as lowercase hex, for the digests of dataset2prompt.json's templates.
std::string sha256_hex(const std::string& msg) {
  static constexpr uint32_t k[64] = {
      0x428a2f98, 0x71374491, 0xb5c0fbcf, 0xe9b5dba5, 0x3956c25b, 0x59f111f1, 0x923f82a4, 0xab1c5ed5,
      0xd807aa98, 0x12835b01, 0x243185be, 0x550c7dc3, 0x72be5d74, 0x80deb1fe, 0x9bdc06a7, 0xc19bf174,
      0xe49b69c1, 0xefbe4786, 0x0fc19dc6, 0x240ca1cc, 0x2de92c6f, 0x4a7484aa, 0x5cb0a9dc, 0x76f988da,
      0x983e5152, 0xa831c66d, 0xb00327c8, 0xbf597fc7, 0xc6e00bf3, 0xd5a79147, 0x06ca6351, 0x14292967,
      0x27b70a85, 0x2e1b2138, 0x4d2c6dfc, 0x53380d13, 0x650a7354, 0x766a0abb, 0x81c2c92e, 0x92722c85,
      0xa2bfe8a1, 0xa81a664b, 0xc24b8b70, 0xc76c51a3, 0xd192e819, 0xd6990624, 0xf40e3585, 0x106aa070,
      0x19a4c116, 0x1e376c08, 0x2748774c, 0x34b0bcb5, 0x391c0cb3, 0x4ed8aa4a, 0x5b9cca4f, 0x682e6ff3,
      0x748f82ee, 0x78a5636f, 0x84c87814, 0x8cc70208, 0x90befffa, 0xa4506ceb, 0xbef9a3f7, 0xc67178f2};
  uint32_t h[8] = {0x6a09e667, 0xbb67ae85, 0x3c6ef372, 0xa54ff53a, 0x510e527f, 0x9b05688c, 0x1f83d9ab, 0x5be0cd19};
  std::string m = msg + '\x80';
  while (m.size() % 64 != 56) m += '\0';
  for (int i = 7; i >= 0; --i) m += static_cast<char>((uint64_t(msg.size()) * 8) >> (8 * i));
  auto rotr = [](uint32_t x, int n) { return (x >> n) | (x << (32 - n)); };
  for (size_t off = 0; off < m.size(); off += 64) {
    uint32_t w[64];
    for (int i = 0; i < 16; ++i)
      w[i] = uint32_t(uint8_t(m[off + 4 * i])) << 24 | uint32_t(uint8_t(m[off + 4 * i + 1])) << 16 |
             uint32_t(uint8_t(m[off + 4 * i + 2])) << 8 | uint32_t(uint8_t(m[off + 4 * i + 3]));
    for (int i = 16; i < 64; ++i)
      w[i] = w[i - 16] + (rotr(w[i - 15], 7) ^ rotr(w[i - 15], 18) ^ (w[i - 15] >> 3)) + w[i - 7] +
             (rotr(w[i - 2], 17) ^ rotr(w[i - 2], 19) ^ (w[i - 2] >> 10));
    uint32_t a = h[0], b = h[1], c = h[2], d = h[3], e = h[4], f = h[5], g = h[6], hh = h[7];
    for (int i = 0; i < 64; ++i) {
      const uint32_t t1 = hh + (rotr(e, 6) ^ rotr(e, 11) ^ rotr(e, 25)) + ((e & f) ^ (~e & g)) + k[i] + w[i];
      const uint32_t t2 = (rotr(a, 2) ^ rotr(a, 13) ^ rotr(a, 22)) + ((a & b) ^ (a & c) ^ (b & c));
      hh = g, g = f, f = e, e = d + t1, d = c, c = b, b = a, a = t1 + t2;
    }
    const uint32_t add[8] = {a, b, c, d, e, f, g, hh};
    for (int i = 0; i < 8; ++i) h[i] += add[i];
  }
  std::string out;
  for (uint32_t x : h) out += fmt::format("{:08x}", x);
  return out;
}

std::unique_ptr<Task> longbench_task(const Tokenizer& tok, const std::string& dir,
                                     std::map<std::string, std::string> options) {
  TaskContext ctx;
  ctx.tokenizer = &tok;
  ctx.data_dir = fixture(dir);
  ctx.options = std::move(options);
  return TaskRegistry::get().create("longbench", ctx);
}

}  // namespace

TEST_CASE("LongBench templates match the SHA-256 prefixes and lengths of the spec", "[tasks][longbench]") {
  CHECK(sha256_hex("abc") == "ba7816bf8f01cfea414140de5dae2223b00361a396177a9cb410ff61f20015ad");
  CHECK(sha256_hex(std::string(100, 'a')) == "2816597888e4a0d3a36b82b83316ab32680eb8f00f8cd3b904d681246d285a0e");
  // dataset2prompt.json's templates: dataset, first 16 hex digits of SHA-256, length in characters.
  const std::vector<std::tuple<std::string, std::string, size_t>> table = {
      {"narrativeqa", "aada7ed24b06abac", 378},
      {"qasper", "0fbdd123fe7f83d6", 725},
      {"multifieldqa_en", "20b4666a2de8a1f7", 201},
      {"hotpotqa", "9ec4ae308865bd0c", 288},
      {"2wikimqa", "9ec4ae308865bd0c", 288},
      {"musique", "9ec4ae308865bd0c", 288},
      {"gov_report", "91c25d585b189ced", 161},
      {"qmsum", "dca23b678fe0183b", 261},
      {"multi_news", "2af3f28c40b902e6", 150},
      {"trec", "0eff8bebdba99d91", 104},
      {"triviaqa", "00a802e6377e72fc", 159},
      {"samsum", "a68d884234907eef", 103},
      {"passage_count", "986550b6c61009c6", 464},
      {"passage_retrieval_en", "39b96b7fa52bdd2a", 320},
      {"lcc", "6a1f24cf0bb83cd9", 67},
      {"repobench-p", "ee9ec182ea5ffeb7", 74},
      {"multifieldqa_zh", "344b3a4e557cd547", 80},
      {"dureader", "ae53329f51b17908", 62},
      {"vcsum", "3e5d8241bc9b512e", 53},
      {"lsht", "f3edabdf7fae53d6", 38},
      {"passage_retrieval_zh", "c1e2346e245eb365", 107}};
  for (const auto& [dataset, digest, length] : table) {
    const std::string& t = longbench::prompt_template(dataset);
    INFO(dataset);
    CHECK(sha256_hex(t).substr(0, 16) == digest);
    CHECK(chars(t) == length);
  }
  require_error([] { longbench::prompt_template("nope"); }, {"unknown LongBench dataset 'nope'"});
}

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

  // transformers 4.x's clean_up_tokenization on each decoded half and on the scored prediction: on where
  // asked, or where the tokenizer's config sets it (auto; a GGUF file carries no such setting).
  {
    const TempDir dir("longbench_clean_up");
    std::filesystem::create_directories(dir / "longbench");
    std::string context;
    for (int i = 0; i < 80; ++i) context += "Mara , the writer , wrote it . ";
    std::ofstream(dir / "longbench" / "qasper.jsonl")
        << nlohmann::json{{"input", "Who wrote it ?"}, {"context", context}, {"answers", {"Mara"}}, {"_id", "c1"}}
               .dump()
        << "\n";
    auto make = [&](const std::string& clean) {
      TaskContext ctx;
      ctx.tokenizer = tok.get();
      ctx.data_dir = dir.path().string();
      ctx.options = {{"dataset", "qasper"}, {"max_len", "300"}, {"clean_up_spaces", clean}};
      return TaskRegistry::get().create("longbench", ctx);
    };
    const Sample plain = make("false")->sample(0), cleaned = make("true")->sample(0);
    CHECK(plain.meta["truncated"] == true);
    CHECK(plain.prompt.find("Mara , the writer") != std::string::npos);
    CHECK(cleaned.meta["clean_up_spaces"] == true);
    CHECK(cleaned.prompt.find(" ,") == std::string::npos);
    CHECK(cleaned.prompt.find(" .") == std::string::npos);
    CHECK(cleaned.prompt.find("Mara, the writer, wrote it.") != std::string::npos);
    CHECK(cleaned.prompt.find("Who wrote it?") != std::string::npos);
    CHECK_FALSE(make("auto")->sample(0).meta.contains("clean_up_spaces"));
    // qa_f1 drops punctuation, so "do n't" is where the clean-up changes a score: "don't" -> "dont".
    CHECK(make("true")->score(cleaned, "Mara do n't") == Approx(2.0 / 3));
    CHECK(make("false")->score(plain, "Mara do n't") == Approx(0.5));
  }
  // Fields of the wrong type are errors naming the line (a class that is not a string threw the JSON
  // library's exception; LongBench-E's records without a length were bucketed as 0 tokens long).
  {
    const TempDir dir("longbench_fields");
    std::filesystem::create_directories(dir / "longbench");
    const nlohmann::json rec = {{"input", "q"}, {"context", "c"}, {"answers", {"a"}}, {"_id", "x1"}};
    auto load = [&](const std::string& task, const std::string& dataset, const nlohmann::json& line) {
      const std::string file = dataset + (task == "longbench-e" ? "_e" : "") + ".jsonl";
      std::ofstream(dir / "longbench" / file) << line.dump() << "\n";
      TaskContext ctx;
      ctx.tokenizer = tok.get();
      ctx.data_dir = dir.path().string();
      ctx.options = {{"dataset", dataset}};
      return TaskRegistry::get().create(task, ctx);
    };
    auto classes = rec;
    classes["all_classes"] = {1, 2};
    require_error([&] { load("longbench", "trec", classes); },
                  {"trec.jsonl:1", "'all_classes' must be a list of strings or null"});
    require_error([&] { load("longbench-e", "qasper", rec); },
                  {"qasper_e.jsonl:1", "'length' must be a non-negative integer"});
    auto text_length = rec;
    text_length["length"] = "9000";
    require_error([&] { load("longbench-e", "qasper", text_length); }, {"qasper_e.jsonl:1", "'length'"});
    auto with_length = rec;
    with_length["length"] = 9000;
    CHECK(load("longbench-e", "qasper", with_length)->size() == 1);
    // Two samples under one _id would share their cells' keys.
    std::ofstream(dir / "longbench" / "qasper.jsonl") << rec.dump() << "\n" << rec.dump() << "\n";
    TaskContext ctx;
    ctx.tokenizer = tok.get();
    ctx.data_dir = dir.path().string();
    ctx.options = {{"dataset", "qasper"}};
    require_error([&] { TaskRegistry::get().create("longbench", ctx); }, {"qasper.jsonl:2", "_id 'x1' is on line 1"});
  }
  auto official = longbench_task(*tok, "longbench/data", {{"dataset", "qasper"}, {"profile", "official"}});
  CHECK(official->sample(0).chat);
  CHECK(official->sample(0).min_new_tokens == 0);

  auto trec = longbench_task(*tok, "longbench/data", {{"dataset", "trec"}});
  const Sample t = trec->sample(0);
  CHECK(t.prompt.substr(t.prompt.size() - 5) == "Type:");
  CHECK(trec->score(t, " Location\nQuestion: next") == 1.0);  // first line only
  CHECK(trec->score(t, "Other location") == 0.0);

  require_error(
      [&] {
        longbench_task(*tok, "longbench/bad", {{"dataset", "qasper"}});
      },
      {"bad/longbench/qasper.jsonl:2", "'answers'"});
  require_error(
      [&] {
        longbench_task(*tok, "longbench/data", {{"dataset", "narrativeqa"}});
      },
      {"longbench/narrativeqa.jsonl", "not found"});
}

TEST_CASE("LongBench Chinese datasets on the official files: templates, reference answers score 1",
          "[tasks][longbench][jieba]") {
  std::string real;
  // The official files, where set-up's data (or $KVBENCH_DATA) holds them.
  if (const std::string dir = default_data_dir() + "/longbench";
      std::filesystem::exists(dir + "/multifieldqa_zh.jsonl") &&
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
  const TempDir tmp("longbench_zh");
  const auto& dir = tmp.path();
  std::filesystem::create_directory_symlink(real, dir / "longbench");
  std::filesystem::create_directory_symlink(std::filesystem::absolute(default_data_dir() + "/jieba"), dir / "jieba");
  TaskContext ctx;
  ctx.tokenizer = tok.get();
  ctx.data_dir = dir.string();
  struct Want {
    std::string dataset, head, tail;
    size_t template_chars;
  };
  // Template lengths of dataset2prompt.json's strings; prompts start and end as dataset2prompt.json's do.
  for (const Want& w : {Want{"multifieldqa_zh", "阅读以下文字并用中文简短回答：\n\n", "\n回答：", 80},
                        Want{"passage_retrieval_zh", "以下是若干段落文字，以及其中一个段落的摘要。",
                             "\"段落2\"等格式\n\n答案是：", 107}}) {
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
        CHECK(chars(s.prompt) == w.template_chars - 16 + chars(raw.at("context")) + chars(raw.at("input")));
      }
      INFO(w.dataset << " record " << i << ": " << s.answers.at(0));
      const double score = task->score(s, s.answers.at(0));
      CHECK(score == 1.0);
      ones += score == 1.0;
    }
    CHECK(ones == 200);
    // Middle truncation through text cuts Chinese characters (several byte-level tokens each) at the
    // seam: each half decodes as Hugging Face decodes, with U+FFFD for the broken character.
    ctx.options = {{"dataset", w.dataset}, {"max_len", "301"}};
    auto cut = TaskRegistry::get().create("longbench", ctx);
    size_t replaced = 0;
    for (size_t i = 0; i < 20; ++i) {
      std::string p;
      REQUIRE_NOTHROW(p = cut->sample(i).prompt);
      CHECK(utf8_invalid_at(p) == std::string::npos);
      replaced += p.find("\xEF\xBF\xBD") != std::string::npos;
    }
    CHECK(replaced > 0);
  }
}

TEST_CASE("LongBench predictions files are scored as eval.py scores them, by length range too", "[tasks][longbench]") {
  std::ifstream in(fixture("longbench/metric_cases.json"));
  REQUIRE(in.good());
  const auto cases = nlohmann::json::parse(in).at("cases");
  const TempDir dir("longbench_score");
  // The golden cases of two metrics as prediction files: qasper (qa_f1) and trec (classification
  // with the first-line rule); lengths spread over LongBench-E's three ranges.
  for (auto [dataset, metric] : {std::pair{"qasper", "qa_f1"}, {"trec", "classification_first_line"}}) {
    INFO(dataset);
    const auto path = (dir / (std::string(dataset) + ".jsonl")).string();
    std::ofstream out(path);
    double sum = 0, range_sum[3] = {0, 0, 0};
    int n = 0, range_n[3] = {0, 0, 0};
    for (const auto& c : cases) {
      if (c.at("metric") != metric) continue;
      const int length = 1500 * (n % 7);  // 0 .. 9000
      nlohmann::json line = {{"pred", c.at("prediction")}, {"answers", {c.at("answer")}}, {"length", length}};
      if (c.contains("all_classes")) line["all_classes"] = c.at("all_classes");
      out << line.dump() << "\n";
      const double s = c.at("score");
      sum += s;
      const int k = length < 4000 ? 0 : length < 8000 ? 1 : 2;
      range_sum[k] += s;
      ++range_n[k];
      ++n;
    }
    out.close();
    REQUIRE(n > 20);
    const auto r = score_predictions_file(std::string("longbench/") + dataset, path, true, "");
    CHECK(r.lines == size_t(n));
    CHECK(r.score == Approx(std::round(100.0 * sum / n * 100.0) / 100.0));
    REQUIRE(r.ranges.size() == 3);
    for (int k = 0; k < 3; ++k)
      CHECK(r.ranges[k].second == Approx(std::round(100.0 * range_sum[k] / range_n[k] * 100.0) / 100.0));
  }

  auto write = [&](const std::string& name, const std::string& text) {
    const auto path = (dir / name).string();
    std::ofstream(path) << text;
    return path;
  };
  const auto ok = R"({"pred": "Paris", "answers": ["Paris"], "length": 10})";
  require_error(
      [&] {
        score_predictions_file("longbench/qasper", write("m.jsonl", std::string(ok) + "\n{\"pred\": \"b\"}\n"), false,
                               "");
      },
      {"m.jsonl:2", "'answers' is missing"});
  require_error([&] { score_predictions_file("longbench/qasper", write("j.jsonl", "{nope\n"), false, ""); },
                {"j.jsonl:1", "not JSON"});
  require_error(
      [&] {
        score_predictions_file("longbench/qasper", write("t.jsonl", R"({"pred": 3, "answers": ["a"]})"), false, "");
      },
      {"t.jsonl:1", "'pred' is not a string"});
  require_error(
      [&] {
        score_predictions_file("longbench/qasper", write("l.jsonl", R"({"pred": "a", "answers": ["a"]})"), true, "");
      },
      {"l.jsonl:1", "'length' is missing"});
  require_error([&] { score_predictions_file("longbench/trec", write("c.jsonl", ok), false, ""); },
                {"c.jsonl:1", "'all_classes'"});
  require_error([&] { score_predictions_file("longbench/qasper", write("e.jsonl", "\n"), false, ""); },
                {"e.jsonl", "no predictions"});
  require_error([&] { score_predictions_file("longbench/nope", write("n.jsonl", ok), false, ""); }, {"nope"});
  // eval.py's round(x, 2) on an exact tie: 1 of 32 right is 3.125, which Python rounds to 3.12.
  std::string tie;
  for (int i = 0; i < 32; ++i)
    tie += fmt::format(R"({{"pred": "{}", "answers": ["3"], "length": 10}})", i == 0 ? "3" : "7") + "\n";
  CHECK(score_predictions_file("longbench/passage_count", write("tie.jsonl", tie), false, "").score == 3.12);
  // fuzzywuzzy's ratio tests equality before emptiness: an empty answer matched by an empty line is 100.
  CHECK(longbench::code_sim("", "") == 1.0);
  // An empty range is NaN (null in the JSON the CLI writes), not a division by zero.
  const auto r = score_predictions_file("longbench/qasper", write("one.jsonl", ok), true, "");
  CHECK(r.score == 100.0);
  CHECK(r.ranges[0].second == 100.0);
  CHECK(std::isnan(r.ranges[1].second));
}
