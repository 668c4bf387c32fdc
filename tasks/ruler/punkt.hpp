#pragma once
// NLTK's Punkt sentence splitter as `nltk.sent_tokenize(text, "english")` runs it (nltk 3.10:
// PunktSentenceTokenizer.span_tokenize with realign_boundaries, the pretrained English parameters),
// which RULER's essay haystacks use to place needles between sentences. Only the tokenizer is
// ported, not the trainer. The parameters are the punkt_tab tables (abbrev_types.txt,
// collocations.tab, sent_starters.txt, ortho_context.tab) that scripts/setup.sh writes.
#include <cstdint>
#include <memory>
#include <set>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

namespace kvb {

class Regex;

class Punkt {
 public:
  // Reads the four tables from `dir`; an error names the file and line that is missing or malformed.
  explicit Punkt(const std::string& dir);
  ~Punkt();
  // The English model under `<data_dir>/punkt/english`, loaded once per process.
  static const Punkt& english(const std::string& data_dir);

  // Sentences as [begin, end) byte ranges of `text` (valid UTF-8).
  std::vector<std::pair<size_t, size_t>> spans(std::string_view text) const;
  std::vector<std::string> sentences(std::string_view text) const;

 private:
  struct Token;
  bool contains_sentbreak(std::string_view context) const;
  std::vector<Token> words(std::string_view text) const;
  void first_pass(Token& t) const;
  void second_pass(Token& t, const Token& next) const;
  int ortho_heuristic(const Token& t) const;  // 1 starter, 0 not, -1 unknown
  int ortho(const std::string& type) const;

  std::set<std::string> abbrev_, starters_;
  std::set<std::pair<std::string, std::string>> collocations_;
  std::unordered_map<std::string, int> ortho_;
  std::unique_ptr<Regex> word_re_;
};

}  // namespace kvb
