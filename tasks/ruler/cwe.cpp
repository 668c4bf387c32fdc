// RULER's common words extraction (cwe, scripts/data/synthetic/common_words_extraction.py): a numbered
// list in which 10 words repeat more often than the rest, after one few-shot example; the answer is those
// 10 words.
#include <fmt/format.h>

#include <algorithm>

#include "harness/util/error.hpp"
#include "tasks/ruler/ruler.hpp"

namespace kvb {
namespace {

constexpr const char* kTemplate =
    "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones "
    "that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list? Answer: "
    "The top 10 words that appear most often in the list are:";
constexpr size_t kCommon = 10;

std::string numbered(const std::vector<std::string>& words) {
  std::string s;
  for (size_t i = 0; i < words.size(); ++i) s += fmt::format("{}{}. {}", i ? " " : "", i + 1, words[i]);
  return s;
}

class CommonWords final : public RulerTask {
 public:
  CommonWords(const TaskContext& ctx, const Params& p) : RulerTask(ctx, p, 120) {
    for (const char* list : {"nounlist.txt", "adjectivelist.txt", "verblist.txt"})
      for (auto& w : read_word_list(ctx.data_dir + "/wonderwords/" + list)) vocab_.push_back(std::move(w));
    std::sort(vocab_.begin(), vocab_.end());
    vocab_.erase(std::unique(vocab_.begin(), vocab_.end()), vocab_.end());
    PyRandom(seed_).shuffle(vocab_);
    for (auto& f : fit({length_, gen_, 10, 4096, 0, true}, n_samples_, [this](int n) { return build(n); }))
      add(std::move(f.built), {{"units", f.units}});
  }

 private:
  // A numbered list of `n` distinct words, the first 10 repeated `common` times and the rest
  // `uncommon` times, shuffled; returns the list and the 10 common words.
  std::pair<std::string, std::vector<std::string>> example(size_t n, int common, int uncommon) {
    if (n > vocab_.size())
      fail(
          "ruler cwe: {} distinct words needed, the wonderwords lists hold {} (RULER then draws from its "
          "english_words.json, which kvbench does not have); use a shorter length",
          n, vocab_.size());
    std::vector<std::string> chosen;
    for (size_t i : rng_.sample(vocab_.size(), n)) chosen.push_back(vocab_[i]);
    std::vector<std::string> list;
    for (int r = 0; r < common; ++r) list.insert(list.end(), chosen.begin(), chosen.begin() + kCommon);
    for (int r = 0; r < uncommon; ++r) list.insert(list.end(), chosen.begin() + kCommon, chosen.end());
    PyRandom(seed_).shuffle(list);
    return {numbered(list), std::vector<std::string>(chosen.begin(), chosen.begin() + kCommon)};
  }

  Built build(int n) {
    const bool short_input = length_ < 4096;
    const auto shot = short_input ? example(20, 3, 1) : example(40, 10, 3);
    const auto real = short_input ? example(size_t(n), 6, 1) : example(size_t(n), 30, 3);
    Built b;
    b.input = fill_template(kTemplate, {{"context", shot.first}}) + " " + numbered(shot.second) + "\n" +
              fill_template(kTemplate, {{"context", real.first}});
    b.answers = real.second;
    b.tokens = count(b.input);
    return b;
  }

  std::vector<std::string> vocab_;
};

}  // namespace

std::unique_ptr<Task> make_ruler_cwe(const TaskContext& ctx, const Params& p) {
  return std::make_unique<CommonWords>(ctx, p);
}

}  // namespace kvb
