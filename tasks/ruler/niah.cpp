// RULER's niah tasks with noise and needle haystacks (niah_single_1, niah_multikey_2,
// niah_multikey_3): one key, one value, one query. The essay-haystack variants need NLTK's Punkt
// sentence splitter and are not generated yet.
#include <fmt/format.h>

#include <algorithm>

#include "tasks/ruler/ruler.hpp"

namespace kvb {
namespace {

constexpr const char* kTemplate =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
    "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for "
    "{query} mentioned in the provided text? The special magic {type_needle_v} for {query} mentioned in the "
    "provided text are";
constexpr const char* kNoiseLine =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

// sorted(set(adj + "-" + noun)) without holding all ~6 million strings: adjectives sharing a prefix
// form contiguous families in sorted order, and only within a family can the concatenations
// interleave (or coincide), so only those are materialised.
class WordPairs {
 public:
  WordPairs(std::vector<std::string> adj, std::vector<std::string> noun) {
    auto uniq = [](std::vector<std::string>& v) {
      std::sort(v.begin(), v.end());
      v.erase(std::unique(v.begin(), v.end()), v.end());
    };
    uniq(adj);
    uniq(noun);
    nouns_ = std::move(noun);
    for (size_t i = 0; i < adj.size();) {
      size_t j = i + 1;
      while (j < adj.size() && adj[j].compare(0, adj[i].size(), adj[i]) == 0) ++j;
      Family f;
      f.adj = adj[i];
      if (j > i + 1) {
        for (size_t a = i; a < j; ++a)
          for (const auto& n : nouns_) f.words.push_back(adj[a] + "-" + n);
        uniq(f.words);
      }
      f.size = f.words.empty() ? nouns_.size() : f.words.size();
      total_ += f.size;
      families_.push_back(std::move(f));
      starts_.push_back(total_);
      i = j;
    }
  }
  size_t size() const { return total_; }
  std::string at(size_t k) const {
    const size_t f = static_cast<size_t>(std::upper_bound(starts_.begin(), starts_.end(), k) - starts_.begin());
    const size_t off = k - (starts_[f] - families_[f].size);
    return families_[f].words.empty() ? families_[f].adj + "-" + nouns_[off] : families_[f].words[off];
  }

 private:
  struct Family {
    std::string adj;
    std::vector<std::string> words;  // materialised only for multi-adjective families
    size_t size = 0;
  };
  std::vector<std::string> nouns_;
  std::vector<Family> families_;
  std::vector<size_t> starts_;  // cumulative end of each family
  size_t total_ = 0;
};

struct Variant {
  const char* haystack;    // noise or needle
  const char* key_type;    // words or uuids
  const char* value_type;  // numbers or uuids
};

const std::map<std::string, Variant>& variants() {
  static const std::map<std::string, Variant> v = {{"niah_single_1", {"noise", "words", "numbers"}},
                                                   {"niah_multikey_2", {"needle", "words", "numbers"}},
                                                   {"niah_multikey_3", {"needle", "uuids", "uuids"}}};
  return v;
}

class Niah final : public RulerTask {
 public:
  Niah(const TaskContext& ctx, const Params& p) : RulerTask(ctx, p, 128), v_(variants().at(name_)) {
    if (std::string(v_.key_type) == "words" || std::string(v_.value_type) == "words")
      words_ = std::make_unique<WordPairs>(read_word_list(ctx.data_dir + "/wonderwords/adjectivelist.txt"),
                                           read_word_list(ctx.data_dir + "/wonderwords/nounlist.txt"));
    // k = v = q = 1 for these variants: the singular template.
    std::string t = kTemplate;
    for (auto [from, to] : {std::pair{"Some", "A"}, {"are all", "is"}, {"are", "is"}, {"answers", "answer"}})
      t = replace_all(t, from, to);
    const std::string noun = v_.value_type;
    template_ = replace_all(t, "{type_needle_v}", noun.substr(0, noun.size() - 1));
    const int inc = length_ >= 4096 ? 25 : 5;
    for (auto& f : fit({length_, gen_, inc, inc}, n_samples_, [this](int units) { return build(units); }))
      add(std::move(f.built), {{"units", f.units}, {"haystack", v_.haystack}});
  }

 private:
  std::string draw(const char* type) {
    const std::string t = type;
    if (t == "numbers") return std::to_string(rng_.randint(1000000, 9999999));
    if (t == "uuids") return rng_.uuid4();
    return words_->at(rng_.choice_index(words_->size()));
  }
  std::string needle(const std::string& key, const std::string& value) const {
    return fmt::format("One of the special magic {} for {} is: {}.", v_.value_type, key, value);
  }

  Built build(int units) {
    const std::string key = draw(v_.key_type), value = draw(v_.value_type);
    std::vector<std::string> needles = {needle(key, value)};
    PyRandom(seed_).shuffle(needles);
    std::vector<std::string> lines;
    if (std::string(v_.haystack) == "noise") {
      lines.assign(static_cast<size_t>(units), kNoiseLine);
    } else {
      for (int i = 0; i < units; ++i) {
        const std::string k = draw(v_.key_type), val = draw(v_.value_type);
        lines.push_back(needle(k, val));
      }
    }
    auto idx = rng_.sample(static_cast<size_t>(units), needles.size());
    std::sort(idx.rbegin(), idx.rend());
    for (size_t i = 0; i < idx.size(); ++i) lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(idx[i]), needles[i]);
    std::string context;
    for (size_t i = 0; i < lines.size(); ++i) context += (i ? "\n" : "") + lines[i];
    rng_.sample(1, 1);  // the query's key: sample(range(k), q) with k = q = 1
    Built b;
    b.input = fill_template(template_, {{"context", context}, {"query", key}});
    b.answers = {value};
    b.tokens = count(b.input);
    return b;
  }

  Variant v_;
  std::unique_ptr<WordPairs> words_;
  std::string template_;
};

}  // namespace

std::unique_ptr<Task> make_ruler_niah(const TaskContext& ctx, const Params& p) { return std::make_unique<Niah>(ctx, p); }

}  // namespace kvb
