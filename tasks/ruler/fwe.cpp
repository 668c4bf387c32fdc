// RULER's frequent words extraction (fwe, scripts/data/synthetic/freq_words_extraction.py): coded
// 6-letter words drawn with Zipf frequencies (alpha 2); the answer is the three most frequent after the
// "..." noise word. Its size search is its own: grow from B / 6 words while the input is under
// B = L - 50 tokens, step back.
#include <cmath>
#include <numbers>
#include <set>

#include "tasks/ruler/ruler.hpp"

namespace kvb {
namespace {

constexpr const char* kTemplate =
    "Read the following coded text and track the frequency of each coded word. Find the three most frequently "
    "appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. "
    "What are the three most frequently appeared words in the above coded text? Answer: According to the coded "
    "text above, the three most frequently appeared words are:";
constexpr int kWordLength = 6;
constexpr double kAlpha = 2.0;

class FrequentWords final : public RulerTask {
 public:
  FrequentWords(const TaskContext& ctx, const Params& p) : RulerTask(ctx, p, 50), budget_(length_ - gen_) {
    const int words = sized(-1).second;
    for (size_t i = 0; i < n_samples_; ++i) {
      auto [b, n] = sized(words);
      add(std::move(b), {{"units", n}});
    }
  }

 private:
  // generate_input_output: a fresh vocabulary, then the word count fitted to the budget.
  std::pair<Built, int> sized(int words) {
    const size_t v = size_t(budget_ / 50);
    std::vector<std::string> vocab;
    auto coded = [this] {
      std::string w;
      for (int i = 0; i < kWordLength; ++i) w += static_cast<char>('a' + static_cast<int>(rng_.random() * 26));
      return w;
    };
    for (size_t i = 0; i < v; ++i) vocab.push_back(coded());
    std::set<std::string> distinct(vocab.begin(), vocab.end());
    while (distinct.size() < v) distinct.insert(coded());
    vocab.assign(distinct.begin(), distinct.end());
    PyRandom(seed_).shuffle(vocab);
    vocab[0] = "...";  // the top rank is noise
    const int inc = budget_ / 32;
    Built b;
    if (words > 0) {
      b = text(vocab, words);
      while (b.tokens > budget_) b = text(vocab, words -= inc);
    } else {
      words = budget_ / kWordLength;
      b = text(vocab, words);
      while (b.tokens < budget_) b = text(vocab, words += inc);
      words -= inc;
    }
    return {text(vocab, words), words};
  }

  Built text(const std::vector<std::string>& vocab, int words) const {
    const double zeta = std::numbers::pi * std::numbers::pi / 6;  // scipy's zeta(2)
    std::vector<std::string> all;
    for (size_t k = 1; k <= vocab.size(); ++k) {
      const auto c = static_cast<long>(double(words) * std::pow(double(k), -kAlpha) / zeta);
      all.insert(all.end(), size_t(c), vocab[k - 1]);
    }
    PyRandom(seed_).shuffle(all);
    std::string context;
    for (size_t i = 0; i < all.size(); ++i) context += (i ? " " : "") + all[i];
    Built b;
    b.input = fill_template(kTemplate, {{"context", context}});
    b.answers = {vocab[1], vocab[2], vocab[3]};
    b.tokens = count(b.input);
    return b;
  }

  int budget_;
};

}  // namespace

std::unique_ptr<Task> make_ruler_fwe(const TaskContext& ctx, const Params& p) {
  return std::make_unique<FrequentWords>(ctx, p);
}

}  // namespace kvb
