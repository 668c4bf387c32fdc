// GSM8K as lm-evaluation-harness's `gsm8k` task runs it (lm_eval/tasks/gsm8k/gsm8k.yaml, version 3.0):
// five training problems with their worked answers as few-shot examples, drawn for each problem in turn by
// its default sampler (Python's random.sample from one generator seeded 1234), "Question: ...\nAnswer:" for
// the problem, greedy generation until "Question:", "</s>" or "<|im_end|>" (256 tokens at most), and
// the answer read by its two filters: strict-match (the number after "#### ") and flexible-extract (the
// last number in the text), each compared with the reference after its regexes_to_ignore.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>

#include "harness/task/py_random.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/regex.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {
namespace {

using nlohmann::json;

struct Problem {
  std::string question, answer;
  int line = 0;
};

// A GSM8K file as released and as the datasets library writes it: {"question", "answer"} per line, the
// answer a worked solution ending in "#### <number>".
std::vector<Problem> read_problems(const std::string& path, const std::string& option) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot read (task gsm8k's option '{}')", path, option);
  std::vector<Problem> out;
  for_each_json_line(in, path, [&](const json& j, int no) {
    if (!j.is_object()) fail("{}:{}: a GSM8K problem is a JSON object with question and answer", path, no);
    Problem p;
    p.line = no;
    for (const auto& [key, into] : {std::pair{"question", &p.question}, std::pair{"answer", &p.answer}}) {
      if (!j.contains(key)) fail("{}:{}: field '{}' is missing (GSM8K's layout: question and answer)", path, no, key);
      if (!j[key].is_string()) fail("{}:{}: field '{}' must be a string, found {}", path, no, key, j[key].dump());
      *into = j[key].get<std::string>();
    }
    if (p.answer.find("#### ") == std::string::npos)
      fail("{}:{}: field 'answer' must end with '#### <the final answer>', as GSM8K's worked answers do", path, no);
    out.push_back(std::move(p));
    return true;
  });
  if (out.empty()) fail("{}: no problems", path);
  return out;
}

// lm-eval's RegexFilter then take_first: the group_select-th match (Python indexing, -1 the last), its
// first non-empty group (or the whole match for a pattern without groups), stripped; "[invalid]"
// without a match.
std::string regex_filter(const Regex& re, int group_select, const std::string& text) {
  const auto matches = re.find_all_groups(text);
  if (matches.empty()) return "[invalid]";
  const Regex::Match& m = matches[group_select < 0 ? matches.size() - size_t(-group_select) : size_t(group_select)];
  if (m.groups.empty())
    return python_strip(std::string_view(text).substr(m.whole.first, m.whole.second - m.whole.first));
  for (const auto& g : m.groups)
    if (g && g->second > g->first) return python_strip(std::string_view(text).substr(g->first, g->second - g->first));
  return "[invalid]";
}

// The filters of gsm8k.yaml, by the names its results carry.
std::string extract(const std::string& metric, const std::string& response) {
  static const Regex strict("#### (\\-?[0-9\\.\\,]+)");
  static const Regex flexible("(-?[$0-9.,]{2,})|(-?[0-9]+)");
  return metric == "strict" ? regex_filter(strict, 0, response) : regex_filter(flexible, -1, response);
}

// exact_match with gsm8k.yaml's settings: each of regexes_to_ignore removed in turn (re.sub; none of
// them matches empty text), then ignore_case.
std::string normalized(std::string s) {
  static const std::vector<std::unique_ptr<Regex>> ignore = [] {
    std::vector<std::unique_ptr<Regex>> r;
    for (const char* p : {",", "\\$", "(?s).*#### ", "\\.$"}) r.push_back(std::make_unique<Regex>(p));
    return r;
  }();
  for (const auto& re : ignore) {
    std::string kept;
    size_t from = 0;
    for (const auto& [b, e] : re->find_all(s)) {
      kept.append(s, from, b - from);
      from = e;
    }
    s = kept + s.substr(from);
  }
  return python_lower(s);
}

double score_answer(const std::string& metric, const std::string& response, const std::string& reference) {
  return normalized(extract(metric, response)) == normalized(reference) ? 1.0 : 0.0;
}

class Gsm8k final : public Task {
 public:
  Gsm8k(const TaskContext& ctx, const Params& p)
      : metric_(p.get("metric")), max_new_tokens_(int(p.integer("max_new_tokens"))) {
    path_ = p.get("file").empty() ? ctx.data_dir + "/gsm8k/test.jsonl" : p.get("file");
    problems_ = read_problems(path_, "file");
    // lm-eval's default sampler: one generator for the run, random.sample(train, n) per problem in file
    // order, so a problem's examples depend on those drawn before it (a --limit run draws the same).
    if (const long shots = p.integer("num_fewshot"); shots > 0) {
      const std::string train =
          p.get("fewshot_file").empty() ? ctx.data_dir + "/gsm8k/train.jsonl" : p.get("fewshot_file");
      const auto examples = read_problems(train, "fewshot_file");
      if (examples.size() < size_t(shots))
        fail("{}: {} problems, fewer than num_fewshot={} (task gsm8k's option 'fewshot_file')", train, examples.size(),
             shots);
      PyRandom rnd(uint64_t(p.integer("fewshot_seed")));
      for (size_t i = 0; i < problems_.size(); ++i) {
        std::string& context = fewshot_.emplace_back();
        for (const size_t e : rnd.sample(examples.size(), size_t(shots)))
          context += "Question: " + examples[e].question + "\nAnswer: " + examples[e].answer + "\n\n";
      }
    }
  }

  size_t size() const override { return problems_.size(); }

  Sample sample(size_t index) const override {
    if (index >= problems_.size()) fail("{}: sample {} of {}", path_, index, problems_.size());
    const Problem& q = problems_[index];
    Sample s;
    s.prompt = (fewshot_.empty() ? "" : fewshot_[index]) + "Question: " + q.question + "\nAnswer:";
    // The id keys results: an edited problem or other few-shot examples make another sample.
    s.id = fmt::format("line{}-{:08x}", q.line, uint32_t(fnv1a(json::array({s.prompt, q.answer}).dump())));
    s.answers = {q.answer};
    s.max_new_tokens = max_new_tokens_;
    s.stop = {"Question:", "</s>", "<|im_end|>"};
    s.meta = {{"line", q.line}};
    return s;
  }

  double score(const Sample& s, const std::string& prediction) const override {
    return score_answer(metric_, prediction, s.answers.at(0));
  }

 private:
  std::string metric_, path_;
  std::vector<std::string> fewshot_;  // each problem's examples
  int max_new_tokens_;
  std::vector<Problem> problems_;
};

const bool registered = register_task(
    {.name = "gsm8k",
     .summary = "grade-school math as lm-evaluation-harness's gsm8k task runs it: 5-shot, strict-match or "
                "flexible-extract (--data DIR/gsm8k/{test,train}.jsonl)",
     .options = {ParamSpec::choice("metric", "strict", {"strict", "flexible"},
                                   "strict: the number after '#### ' (lm-eval's strict-match); flexible: the last "
                                   "number in the text (flexible-extract)"),
                 ParamSpec::text("file", "", "the problems, GSM8K's JSONL layout (default <data>/gsm8k/test.jsonl)"),
                 ParamSpec::text("fewshot_file", "",
                                 "the file the few-shot examples are drawn from (default <data>/gsm8k/train.jsonl)"),
                 ParamSpec::integer("num_fewshot", 5, 0, 64, "worked examples before each problem"),
                 ParamSpec::integer("fewshot_seed", 1234, 0, (1L << 31) - 1,
                                    "the examples' draw (lm-eval's fewshot_random_seed)"),
                 ParamSpec::integer("max_new_tokens", 256, 1, 1 << 20, "tokens to generate (lm-eval's max_gen_toks)")},
     .make = [](const TaskContext& ctx, const Params& p) { return std::make_unique<Gsm8k>(ctx, p); },
     // A response made elsewhere against its reference answer (the worked answer or the number alone).
     .score_prediction =
         [](const PredictionToScore& p) {
           if (p.answers.size() != 1) fail("gsm8k scores a response against one reference answer");
           return score_answer(p.variant, p.prediction, p.answers[0]);
         },
     .score_variant_option = "metric",
     .layout = {.title = "GSM8K",
                .column_option = "metric",
                .default_column = "strict",
                .columns = {{"strict", "strict-match"}, {"flexible", "flexible-extract"}},
                .note = "Exact match x 100 of the extracted answer ({shown} filters{left_out})",
                .average = false},
     .scoring_options = {"metric"}});

}  // namespace
}  // namespace kvb
