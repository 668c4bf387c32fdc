// Zero-shot multiple choice as lm-evaluation-harness scores it (its arc_challenge, arc_easy, piqa,
// winogrande and hellaswag tasks): every choice is a loglikelihood request built with the task's own
// prompt, and a sample is right when the most likely choice (acc) or the most likely per character
// (acc_norm) is the gold one. The files are the datasets' JSONL layouts, as released or as the
// datasets library writes them.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <regex>

#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {
namespace {

using nlohmann::json;

const std::vector<std::string>& dataset_names() {
  static const std::vector<std::string> n = {"arc_challenge", "arc_easy", "piqa", "winogrande", "hellaswag"};
  return n;
}

struct Where {
  const std::string& path;
  int line;
};

const json& field(const json& j, const char* key, Where w, const char* layout) {
  if (!j.contains(key)) fail("{}:{}: field '{}' is missing ({})", w.path, w.line, key, layout);
  return j[key];
}

std::string text_field(const json& j, const char* key, Where w, const char* layout) {
  const json& v = field(j, key, w, layout);
  if (!v.is_string()) fail("{}:{}: field '{}' must be a string, found {}", w.path, w.line, key, v.dump());
  return v.get<std::string>();
}

// A label given as a whole number or as its digits ("2"), in [0, n).
size_t index_field(const json& v, const char* key, size_t n, Where w) {
  long i = -1;
  if (v.is_number_integer()) {
    i = v.get<long>();
  } else if (v.is_string() && !v.get_ref<const std::string&>().empty() && v.get_ref<const std::string&>().size() < 9 &&
             std::all_of(v.get_ref<const std::string&>().begin(), v.get_ref<const std::string&>().end(),
                         [](char c) { return c >= '0' && c <= '9'; })) {
    i = std::stol(v.get<std::string>());
  }
  if (i < 0 || size_t(i) >= n)
    fail("{}:{}: field '{}' must be the gold choice's index, 0 to {}, found {}", w.path, w.line, key, n - 1, v.dump());
  return size_t(i);
}

// A sample before its choices are encoded: lm-eval's doc_to_text, doc_to_choice and doc_to_target.
struct Doc {
  std::string id;  // the dataset's own id, if it has one
  std::vector<Choice> options;
  size_t gold = 0;
  std::string shown;  // the prompt as a reader sees it
  bool acc_norm = true;
};

// Contexts shared by every choice, each continuation " " + the choice (lm-eval's target_delimiter).
Doc shared_context(std::string context, const std::vector<std::string>& choices, size_t gold) {
  Doc d;
  for (const auto& c : choices) d.options.push_back({context, " " + c, c});
  d.gold = gold;
  d.shown = std::move(context);
  return d;
}

// ARC: {"question": str, "choices": {"text": [...], "label": [...]}, "answerKey"} as the datasets
// library has it, or the released {"question": {"stem", "choices": [{"text", "label"}]}, "answerKey"}.
Doc arc(const json& j, Where w) {
  constexpr const char* layout = "ARC: question, choices and answerKey";
  const json& q = field(j, "question", w, layout);
  std::string stem;
  std::vector<std::string> texts, labels;
  const auto strings = [&](const json& list, const char* key) {
    if (!list.is_array() || list.empty())
      fail("{}:{}: field '{}' must be a non-empty list of strings, found {}", w.path, w.line, key, list.dump());
    std::vector<std::string> out;
    for (const auto& x : list) {
      if (!x.is_string()) fail("{}:{}: field '{}' must hold strings, found {}", w.path, w.line, key, x.dump());
      out.push_back(x.get<std::string>());
    }
    return out;
  };
  if (q.is_object()) {
    stem = text_field(q, "stem", w, layout);
    const json& cs = field(q, "choices", w, layout);
    if (!cs.is_array() || cs.empty())
      fail("{}:{}: field 'question.choices' must be a list of {{text, label}}, found {}", w.path, w.line, cs.dump());
    for (const auto& c : cs) {
      if (!c.is_object()) fail("{}:{}: a choice must be {{text, label}}, found {}", w.path, w.line, c.dump());
      texts.push_back(text_field(c, "text", w, layout));
      labels.push_back(text_field(c, "label", w, layout));
    }
  } else if (q.is_string()) {
    stem = q.get<std::string>();
    const json& cs = field(j, "choices", w, layout);
    if (!cs.is_object())
      fail("{}:{}: field 'choices' must be {{\"text\": [...], \"label\": [...]}}, found {}", w.path, w.line, cs.dump());
    texts = strings(field(cs, "text", w, layout), "choices.text");
    labels = strings(field(cs, "label", w, layout), "choices.label");
    if (texts.size() != labels.size())
      fail("{}:{}: {} choice texts but {} labels", w.path, w.line, texts.size(), labels.size());
  } else {
    fail("{}:{}: field 'question' must be a string or {{stem, choices}}, found {}", w.path, w.line, q.dump());
  }
  const std::string key = text_field(j, "answerKey", w, layout);
  const auto at = std::find(labels.begin(), labels.end(), key);
  if (at == labels.end()) fail("{}:{}: field 'answerKey' is '{}', which no choice's label is", w.path, w.line, key);
  Doc d = shared_context("Question: " + stem + "\nAnswer:", texts, size_t(at - labels.begin()));
  if (j.contains("id") && j["id"].is_string()) d.id = j["id"];
  return d;
}

// PIQA: {"goal", "sol1", "sol2", "label"}; the released files keep the labels in a file of their own
// (`labels`, one per line), the sample's `index` in order (blank lines of the samples file are not samples).
Doc piqa(const json& j, Where w, const std::vector<std::string>& labels, size_t index) {
  constexpr const char* layout = "PIQA: goal, sol1, sol2 and label";
  const std::string goal = text_field(j, "goal", w, layout);
  const std::vector<std::string> sols = {text_field(j, "sol1", w, layout), text_field(j, "sol2", w, layout)};
  size_t gold = 0;
  if (j.contains("label")) {
    gold = index_field(j["label"], "label", 2, w);
  } else {
    if (labels.empty())
      fail("{}:{}: field 'label' is missing (or name the released labels file with option 'labels')", w.path, w.line);
    if (index >= labels.size())
      fail("{}:{}: the labels file has {} lines, fewer than the samples", w.path, w.line, labels.size());
    gold = index_field(json(labels[index]), "label", 2, w);
  }
  Doc d = shared_context("Question: " + goal + "\nAnswer:", sols, gold);
  if (j.contains("id") && j["id"].is_string()) d.id = j["id"];
  return d;
}

// Winogrande: {"sentence" with one "_", "option1", "option2", "answer": "1" or "2"}. lm-eval's
// partial scoring: the contexts differ (the sentence up to the blank, each option filled in) and the
// continuation is the rest of the sentence.
Doc winogrande(const json& j, Where w) {
  constexpr const char* layout = "Winogrande: sentence, option1, option2 and answer";
  const std::string sentence = text_field(j, "sentence", w, layout);
  const size_t blank = sentence.find('_');
  if (blank == std::string::npos) fail("{}:{}: field 'sentence' has no blank '_'", w.path, w.line);
  const std::string answer = text_field(j, "answer", w, layout);
  if (answer != "1" && answer != "2")
    fail("{}:{}: field 'answer' must be \"1\" or \"2\", found \"{}\" (the test split is unlabelled)", w.path, w.line,
         answer);
  const std::string rest = python_strip(std::string_view(sentence).substr(blank + 1));
  Doc d;
  for (const char* key : {"option1", "option2"}) {
    const std::string option = text_field(j, key, w, layout);
    d.options.push_back({sentence.substr(0, blank) + option, " " + rest, option});
  }
  d.acc_norm = false;
  d.gold = answer == "1" ? 0 : 1;
  d.shown = sentence;
  if (j.contains("qID") && j["qID"].is_string()) d.id = j["qID"];
  return d;
}

// lm-eval's hellaswag preprocess(): WikiHow's bracketed markers out, "[title]" as a sentence end.
std::string hellaswag_clean(const std::string& text) {
  // Python's "." (any character but a newline); ECMAScript's also stops at a carriage return.
  static const std::regex bracketed("\\[[^\\n]*?\\]");
  std::string t = python_strip(text);
  for (size_t at = 0; (at = t.find(" [title]", at)) != std::string::npos; at += 2) t.replace(at, 8, ". ");
  t = std::regex_replace(t, bracketed, "");
  for (size_t at = 0; (at = t.find("  ", at)) != std::string::npos; ++at) t.replace(at, 2, " ");
  return t;
}

// HellaSwag: {"activity_label", "ctx_a", "ctx_b", "endings", "label"}.
Doc hellaswag(const json& j, Where w) {
  constexpr const char* layout = "HellaSwag: activity_label, ctx_a, ctx_b, endings and label";
  const std::string activity = text_field(j, "activity_label", w, layout);
  const std::string ctx_a = text_field(j, "ctx_a", w, layout), ctx_b = text_field(j, "ctx_b", w, layout);
  const json& endings = field(j, "endings", w, layout);
  if (!endings.is_array() || endings.empty())
    fail("{}:{}: field 'endings' must be a non-empty list of strings, found {}", w.path, w.line, endings.dump());
  std::vector<std::string> choices;
  for (const auto& e : endings) {
    if (!e.is_string()) fail("{}:{}: field 'endings' must hold strings, found {}", w.path, w.line, e.dump());
    choices.push_back(hellaswag_clean(e.get<std::string>()));
  }
  const size_t gold = index_field(field(j, "label", w, layout), "label", choices.size(), w);
  Doc d = shared_context(hellaswag_clean(activity + ": " + ctx_a + " " + python_capitalize(ctx_b)), choices, gold);
  if (j.contains("ind") && j["ind"].is_number_integer()) d.id = std::to_string(j["ind"].get<long>());
  return d;
}

class MultipleChoice final : public Task {
 public:
  MultipleChoice(const TaskContext& ctx, const Params& p)
      : dataset_(p.get("dataset")), metric_(p.get("metric")), bos_(p.get("bos") == "tokenizer") {
    path_ = p.get("file").empty() ? fmt::format("{}/mc/{}.jsonl", ctx.data_dir, dataset_) : p.get("file");
    std::vector<std::string> labels;
    if (!p.get("labels").empty()) {
      if (dataset_ != "piqa") fail("task mc: option 'labels' is PIQA's released labels file; {} has none", dataset_);
      std::ifstream in(p.get("labels"));
      if (!in) fail("{}: cannot read (task mc's option 'labels')", p.get("labels"));
      for (std::string line; std::getline(in, line);) labels.push_back(python_strip(line));
    }
    std::ifstream in(path_);
    if (!in)
      fail("{}: cannot read (task mc's {} file: give option 'file', or put it at <data>/mc/{}.jsonl)", path_, dataset_,
           dataset_);
    std::map<std::string, int> ids;
    for_each_json_line(in, path_, [&](const json& j, int no) {
      const Where w{path_, no};
      if (!j.is_object()) fail("{}:{}: a sample is a JSON object", path_, no);
      Doc d = dataset_ == "piqa"         ? piqa(j, w, labels, docs_.size())
              : dataset_ == "winogrande" ? winogrande(j, w)
              : dataset_ == "hellaswag"  ? hellaswag(j, w)
                                         : arc(j, w);
      const std::string base = d.id.empty() ? fmt::format("line{}", no) : d.id;
      if (const auto [it, fresh] = ids.emplace(base, no); !fresh)
        fail("{}:{}: id '{}' was used on line {} already", path_, no, base, it->second);
      // An edited sample is a new one: its id carries a digest of what is scored.
      json content = json::array();
      for (const auto& o : d.options) content.push_back({o.context, o.continuation, o.text});
      content.push_back(d.gold);
      d.id = fmt::format("{}-{:08x}", base, uint32_t(fnv1a(content.dump())));
      docs_.push_back(std::move(d));
      lines_.push_back(no);
      return true;
    });
    if (docs_.empty()) fail("{}: no samples", path_);
    // A labels file of another length belongs to other samples (a cut or reordered file): its lines
    // would be some other sample's answers.
    if (!labels.empty() && labels.size() != docs_.size())
      fail("{}: {} lines for the {} samples of {}; the labels file must hold one line per sample, in order",
           p.get("labels"), labels.size(), docs_.size(), path_);
  }

  size_t size() const override { return docs_.size(); }

  Sample sample(size_t index) const override {
    if (index >= docs_.size()) fail("{}: sample {} of {}", path_, index, docs_.size());
    const Doc& d = docs_[index];
    Sample s;
    s.id = d.id;
    s.prompt = d.shown;
    s.answers = {d.options[d.gold].text};
    s.meta = {{"line", lines_[index]}, {"dataset", dataset_}, {"choices", d.options.size()}};
    // lm-eval reports no acc_norm for Winogrande: its acc stands in, as tables reporting acc_norm print it.
    s.choices = Choices{.options = d.options,
                        .gold = d.gold,
                        .bos = bos_,
                        .metric = d.acc_norm ? metric_ : "acc",
                        .acc_norm = d.acc_norm};
    return s;
  }

  double score(const Sample&, const std::string&) const override {
    fail("task mc scores a sample's choices by log-likelihood, not a generated text");
  }

 private:
  std::string dataset_, metric_, path_;
  bool bos_;
  std::vector<Doc> docs_;
  std::vector<int> lines_;
};

const bool registered = register_task(
    {.name = "mc",
     .summary = "zero-shot multiple choice by log-likelihood as lm-evaluation-harness scores it (ARC, PIQA, "
                "Winogrande, HellaSwag; --data DIR/mc/<dataset>.jsonl)",
     .options = {ParamSpec::choice("dataset", "arc_challenge", dataset_names(), "the benchmark"),
                 ParamSpec::text("file", "", "its JSONL file (default <data>/mc/<dataset>.jsonl)"),
                 ParamSpec::text("labels", "", "PIQA's released labels file, for a file without 'label'"),
                 ParamSpec::choice("metric", "acc", {"acc", "acc_norm"},
                                   "acc: the most likely choice; acc_norm: per character where lm-eval reports it "
                                   "(ARC, PIQA, HellaSwag), acc on Winogrande"),
                 ParamSpec::choice("bos", "tokenizer", {"tokenizer", "none"},
                                   "BOS before each context where the tokenizer adds one (lm-eval 0.4.13's "
                                   "default), or never (its add_bos_token=False)")},
     .make = [](const TaskContext& ctx, const Params& p) { return std::make_unique<MultipleChoice>(ctx, p); },
     .layout = {.title = "Zero-shot multiple choice",
                .column_option = "dataset",
                .default_column = "arc_challenge",
                .columns = {{"arc_challenge", "ARC-C"},
                            {"arc_easy", "ARC-E"},
                            {"piqa", "PIQA"},
                            {"winogrande", "Wino"},
                            {"hellaswag", "Hella"}},
                .note = "Accuracy x 100 (acc or acc_norm as the records' metric option says); Avg. = mean of the "
                        "{shown} benchmarks shown{left_out}",
                .pooled_options = {"dataset"}}});

}  // namespace
}  // namespace kvb
