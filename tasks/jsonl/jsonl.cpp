// A researcher's own data as a task: a JSONL file of samples, each a context, a question and the
// reference answers (and optionally its own id and generation length), scored with a metric chosen
// from the benchmarks' own (LongBench's QA F1, ROUGE-L and code similarity, SQuAD exact match,
// RULER's string match), so that kvbench runs on data no benchmark ships.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <fstream>

#include "harness/task/jieba.hpp"
#include "harness/task/longbench_metrics.hpp"
#include "harness/task/string_match.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {
namespace {

const std::vector<std::string>& metric_names() {
  static const std::vector<std::string> m = {
      "qa_f1", "rouge", "exact_match", "string_match_all", "string_match_part", "code_sim", "qa_f1_zh", "rouge_zh"};
  return m;
}

// The metric against every answer, the best one (as LongBench scores several references); RULER's
// string match takes all references at once, as its evaluator does. `jieba` for the Chinese metrics.
double metric_score(const std::string& metric, const std::string& prediction, const std::vector<std::string>& answers,
                    const longbench::Jieba* jieba) {
  if (metric == "string_match_all" || metric == "string_match_part")
    return ruler_string_match(prediction, answers, metric == "string_match_part");
  double best = 0;
  for (const auto& a : answers) {
    double s = 0;
    if (metric == "qa_f1")
      s = longbench::qa_f1(prediction, a);
    else if (metric == "rouge")
      s = longbench::rouge_l(prediction, a);
    else if (metric == "exact_match")
      s = longbench::normalize_answer(prediction) == longbench::normalize_answer(a);
    else if (metric == "code_sim")
      s = longbench::code_sim(prediction, a);
    else if (metric == "qa_f1_zh")
      s = longbench::qa_f1_zh(prediction, a, *jieba);
    else
      s = longbench::rouge_zh(prediction, a, *jieba);
    best = std::max(best, s);
  }
  return best;
}

struct Record {
  std::string id, context, question;
  std::vector<std::string> answers;
  int max_new_tokens = 0;  // 0: the task's option
  int line = 0;
};

class JsonlTask final : public Task {
 public:
  JsonlTask(const TaskContext& ctx, const Params& p)
      : path_(p.get("file")),
        metric_(p.get("metric")),
        template_(p.get("template")),
        chat_(p.get_bool("chat")),
        max_new_tokens_(p.integer("max_new_tokens")),
        protocol_(protocol_from(p)),
        answer_prefix_(p.get("answer_prefix")) {
    if (path_.empty()) fail("task jsonl: option 'file' names the JSONL file of samples (context, question, answers)");
    for (const char* slot : {"{context}", "{question}"})
      if (template_.find(slot) == std::string::npos)
        fail("task jsonl: option 'template' must contain {} (given: '{}')", slot, template_);
    try {  // Python's str.format: other braces are fields, {{ and }} literal ones
      fill_template(template_, {{"context", ""}, {"question", ""}});
    } catch (const Error& e) {
      fail("task jsonl: option 'template': {} (write {{{{ and }}}} for literal braces)", e.what());
    }
    if (metric_ == "qa_f1_zh" || metric_ == "rouge_zh") jieba_ = &longbench::Jieba::load(ctx.data_dir);
    load();
  }

  size_t size() const override { return records_.size(); }

  Sample sample(size_t index) const override {
    if (index >= records_.size()) fail("{}: sample {} of {}", path_, index, records_.size());
    const Record& r = records_[index];
    Sample s;
    s.id = r.id;
    s.prompt = fill_template(template_, {{"context", r.context}, {"question", r.question}});
    s.chat = chat_;
    s.answers = r.answers;
    s.max_new_tokens = r.max_new_tokens ? r.max_new_tokens : max_new_tokens_;
    s.meta = {{"line", r.line}, {"metric", metric_}};
    // kvpress's columns: the sample's context and question as they are (the template is not used).
    apply_protocol(s, protocol_, r.context, r.question, answer_prefix_);
    return s;
  }

  double score(const Sample& s, const std::string& prediction) const override {
    return metric_score(metric_, prediction, s.answers, jieba_);
  }

 private:
  void load() {
    std::ifstream in(path_);
    if (!in) fail("{}: cannot read (task jsonl's option 'file')", path_);
    std::map<std::string, int> ids;
    for_each_json_line(in, path_, [&](const nlohmann::json& j, int no) {
      if (!j.is_object()) fail("{}:{}: a sample is a JSON object with context, question and answers", path_, no);
      Record r;
      r.line = no;
      for (const auto& [key, into] : {std::pair{"context", &r.context}, std::pair{"question", &r.question}}) {
        if (!j.contains(key))
          fail("{}:{}: field '{}' is missing (a sample needs context, question and answers)", path_, no, key);
        if (!j[key].is_string()) fail("{}:{}: field '{}' must be a string, found {}", path_, no, key, j[key].dump());
        *into = j[key].get<std::string>();
      }
      if (!j.contains("answers"))
        fail("{}:{}: field 'answers' is missing (a sample needs context, question and answers)", path_, no);
      const auto& a = j["answers"];
      if (a.is_string()) {
        r.answers.push_back(a.get<std::string>());
      } else if (a.is_array() && !a.empty() &&
                 std::all_of(a.begin(), a.end(), [](const auto& x) { return x.is_string(); })) {
        for (const auto& x : a) r.answers.push_back(x.get<std::string>());
      } else {
        fail("{}:{}: field 'answers' must be a string or a non-empty list of strings, found {}", path_, no, a.dump());
      }
      if (j.contains("max_new_tokens")) {
        const auto& m = j["max_new_tokens"];
        if (!m.is_number_integer() || m.get<int64_t>() < 1 || m.get<int64_t>() > 1 << 20)
          fail("{}:{}: field 'max_new_tokens' must be a positive whole number, found {}", path_, no, m.dump());
        r.max_new_tokens = m.get<int>();
      }
      // The id keys the sample's results: the file's own id (or its line), with a digest of what the
      // sample holds, so that an edited sample is run again instead of taking an old result.
      std::string base = fmt::format("line{}", no);
      if (j.contains("id")) {
        if (!j["id"].is_string() && !j["id"].is_number_integer())
          fail("{}:{}: field 'id' must be a string or a whole number, found {}", path_, no, j["id"].dump());
        base = j["id"].is_string() ? j["id"].get<std::string>() : j["id"].dump();
      }
      if (const auto [it, fresh] = ids.emplace(base, no); !fresh)
        fail("{}:{}: id '{}' was used on line {} already", path_, no, base, it->second);
      const nlohmann::json content = {r.context, r.question, r.answers, r.max_new_tokens};
      r.id = fmt::format("{}-{:08x}", base, uint32_t(fnv1a(content.dump())));
      records_.push_back(std::move(r));
      return true;
    });
    if (records_.empty()) fail("{}: no samples", path_);
  }

  std::string path_, metric_, template_;
  bool chat_;
  int max_new_tokens_;
  Protocol protocol_;
  std::string answer_prefix_;
  const longbench::Jieba* jieba_ = nullptr;
  std::vector<Record> records_;
};

const bool registered = register_task(
    {.name = "jsonl",
     .summary = "your own samples: a JSONL file of {context, question, answers[, id, max_new_tokens]} and a metric",
     .options = {ParamSpec::text("file", "", "the JSONL file of samples"),
                 ParamSpec::choice(
                     "metric", "qa_f1", metric_names(),
                     "qa_f1 (LongBench), rouge (ROUGE-L), exact_match (SQuAD normalisation), string_match_all or "
                     "string_match_part (RULER), code_sim, qa_f1_zh, rouge_zh (jieba)"),
                 ParamSpec::text("template", "{context}\n\nQuestion: {question}\nAnswer:",
                                 "the prompt, with {context} and {question} where they go"),
                 ParamSpec::boolean("chat", true, "wrap the prompt in the model's chat template"),
                 ParamSpec::integer("max_new_tokens", 64, 1, 1 << 20,
                                    "tokens to generate, where a sample does not say"),
                 protocol_option(), max_context_option(),
                 ParamSpec::text("answer_prefix", "",
                                 "under protocol=kvpress*: the text after the assistant header that opens the answer "
                                 "(the sample's context and question are then the parts, without the template)")},
     .make = [](const TaskContext& ctx, const Params& p) { return std::make_unique<JsonlTask>(ctx, p); },
     // A prediction made elsewhere, scored by the metric the name gives (jsonl/qa_f1).
     .score_prediction =
         [](const PredictionToScore& p) {
           const bool zh = p.variant == "qa_f1_zh" || p.variant == "rouge_zh";
           return metric_score(p.variant, p.prediction, p.answers, zh ? &longbench::Jieba::load(p.data_dir) : nullptr);
         },
     .score_variant_option = "metric"});

}  // namespace
}  // namespace kvb
