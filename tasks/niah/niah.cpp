// Needle-in-a-Haystack as the PyramidKV / KVCache-Factory and HeadKV repositories run it
// (run_needle_in_haystack.py): Paul Graham essays as the haystack, the San Francisco needle
// inserted at a sentence boundary at each depth, a length x depth grid, and the word-overlap score
// the papers' heatmaps show.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "harness/task/task.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "tasks/niah/niah.hpp"

namespace kvb {
namespace {

constexpr const char* kNeedle =
    "\nThe best thing to do in San Francisco is eat a sandwich and sit in Dolores Park on a sunny day.\n";
constexpr const char* kQuestion = "The best thing to do in San Francisco is: ";
constexpr const char* kAnswer = "eat a sandwich and sit in Dolores Park on a sunny day.";
constexpr int kLengthBuffer = 200;  // final_context_length_buffer
constexpr int kMaxNewTokens = 30;

// The reference prompt in three parts: the book (compressed under every protocol), the question and
// the answer prefix (after compression under protocol=kvpress). <|im_start|> is plain text in the
// reference prompt; no chat template is applied.
PromptSplit parts_of(const std::string& context) {
  return {"<|im_start|> This is a very long story book: <book> " + context + " </book>.\n",
          std::string(" Based on the content of the book, Question: ") + kQuestion + "\n", "Answer:"};
}

class Niah final : public Task {
 public:
  Niah(const TaskContext& ctx, const Params& p)
      : tok_(*ctx.tokenizer), chat_(p.get_bool("chat")), protocol_(protocol_from(p)) {
    const long s = p.get_int("s_len"), e = p.get_int("e_len"), step = p.get_int("step");
    if (e < s) fail("task niah: e_len {} is below s_len {}", e, s);
    for (long L = s; L < e + 1; L += step) lengths_.push_back(static_cast<int>(L));
    const long nd = p.get_int("depths");
    for (long i = 0; i < nd; ++i)
      depths_.push_back(nd == 1 ? 0 : static_cast<int>(std::nearbyint(100.0 * double(i) / double(nd - 1))));
    needle_ = tok_.encode(kNeedle);
    if (lengths_.front() - kLengthBuffer <= static_cast<int>(needle_.size()))
      fail(
          "task niah: s_len {} leaves no room for the haystack (the prompt keeps {} tokens for the question "
          "and the needle takes {})",
          lengths_.front(), kLengthBuffer, needle_.size());
    load_haystack(ctx.data_dir);
    for (int32_t id = 0; id < tok_.vocab_size(); ++id) {
      const std::string t = tok_.token_text(id);
      if (t == "." || t == "\xC4\xA0." || t == "\xE2\x96\x81.") periods_.insert(id);  // ".", "Ġ.", "▁."
    }
    if (periods_.empty()) fail("task niah: the tokenizer has no '.' token to snap the needle to");
  }

  size_t size() const override { return lengths_.size() * depths_.size(); }

  Sample sample(size_t index) const override {
    if (index >= size()) fail("task niah: sample {} of {}", index, size());
    const int L = lengths_[index / depths_.size()], depth = depths_[index % depths_.size()];
    // As run_needle_in_haystack.py builds a context: cut the haystack at L tokens, re-encode, trim for the
    // buffer and the needle, insert the needle after the last period before the depth, decode.
    const std::string cut = tok_.decode(std::span(haystack_).first(static_cast<size_t>(L)), true);
    std::vector<int32_t> t = tok_.encode(cut);
    const size_t room = static_cast<size_t>(L - kLengthBuffer);
    if (t.size() + needle_.size() > room) t.resize(room - needle_.size());
    std::vector<int32_t> ids;
    if (depth == 100) {
      ids = t;
      ids.insert(ids.end(), needle_.begin(), needle_.end());
    } else {
      auto p = static_cast<size_t>(static_cast<double>(t.size()) * (depth / 100.0));
      while (p > 0 && !periods_.count(t[p - 1])) --p;
      ids.assign(t.begin(), t.begin() + static_cast<std::ptrdiff_t>(p));
      ids.insert(ids.end(), needle_.begin(), needle_.end());
      ids.insert(ids.end(), t.begin() + static_cast<std::ptrdiff_t>(p), t.end());
    }
    Sample s;
    s.id = fmt::format("L{}_d{}", L, depth);
    PromptSplit parts = parts_of(tok_.decode(ids, true));
    s.prompt = parts.context + parts.question + parts.answer_prefix;
    s.chat = chat_;
    s.answers = {kAnswer};
    s.max_new_tokens = kMaxNewTokens;
    s.stop = {"\n"};
    s.meta = {{"length", L}, {"depth", depth}, {"haystack_files", files_}, {"context_tokens", ids.size()}};
    apply_protocol(s, protocol_, std::move(parts.context), std::move(parts.question), std::move(parts.answer_prefix));
    return s;
  }

  double score(const Sample&, const std::string& prediction) const override { return niah_score(prediction); }

 private:
  void load_haystack(const std::string& data_dir) {
    // File-name order, as KVCache-Factory since 485af3c.
    Essays essays = read_essays(data_dir, "niah");
    files_ = essays.files;
    const std::string text = std::move(essays.text);
    // Repeat the whole set until it covers the longest context.
    const int longest = *std::max_element(lengths_.begin(), lengths_.end());
    std::string hay = text;
    haystack_ = tok_.encode(hay);
    while (static_cast<int>(haystack_.size()) < longest) {
      hay += text;
      haystack_ = tok_.encode(hay);
    }
  }

  const Tokenizer& tok_;
  bool chat_;
  Protocol protocol_;
  std::vector<int> lengths_, depths_;
  std::vector<int32_t> needle_, haystack_;
  std::set<int32_t> periods_;
  int files_ = 0;
};

const bool registered = register_task(
    {.name = "niah",
     .summary = "Needle-in-a-Haystack (PyramidKV/KVCache-Factory protocol): length x depth grid, word-overlap score",
     .options = {ParamSpec::integer("s_len", 1000, 300, 10000000, "shortest context length (tokens)"),
                 ParamSpec::integer("e_len", 8001, 300, 10000000, "lengths run up to e_len inclusive"),
                 ParamSpec::integer("step", 1000, 1, 10000000, "length step"),
                 ParamSpec::integer("depths", 10, 1, 101, "depth points, round(linspace(0, 100, n)) percent"),
                 ParamSpec::boolean(
                     "chat", false,
                     "wrap the prompt in the model's chat template (the repos do not; instruct-only models "
                     "may need it)"),
                 protocol_option(), max_context_option()},
     .make = [](const TaskContext& ctx, const Params& p) { return std::make_unique<Niah>(ctx, p); },
     // The needle is fixed, so a prediction is scored without its answers.
     .score_prediction = [](const PredictionToScore& p) { return niah_score(p.prediction); },
     // The repositories' heatmap per configuration; the grid's parts pool into one row.
     .layout = {.depth_heatmap = true, .pooled_options = {"s_len", "e_len", "step", "depths"}}});

}  // namespace

// The heatmap score of visualize.py: distinct lowercased words of the response found among the 11 of
// the expected answer (punctuation kept, so "day" without its period does not count).
double niah_score(const std::string& prediction) {
  static const std::vector<std::string> expected_words = python_split(python_lower(kAnswer));
  const std::set<std::string> expected(expected_words.begin(), expected_words.end());
  const auto words = python_split(python_lower(python_strip(prediction)));
  const std::set<std::string> got(words.begin(), words.end());
  size_t hit = 0;
  for (const auto& w : got) hit += expected.count(w);
  return static_cast<double>(hit) / static_cast<double>(expected.size());
}

}  // namespace kvb
