// RULER's synthetic needle tasks generated natively (spec/benchmarks.md section 2): the noise- and
// needle-haystack niah variants (niah_single_1, niah_multikey_2, niah_multikey_3) with RULER's
// templates, Python-compatible randomness replayed call for call, the 2025 binary-search sizing to a
// target token length with the model's tokenizer, and string_match_all scoring. The essay-haystack
// variants need NLTK's Punkt sentence splitter and are not generated yet.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <numeric>

#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "tasks/ruler/py_random.hpp"
#include "tasks/task.hpp"
#include "tasks/text.hpp"

namespace kvb {
namespace {

constexpr const char* kTemplate =
    "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will "
    "quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for "
    "{query} mentioned in the provided text? The special magic {type_needle_v} for {query} mentioned in the "
    "provided text are";
constexpr const char* kNoiseLine =
    "The grass is green. The sky is blue. The sun is yellow. Here we go. There and back again.";

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail("{}: not found (scripts/setup.sh fetches the wonderwords word lists; or set KVBENCH_DATA)", path);
  std::vector<std::string> out;
  std::string l;
  while (std::getline(in, l)) {
    if (!l.empty() && l.back() == '\r') l.pop_back();
    out.push_back(l);
  }
  if (out.empty()) fail("{}: empty word list", path);
  return out;
}

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
  const char* haystack;  // noise or needle
  const char* key_type;  // words or uuids
  const char* value_type;  // numbers or uuids
};

const std::map<std::string, Variant>& variants() {
  static const std::map<std::string, Variant> v = {{"niah_single_1", {"noise", "words", "numbers"}},
                                                   {"niah_multikey_2", {"needle", "words", "numbers"}},
                                                   {"niah_multikey_3", {"needle", "uuids", "uuids"}}};
  return v;
}

std::string replace_all(std::string s, const std::string& from, const std::string& to) {
  for (size_t at = s.find(from); at != std::string::npos; at = s.find(from, at + to.size())) s.replace(at, from.size(), to);
  return s;
}

class Ruler final : public Task {
 public:
  Ruler(const TaskContext& ctx, const Params& p)
      : tok_(*ctx.tokenizer), name_(p.get("task")), v_(variants().at(name_)),
        length_(static_cast<int>(p.get_int("length"))), rng_(static_cast<uint64_t>(p.get_int("seed"))) {
    if (std::string(v_.key_type) == "words" || std::string(v_.value_type) == "words")
      words_ = std::make_unique<WordPairs>(read_lines(ctx.data_dir + "/wonderwords/adjectivelist.txt"),
                                           read_lines(ctx.data_dir + "/wonderwords/nounlist.txt"));
    // k = v = q = 1 for these variants: the singular template.
    std::string t = kTemplate;
    for (auto [from, to] : {std::pair{"Some", "A"}, {"are all", "is"}, {"are", "is"}, {"answers", "answer"}})
      t = replace_all(t, from, to);
    const std::string noun = v_.value_type;
    template_ = replace_all(t, "{type_needle_v}", noun.substr(0, noun.size() - 1));
    const int inc = length_ >= 4096 ? 25 : 5;
    // Sizing (2025 code): an estimate, a binary search, then per-sample shrinking; every build draws
    // from the same stream, as upstream.
    const double per_unit = double(build(inc).tokens) / inc;
    int lo = inc, hi = std::max(static_cast<int>(length_ / per_unit * 3), 2 * inc), best = 0;
    while (lo <= hi) {
      const int mid = (lo + hi) / 2;
      if (build(mid).tokens + kGen <= length_) {
        best = mid;
        lo = mid + 1;
      } else {
        hi = mid - 1;
      }
    }
    units_ = best ? best : inc;
    const long n = p.get_int("samples");
    for (long i = 0; i < n; ++i) {
      int units = units_;
      Built b = build(units);
      while (b.tokens + kGen > length_ && units > inc) {
        units -= inc;
        b = build(units);
      }
      Sample s;
      s.id = fmt::format("{}_{}_{}", name_, length_, i);
      s.prompt = b.input;
      s.answers = b.answers;
      s.max_new_tokens = kGen;
      s.meta = {{"task", name_}, {"length", b.tokens + kGen}, {"target_length", length_}, {"units", units},
                {"haystack", v_.haystack}};
      samples_.push_back(std::move(s));
    }
  }

  size_t size() const override { return samples_.size(); }
  Sample sample(size_t i) const override {
    if (i >= samples_.size()) fail("ruler {}: sample {} of {}", name_, i, samples_.size());
    return samples_[i];
  }
  // string_match_all on RULER's post-processed prediction.
  double score(const Sample& s, const std::string& prediction) const override {
    std::string p = python_strip(prediction);
    for (char& c : p)
      if (static_cast<unsigned char>(c) < 0x20) c = '\n';
    p = python_lower(python_strip(p));
    double hit = 0;
    for (const auto& r : s.answers) hit += p.find(python_lower(r)) != std::string::npos ? 1.0 : 0.0;
    return hit / double(s.answers.size());
  }

 private:
  static constexpr int kGen = 128;
  struct Built {
    std::string input;
    std::vector<std::string> answers;
    int tokens = 0;
  };

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
    PyRandom(42).shuffle(needles);
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
    b.input = replace_all(replace_all(template_, "{context}", context), "{query}", key);
    b.answers = {value};
    b.tokens = static_cast<int>(tok_.encode(b.input).size());
    return b;
  }

  const Tokenizer& tok_;
  std::string name_;
  Variant v_;
  int length_;
  PyRandom rng_;
  std::unique_ptr<WordPairs> words_;
  std::string template_;
  int units_ = 0;
  std::vector<Sample> samples_;
};

const bool registered = register_task(
    {"ruler",
     "RULER synthetic niah (noise and needle haystacks), generated natively, string_match_all",
     {ParamSpec::choice("task", "niah_single_1", {"niah_single_1", "niah_multikey_2", "niah_multikey_3"},
                        "RULER task"),
      ParamSpec::integer("length", 4096, 256, 1048576, "sequence length: prompt tokens plus 128 generated"),
      ParamSpec::integer("samples", 500, 1, 100000, "samples (RULER: 500)"),
      ParamSpec::integer("seed", 42, 0, 2147483647, "random seed (RULER: 42)")},
     [](const TaskContext& ctx, const Params& p) { return std::make_unique<Ruler>(ctx, p); }});

}  // namespace
}  // namespace kvb
