// LongBench v1 (and LongBench-E) from the official JSONL files (as THUDM/LongBench's pred.py reads them): the
// dataset's prompt template, middle truncation to the model's prompt cap through text, the official
// or the PyramidKV-era chat wrapping, generation lengths, and the metrics of metrics.py.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <fstream>
#include <map>

#include "harness/task/jieba.hpp"
#include "harness/task/longbench_metrics.hpp"
#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"
#include "tasks/longbench/longbench.hpp"

namespace kvb {
namespace {

struct Dataset {
  const char* category;
  int max_new_tokens;
  bool wrap;  // the official pipeline applies the chat template
};

const std::map<std::string, Dataset>& datasets() {
  static const std::map<std::string, Dataset> d = {{"narrativeqa", {"Single-Doc QA", 128, true}},
                                                   {"qasper", {"Single-Doc QA", 128, true}},
                                                   {"multifieldqa_en", {"Single-Doc QA", 64, true}},
                                                   {"multifieldqa_zh", {"Single-Doc QA", 64, true}},
                                                   {"hotpotqa", {"Multi-Doc QA", 32, true}},
                                                   {"2wikimqa", {"Multi-Doc QA", 32, true}},
                                                   {"musique", {"Multi-Doc QA", 32, true}},
                                                   {"dureader", {"Multi-Doc QA", 128, true}},
                                                   {"gov_report", {"Summarization", 512, true}},
                                                   {"qmsum", {"Summarization", 512, true}},
                                                   {"multi_news", {"Summarization", 512, true}},
                                                   {"vcsum", {"Summarization", 512, true}},
                                                   {"trec", {"Few-shot Learning", 64, false}},
                                                   {"triviaqa", {"Few-shot Learning", 32, false}},
                                                   {"samsum", {"Few-shot Learning", 128, false}},
                                                   {"lsht", {"Few-shot Learning", 64, false}},
                                                   {"passage_count", {"Synthetic", 32, true}},
                                                   {"passage_retrieval_en", {"Synthetic", 32, true}},
                                                   {"passage_retrieval_zh", {"Synthetic", 32, true}},
                                                   {"lcc", {"Code", 64, false}},
                                                   {"repobench-p", {"Code", 64, false}}};
  return d;
}

// dataset2prompt.json's templates, byte for byte (their SHA-256 prefixes were checked against those of the
// official file when they were written here; tests check the lengths and tricky spots).
const std::map<std::string, std::string>& templates() {
  static const std::map<std::string, std::string> t = {
      {"2wikimqa",
       "Answer the question based on the given passages. Only give me the answer and do not output any other "
       "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. "
       "Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"},
      {"dureader",
       "请基于给定的文章回答下述问题。\n\n文章：{context}\n\n请基于上述文章回答下面的问题。\n\n问题：{input}\n回答："},
      {"gov_report",
       "You are given a report by a government agency. Write a one-page summary of the "
       "report.\n\nReport:\n{context}\n\nNow, write a one-page summary of the report.\n\nSummary:"},
      {"hotpotqa",
       "Answer the question based on the given passages. Only give me the answer and do not output any other "
       "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. "
       "Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"},
      {"lcc", "Please complete the code given below. \n{context}Next line of code:\n"},
      {"lsht", "请判断给定新闻的类别，下面是一些例子。\n\n{context}\n{input}"},
      {"multi_news",
       "You are given several news passages. Write a one-page summary of all news. \n\nNews:\n{context}\n\nNow, write "
       "a one-page summary of all the news.\n\nSummary:"},
      {"multifieldqa_en",
       "Read the following text and answer briefly.\n\n{context}\n\nNow, answer the following question based on the "
       "above text, only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"},
      {"multifieldqa_zh",
       "阅读以下文字并用中文简短回答：\n\n{context}"
       "\n\n现在请基于上面的文章回答下面的问题，只告诉我答案，不要输出任何其他字词。\n\n问题：{input}\n回答："},
      {"musique",
       "Answer the question based on the given passages. Only give me the answer and do not output any other "
       "words.\n\nThe following are given passages.\n{context}\n\nAnswer the question based on the given passages. "
       "Only give me the answer and do not output any other words.\n\nQuestion: {input}\nAnswer:"},
      {"narrativeqa",
       "You are given a story, which can be either a novel or a movie script, and a question. Answer the question "
       "asconcisely as you can, using a single phrase if possible. Do not provide any explanation.\n\nStory: "
       "{context}\n\nNow, answer the question based on the story asconcisely as you can, using a single phrase if "
       "possible. Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"},
      {"passage_count",
       "There are some paragraphs below sourced from Wikipedia. Some of them may be duplicates. Please carefully read "
       "these paragraphs and determine how many unique paragraphs there are after removing duplicates. In other words, "
       "how many non-repeating paragraphs are there in total?\n\n{context}\n\nPlease enter the final count of unique "
       "paragraphs after removing duplicates. The output format should only contain the number, such as 1, 2, 3, and "
       "so on.\n\nThe final answer is: "},
      {"passage_retrieval_en",
       "Here are 30 paragraphs from Wikipedia, along with an abstract. Please determine which paragraph the abstract "
       "is from.\n\n{context}\n\nThe following is an abstract.\n\n{input}\n\nPlease enter the number of the paragraph "
       "that the abstract is from. The answer format must be like \"Paragraph 1\", \"Paragraph 2\", etc.\n\nThe answer "
       "is: "},
      {"passage_retrieval_zh",
       "以下是若干段落文字，以及其中一个段落的摘要。请确定给定的摘要出自哪一段。\n\n{context}\n\n下面是一个摘要\n\n{"
       "input}\n\n请输入摘要所属段落的编号。答案格式必须是\"段落1\"，\"段落2\"等格式\n\n答案是："},
      {"qasper",
       "You are given a scientific article and a question. Answer the question as concisely as you can, using a single "
       "phrase or sentence if possible. If the question cannot be answered based on the information in the article, "
       "write \"unanswerable\". If the question is a yes/no question, answer \"yes\", \"no\", or \"unanswerable\". Do "
       "not provide any explanation.\n\nArticle: {context}\n\n Answer the question based on the above article as "
       "concisely as you can, using a single phrase or sentence if possible. If the question cannot be answered based "
       "on the information in the article, write \"unanswerable\". If the question is a yes/no question, answer "
       "\"yes\", \"no\", or \"unanswerable\". Do not provide any explanation.\n\nQuestion: {input}\n\nAnswer:"},
      {"qmsum",
       "You are given a meeting transcript and a query containing a question or instruction. Answer the query in one "
       "or more sentences.\n\nTranscript:\n{context}\n\nNow, answer the query based on the above meeting transcript in "
       "one or more sentences.\n\nQuery: {input}\nAnswer:"},
      {"repobench-p", "Please complete the code given below. \n{context}{input}Next line of code:\n"},
      {"samsum",
       "Summarize the dialogue into a few short sentences. The following are some examples.\n\n{context}\n\n{input}"},
      {"trec",
       "Please determine the type of the question below. Here are some examples of questions.\n\n{context}\n{input}"},
      {"triviaqa",
       "Answer the question based on the given passage. Only give me the answer and do not output any other words. The "
       "following are some examples.\n\n{context}\n\n{input}"},
      {"vcsum", "下面有一段会议记录，请你阅读后，写一段总结，总结会议的内容。\n会议记录：\n{context}\n\n会议总结："},
  };
  return t;
}

// kvpress's split of each dataset's prompt (evaluation/benchmarks/longbench/create_huggingface_dataset.py
// at 91773cb): its question template and answer prefix, which end the template above; the context
// part is the template before them. For trec, triviaqa and samsum the answer prefix ends the record's
// input, and kvpress cuts it from there (removesuffix). lcc's records have no input and its template
// none, so its question is empty.
struct KvpressSplit {
  std::string question, answer_prefix;
  bool prefix_ends_input = false;
};

const std::map<std::string, KvpressSplit>& kvpress_splits() {
  static const std::map<std::string, KvpressSplit> s = {
      {"narrativeqa", {"Question: {input}\n\n", "Answer:"}},
      {"qasper", {"Question: {input}\n\n", "Answer:"}},
      {"multifieldqa_en", {"Question: {input}\n", "Answer:"}},
      {"multifieldqa_zh", {"问题：{input}\n", "回答："}},
      {"hotpotqa", {"Question: {input}\n", "Answer:"}},
      {"2wikimqa", {"Question: {input}\n", "Answer:"}},
      {"musique", {"Question: {input}\n", "Answer:"}},
      {"dureader", {"问题：{input}\n", "回答："}},
      {"gov_report", {"Now, write a one-page summary of the report.\n\n", "Summary:"}},
      {"qmsum", {"Query: {input}\n", "Answer:"}},
      {"multi_news", {"Now, write a one-page summary of all the news.\n\n", "Summary:"}},
      {"vcsum", {"", "会议总结："}},
      {"trec", {"{input}", "Type:", true}},
      {"triviaqa", {"{input}", "Answer:", true}},
      {"samsum", {"{input}", "Summary:", true}},
      {"lsht", {"{input}", ""}},
      {"passage_count",
       {"Please enter the final count of unique paragraphs after removing duplicates. The output format should only "
        "contain the number, such as 1, 2, 3, and so on.\n\n",
        "The final answer is: "}},
      {"passage_retrieval_en",
       {"{input}\n\nPlease enter the number of the paragraph that the abstract is from. The answer format must be like "
        "\"Paragraph 1\", \"Paragraph 2\", etc.\n\n",
        "The answer is: "}},
      {"passage_retrieval_zh",
       {"{input}\n\n请输入摘要所属段落的编号。答案格式必须是\"段落1\"，\"段落2\"等格式\n\n", "答案是："}},
      {"lcc", {"", "Next line of code:\n"}},
      {"repobench-p", {"{input}", "Next line of code:\n"}},
  };
  return s;
}

}  // namespace

longbench::SplitTemplate longbench::kvpress_template(const std::string& dataset) {
  const std::string& t = prompt_template(dataset);
  const KvpressSplit& k = kvpress_splits().at(dataset);
  // The template must end with the question (and the prefix, unless the input carries it): what is
  // left before them is the context part.
  const std::string tail = k.prefix_ends_input ? k.question : k.question + k.answer_prefix;
  if (!t.ends_with(tail))
    fail("internal: LongBench {}: kvpress's question and answer prefix do not end its template", dataset);
  return {t.substr(0, t.size() - tail.size()), k.question, k.answer_prefix, k.prefix_ends_input};
}

const std::string& longbench::prompt_template(const std::string& dataset) {
  const auto it = templates().find(dataset);
  if (it == templates().end()) fail("unknown LongBench dataset '{}'", dataset);
  return it->second;
}

namespace {

struct Record {
  std::string id, input, context;
  std::vector<std::string> answers, all_classes;
  int length = 0;
};

class LongBench final : public Task {
 public:
  LongBench(const TaskContext& ctx, const Params& p, bool e_variant)
      : tok_(*ctx.tokenizer),
        dataset_(p.get("dataset")),
        max_len_(p.integer("max_len")),
        official_(p.get("profile") == "official"),
        clean_up_(p.get("clean_up_spaces") == "true" ||
                  (p.get("clean_up_spaces") == "auto" && tok_.clean_up_tokenization_spaces().value_or(false))),
        protocol_(protocol_from(p)) {
    template_ = longbench::prompt_template(dataset_);
    if (protocol_.name != "native") split_ = longbench::kvpress_template(dataset_);
    info_ = datasets().at(dataset_);
    const std::string metric = longbench::metric_of(dataset_);
    if (metric == "qa_f1_zh" || metric == "rouge_zh") jieba_ = &longbench::Jieba::load(ctx.data_dir);
    path_ = fmt::format("{}/longbench/{}{}.jsonl", ctx.data_dir, dataset_, e_variant ? "_e" : "");
    load(e_variant);
  }

  size_t size() const override { return records_.size(); }

  Sample sample(size_t index) const override {
    if (index >= records_.size()) fail("{}: sample {} of {}", path_, index, records_.size());
    const Record& r = records_[index];
    if (split_) return kvpress_sample(r);
    std::string prompt = fill_template(template_, {{"context", r.context}, {"input", r.input}});
    // Middle truncation through text, as pred.py does: the two halves are decoded and joined. Each
    // half is decoded as Hugging Face decodes (a character cut at the seam becomes U+FFFD).
    const auto ids = tok_.encode_prompt(prompt);
    bool truncated = false;
    if (static_cast<int>(ids.size()) > max_len_) {
      const size_t half = static_cast<size_t>(max_len_ / 2);
      prompt = decoded(std::span(ids).first(half)) + decoded(std::span(ids).last(half));
      truncated = true;
    }
    Sample s;
    s.id = r.id;
    s.prompt = prompt;
    s.chat = official_ && info_.wrap;
    s.answers = r.answers;
    s.max_new_tokens = info_.max_new_tokens;
    s.min_new_tokens = official_ ? (dataset_ == "samsum" ? 1 : 0) : 1;
    // pred.py's samsum: the newline's token joins the end-of-generation ids, so min_length keeps it from
    // being the first token (a stop string would end at a first "\n" with nothing generated).
    if (official_ && dataset_ == "samsum") s.end_texts = {"\n"};
    s.meta = {{"dataset", dataset_},
              {"category", info_.category},
              {"length", r.length},
              {"truncated", truncated},
              {"all_classes", r.all_classes}};
    if (clean_up_) s.meta["clean_up_spaces"] = true;
    return s;
  }

  // Text of ids as the papers' transformers 4.x decodes it (skip_special_tokens=True): a character cut
  // at either end becomes U+FFFD, and clean_up_tokenization applies where the tokenizer's config sets
  // clean_up_tokenization_spaces (clean_up_spaces=auto) or the option asks for it.
  std::string decoded(std::span<const int32_t> ids) const {
    std::string text = utf8_lossy(tok_.decode(ids, true));
    return clean_up_ ? clean_up_tokenization(std::move(text)) : text;
  }

  // kvpress's LongBench: its split of the prompt, no truncation, max_new_tokens + 20 (its generous
  // margin), the chat template on every prompt and no stop string (apply_protocol).
  Sample kvpress_sample(const Record& r) const {
    Sample s;
    s.id = r.id;
    s.answers = r.answers;
    s.max_new_tokens = info_.max_new_tokens + 20;
    s.meta = {{"dataset", dataset_},
              {"category", info_.category},
              {"length", r.length},
              {"truncated", false},
              {"all_classes", r.all_classes}};
    if (clean_up_) s.meta["clean_up_spaces"] = true;
    std::string input = r.input;
    if (split_->prefix_ends_input && input.ends_with(split_->answer_prefix))
      input.resize(input.size() - split_->answer_prefix.size());
    apply_protocol(s, protocol_, fill_template(split_->context, {{"context", r.context}, {"input", r.input}}),
                   fill_template(split_->question, {{"input", input}}), split_->answer_prefix);
    return s;
  }

  // A prediction of this harness is scored as the papers' decode would have written it (pred.py's
  // tokenizer.decode); the record keeps the text as generated.
  double score(const Sample& s, const std::string& prediction) const override {
    return longbench::score(dataset_,
                            s.meta.value("clean_up_spaces", false) ? clean_up_tokenization(prediction) : prediction,
                            s.answers, s.meta.at("all_classes").get<std::vector<std::string>>(), jieba_);
  }

 private:
  void load(bool e_variant) {
    std::ifstream in(path_);
    if (!in)
      fail(
          "{}: not found; point --data at a directory holding longbench/<dataset>.jsonl from the official "
          "LongBench data.zip",
          path_);
    std::map<std::string, int> lines;  // _id -> its line: a sample's id keys its cells
    for_each_json_line(in, path_, [&](const nlohmann::json& j, int no) {
      auto need = [&](const char* key, auto check, const char* what) {
        if (!j.contains(key) || !check(j[key])) fail("{}:{}: field '{}' must be {}", path_, no, key, what);
      };
      need(
          "input", [](const auto& v) { return v.is_string(); }, "a string");
      need(
          "context", [](const auto& v) { return v.is_string(); }, "a string");
      need(
          "answers", [](const auto& v) { return v.is_array() && !v.empty(); }, "a non-empty list of strings");
      need(
          "_id", [](const auto& v) { return v.is_string(); }, "a string");
      Record r;
      r.id = j["_id"];
      if (const auto [it, fresh] = lines.emplace(r.id, no); !fresh)
        fail("{}:{}: _id '{}' is on line {} already; each sample needs its own", path_, no, r.id, it->second);
      r.input = j["input"];
      r.context = j["context"];
      for (const auto& a : j["answers"]) {
        if (!a.is_string()) fail("{}:{}: field 'answers' must be a list of strings", path_, no);
        r.answers.push_back(a);
      }
      if (j.contains("all_classes") && !j["all_classes"].is_null()) {
        need(
            "all_classes",
            [](const auto& v) {
              return v.is_array() && std::all_of(v.begin(), v.end(), [](const auto& c) { return c.is_string(); });
            },
            "a list of strings or null");
        for (const auto& c : j["all_classes"]) r.all_classes.push_back(c);
      }
      if ((dataset_ == "trec" || dataset_ == "lsht") && r.all_classes.empty())
        fail("{}:{}: field 'all_classes' must list the labels for {}", path_, no, dataset_);
      // LongBench-E's scorer buckets every record by its length (eval.py --e reads it unchecked).
      if (e_variant)
        need(
            "length", [](const auto& v) { return v.is_number_integer() && v.template get<int64_t>() >= 0; },
            "a non-negative integer (LongBench-E scores by length range)");
      if (j.contains("length") && j["length"].is_number_integer()) r.length = j["length"];
      if (j.contains("dataset") && j["dataset"].is_string() && j["dataset"] != dataset_ &&
          j["dataset"] != dataset_ + "_e")
        fail("{}:{}: record of dataset '{}' in the file of '{}'", path_, no, j["dataset"].get<std::string>(), dataset_);
      records_.push_back(std::move(r));
      return true;
    });
    if (records_.empty()) fail("{}: no records", path_);
  }

  const Tokenizer& tok_;
  std::string dataset_, template_, path_;
  Dataset info_{};
  int max_len_;
  bool official_, clean_up_;
  Protocol protocol_;
  std::optional<longbench::SplitTemplate> split_;  // kvpress's, under a kvpress protocol
  const longbench::Jieba* jieba_ = nullptr;        // the segmenter of the Chinese metrics
  std::vector<Record> records_;
};

std::vector<ParamSpec> options() {
  std::vector<std::string> names;
  for (const auto& [n, _] : datasets()) names.push_back(n);
  return {ParamSpec::choice("dataset", "qasper", names, "LongBench dataset"),
          ParamSpec::integer("max_len", 7950, 64, 10000000,
                             "prompt cap in tokens before middle truncation (KVCache-Factory: Llama-3 7950, "
                             "Mistral 31500)"),
          ParamSpec::choice("profile", "pyramidkv2024", {"pyramidkv2024", "official"},
                            "pyramidkv2024: no chat template, one new token at least; official: pred.py's "
                            "chat datasets, lengths and samsum stop, with the model's own chat template and "
                            "max_len still 7950 (protocol=kvpress* replaces both with kvpress's)"),
          protocol_option(),
          max_context_option(),
          ParamSpec::choice(
              "clean_up_spaces", "false", {"false", "true", "auto"},
              "transformers 4.x's clean_up_tokenization (\" .\" -> \".\" ...) on the truncated prompt's "
              "halves and the prediction, as pred.py's decode applies it; auto: where the model "
              "directory's tokenizer_config.json sets clean_up_tokenization_spaces (Llama-3's does; "
              "GGUF files carry no such setting; where it is absent, auto is false, while transformers before "
              "4.45 cleaned up: set true for those)")
              .added_later()};
}

// The papers' LongBench table: the datasets by category, the Chinese ones closing each category.
TaskLayout layout(bool e) {
  TaskLayout l{.title = e ? "LongBench-E" : "LongBench",
               .column_option = "dataset",
               .columns = {{"narrativeqa", "NrtvQA", "Single-Doc QA"},
                           {"qasper", "Qasper", "Single-Doc QA"},
                           {"multifieldqa_en", "MF-en", "Single-Doc QA"},
                           {"multifieldqa_zh", "MF-zh", "Single-Doc QA"},
                           {"hotpotqa", "HotpotQA", "Multi-Doc QA"},
                           {"2wikimqa", "2WikiMQA", "Multi-Doc QA"},
                           {"musique", "Musique", "Multi-Doc QA"},
                           {"dureader", "DuReader", "Multi-Doc QA"},
                           {"gov_report", "GovReport", "Summarization"},
                           {"qmsum", "QMSum", "Summarization"},
                           {"multi_news", "MultiNews", "Summarization"},
                           {"vcsum", "VCSUM", "Summarization"},
                           {"trec", "TREC", "Few-shot Learning"},
                           {"triviaqa", "TriviaQA", "Few-shot Learning"},
                           {"samsum", "SAMSum", "Few-shot Learning"},
                           {"lsht", "LSHT", "Few-shot Learning"},
                           {"passage_count", "PCount", "Synthetic"},
                           {"passage_retrieval_en", "PRe", "Synthetic"},
                           {"passage_retrieval_zh", "PRe-zh", "Synthetic"},
                           {"lcc", "Lcc", "Code"},
                           {"repobench-p", "RB-P", "Code"}},
               .note =
                   "Scores x 100 with each dataset's official metric; Avg. = mean of the {shown} datasets "
                   "shown{left_out}",
               .pooled_options = {"dataset"},
               .percent = PercentRule::HundredTimesSum};
  // LongBench-E's buckets, by the record's own length field as its eval.py reads it.
  if (e) l.length_ranges = {{"0-4k", {0, 4000}}, {"4-8k", {4000, 8000}}, {"8k+", {8000, INT32_MAX}}};
  return l;
}

// A prediction made elsewhere, scored as eval.py scores the dataset (longbench/DATASET).
double score_prediction(const PredictionToScore& p) {
  const std::string metric = longbench::metric_of(p.variant);
  if (metric == "classification" && p.all_classes.empty())
    fail("field 'all_classes' is missing ({} is scored against its classes)", p.variant);
  const longbench::Jieba* jieba =
      metric == "qa_f1_zh" || metric == "rouge_zh" ? &longbench::Jieba::load(p.data_dir) : nullptr;
  return longbench::score(p.variant, p.prediction, p.answers, p.all_classes, jieba);
}

const bool registered =
    register_task(
        {.name = "longbench",
         .summary = "LongBench v1 from the official JSONL files (--data DIR/longbench/<dataset>.jsonl)",
         .options = options(),
         .make = [](const TaskContext& ctx, const Params& p) { return std::make_unique<LongBench>(ctx, p, false); },
         .score_prediction = score_prediction,
         .score_variant_option = "dataset",
         .layout = layout(false)}) &&
    register_task(
        {.name = "longbench-e",
         .summary = "LongBench-E (<dataset>_e.jsonl); records carry length for the 0-4k/4-8k/8k+ buckets",
         .options = options(),
         .make = [](const TaskContext& ctx, const Params& p) { return std::make_unique<LongBench>(ctx, p, true); },
         .score_prediction = score_prediction,
         .score_variant_option = "dataset",
         .layout = layout(true)});

}  // namespace
}  // namespace kvb
