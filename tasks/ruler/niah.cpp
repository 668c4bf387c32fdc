// RULER's eight niah tasks (scripts/data/synthetic/niah.py): needles "One of the special magic {values} for
// {key} is: {value}." among noise lines, distractor needles, or Paul Graham essay sentences (split
// with NLTK's Punkt, the needles placed at random depths between sentences), with k keys, v values
// per key and q queried keys as RULER's synthetic.yaml sets them.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>

#include "harness/task/text.hpp"
#include "tasks/ruler/punkt.hpp"
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
  const char* haystack;    // noise, needle or essay
  const char* key_type;    // words or uuids
  const char* value_type;  // numbers or uuids
  size_t k = 1, v = 1, q = 1;
};

const std::map<std::string, Variant>& variants() {
  static const std::map<std::string, Variant> v = {{"niah_single_1", {"noise", "words", "numbers"}},
                                                   {"niah_single_2", {"essay", "words", "numbers"}},
                                                   {"niah_single_3", {"essay", "words", "uuids"}},
                                                   {"niah_multikey_1", {"essay", "words", "numbers", 4}},
                                                   {"niah_multikey_2", {"needle", "words", "numbers"}},
                                                   {"niah_multikey_3", {"needle", "uuids", "uuids"}},
                                                   {"niah_multivalue", {"essay", "words", "numbers", 1, 4}},
                                                   {"niah_multiquery", {"essay", "words", "numbers", 4, 1, 4}}};
  return v;
}

// np.round(np.linspace(0, 100, 40)).astype(int): the depths (percent) needles are drawn from.
const std::vector<int>& depths() {
  static const std::vector<int> d = [] {
    std::vector<int> out;
    const double step = 100.0 / 39.0;
    for (int i = 0; i < 39; ++i) out.push_back(static_cast<int>(std::nearbyint(i * step)));
    out.push_back(100);
    return out;
  }();
  return d;
}

class Niah final : public RulerTask {
 public:
  Niah(const TaskContext& ctx, const Params& p) : RulerTask(ctx, p, 128), v_(variants().at(name_)) {
    essay_ = std::string(v_.haystack) == "essay";
    if (std::string(v_.key_type) == "words" || std::string(v_.value_type) == "words")
      words_ = std::make_unique<WordPairs>(read_word_list(ctx.data_dir + "/wonderwords/adjectivelist.txt"),
                                           read_word_list(ctx.data_dir + "/wonderwords/nounlist.txt"));
    if (essay_) {
      // RULER's essay file joins its 49 GitHub essays (these, in this order) and then 169 essays from
      // the web site, which no package ships: up to these essays' ~110K words the haystack is RULER's
      // own, beyond it the set repeats where RULER's would go on.
      const std::string text = python_collapse_space(read_essays(ctx.data_dir, "ruler " + name_).text);
      for (size_t b = 0;;) {  // str.split(" ")
        const size_t e = text.find(' ', b);
        haystack_.push_back(text.substr(b, e == std::string::npos ? std::string::npos : e - b));
        if (e == std::string::npos) break;
        b = e + 1;
      }
      punkt_ = &Punkt::english(ctx.data_dir);
    }
    template_ = kTemplate;
    std::string noun = v_.value_type;
    if (v_.q * v_.v == 1) {  // one answer: the singular template
      for (auto [from, to] : {std::pair{"Some", "A"}, {"are all", "is"}, {"are", "is"}, {"answers", "answer"}})
        template_ = replace_all(template_, from, to);
      noun.pop_back();
    }
    template_ = replace_all(template_, "{type_needle_v}", noun);
    const int inc = essay_ ? 500 : length_ >= 4096 ? 25 : 5;
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

  // The first `units` essay words (the set repeated where it is too short), split into sentences,
  // the needles inserted at sorted random depths.
  std::string essay_context(int units, const std::vector<std::string>& needles) {
    std::string text;
    for (size_t i = 0; i < static_cast<size_t>(units); ++i) text += (i ? " " : "") + haystack_[i % haystack_.size()];
    const auto sents = punkt_->sentences(python_strip(text));
    std::vector<size_t> at = {0};
    for (size_t d : rng_.sample(depths().size(), needles.size()))
      at.push_back(static_cast<size_t>(double(sents.size()) * (double(depths()[d]) / 100.0)));
    std::sort(at.begin() + 1, at.end());
    at.push_back(sents.size());
    std::vector<std::string> parts;
    for (size_t i = 1; i < at.size(); ++i) {
      std::string run;
      for (size_t s = at[i - 1]; s < at[i]; ++s) run += (s > at[i - 1] ? " " : "") + sents[s];
      parts.push_back(std::move(run));
      if (i - 1 < needles.size()) parts.push_back(needles[i - 1]);
    }
    std::string context;
    for (size_t i = 0; i < parts.size(); ++i) context += (i ? " " : "") + parts[i];
    return context;
  }

  std::string line_context(int units, const std::vector<std::string>& needles) {
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
    for (size_t i = 0; i < idx.size(); ++i)
      lines.insert(lines.begin() + static_cast<std::ptrdiff_t>(idx[i]), needles[i]);
    std::string context;
    for (size_t i = 0; i < lines.size(); ++i) context += (i ? "\n" : "") + lines[i];
    return context;
  }

  Built build(int units) {
    std::vector<std::string> keys, needles;
    std::vector<std::vector<std::string>> values;
    for (size_t i = 0; i < v_.k; ++i) {
      keys.push_back(draw(v_.key_type));
      values.emplace_back();
      for (size_t j = 0; j < v_.v; ++j) {
        values.back().push_back(draw(v_.value_type));
        needles.push_back(needle(keys.back(), values.back().back()));
      }
    }
    PyRandom(seed_).shuffle(needles);
    const std::string context = essay_ ? essay_context(units, needles) : line_context(units, needles);
    Built b;
    std::string query;
    const auto picked = rng_.sample(v_.k, v_.q);
    for (size_t i = 0; i < picked.size(); ++i) {
      query += (i == 0 ? "" : i + 1 == picked.size() ? ", and " : ", ") + keys[picked[i]];
      for (const auto& val : values[picked[i]]) b.answers.push_back(val);
    }
    b.input = fill_template(template_, {{"context", context}, {"query", query}});
    b.tokens = count(b.input);
    return b;
  }

  Variant v_;
  bool essay_ = false;
  std::unique_ptr<WordPairs> words_;
  std::vector<std::string> haystack_;  // essay words
  const Punkt* punkt_ = nullptr;
  std::string template_;
};

}  // namespace

std::unique_ptr<Task> make_ruler_niah(const TaskContext& ctx, const Params& p) {
  return std::make_unique<Niah>(ctx, p);
}

}  // namespace kvb
