#include "tasks/ruler/punkt.hpp"

#include <fmt/format.h>
#include <utf8proc.h>

#include <fstream>
#include <map>
#include <mutex>

#include "harness/task/text.hpp"
#include "harness/tokenizer/regex.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

// Orthographic context flags of the punkt_tab tables: upper/lower case first letter seen at a
// sentence beginning, in the middle, or at an unknown position.
constexpr int kBegUc = 1 << 1, kMidUc = 1 << 2, kUnkUc = 1 << 3, kBegLc = 1 << 4, kMidLc = 1 << 5, kUnkLc = 1 << 6;
constexpr int kUc = kBegUc + kMidUc + kUnkUc, kLc = kBegLc + kMidLc + kUnkLc;

uint32_t first_cp(std::string_view s) {
  size_t i = 0;
  return s.empty() ? 0 : next_cp(s, i);
}

// Python's [^\W\d]: a word character that is not a decimal digit (letters, other numerics, '_').
bool letterish(uint32_t c) {
  if (c == '_') return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return true;
    default:
      return false;
  }
}
bool decimal(uint32_t c) { return utf8proc_category(static_cast<utf8proc_int32_t>(c)) == UTF8PROC_CATEGORY_ND; }

// Characters that cannot be inside a word (PunktLanguageVars._re_non_word_chars, with ? and !).
bool non_word(uint32_t c) {
  for (uint32_t x : {0x29u, 0x22u, 0x3Bu,   0x7Du,   0x5Du,   0x2Au,   0x3Au, 0x40u, 0x27u, 0x28u,
                     0x7Bu, 0x5Bu, 0x2018u, 0x2019u, 0x201Cu, 0x201Du, 0xABu, 0xBBu, 0x3Fu, 0x21u})
    if (c == x) return true;
  return false;
}

// Closing punctuation that realign_boundaries moves back onto the previous sentence.
bool closing(uint32_t c) {
  for (uint32_t x : {0x22u, 0x27u, 0x29u, 0x5Du, 0x7Du, 0x2018u, 0x2019u, 0x201Cu, 0x201Du, 0xABu, 0xBBu})
    if (c == x) return true;
  return false;
}

// ^-?[\.,]?\d[\d,\.-]*\.?$
bool numeric(std::string_view t) {
  size_t i = 0;
  if (i < t.size() && t[i] == '-') ++i;
  if (i < t.size() && (t[i] == '.' || t[i] == ',')) ++i;
  if (i >= t.size() || !decimal(next_cp(t, i))) return false;
  while (i < t.size()) {
    const char ch = t[i];
    if (ch == ',' || ch == '.' || ch == '-') {
      ++i;
    } else if (!decimal(next_cp(t, i))) {
      return false;
    }
  }
  return true;
}

bool ellipsis(std::string_view t) { return t.size() >= 2 && t.find_first_not_of('.') == std::string_view::npos; }

// [^\W\d]\.$ from the start: one letter and a period.
bool initial(std::string_view t) {
  size_t i = 0;
  return !t.empty() && letterish(next_cp(t, i)) && i + 1 == t.size() && t[i] == '.';
}

std::vector<std::string> read_lines(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: not found (scripts/setup.sh writes the Punkt tables; or set KVBENCH_DATA)", path);
  std::vector<std::string> lines;
  for (std::string l; std::getline(in, l);) lines.push_back(l);
  return lines;
}

std::pair<std::string, std::string> tab_pair(const std::string& line, const std::string& path, size_t no) {
  const size_t tab = line.find('\t');
  if (tab == std::string::npos || line.find('\t', tab + 1) != std::string::npos)
    fail("{}:{}: expected two fields separated by one tab", path, no);
  return {line.substr(0, tab), line.substr(tab + 1)};
}

}  // namespace

struct Punkt::Token {
  std::string tok, type;
  bool period_final = false, sentbreak = false, abbr = false, ellipsis = false;

  std::string type_no_period() const {
    return type.size() > 1 && type.back() == '.' ? type.substr(0, type.size() - 1) : type;
  }
  std::string type_no_sentperiod() const { return sentbreak ? type_no_period() : type; }
  bool first_upper() const { return utf8proc_isupper(static_cast<utf8proc_int32_t>(first_cp(tok))); }
  bool first_lower() const { return utf8proc_islower(static_cast<utf8proc_int32_t>(first_cp(tok))); }
};

Punkt::Punkt(const std::string& dir) {
  for (const auto& l : read_lines(dir + "/abbrev_types.txt")) abbrev_.insert(l);
  for (const auto& l : read_lines(dir + "/sent_starters.txt")) starters_.insert(l);
  const std::string colloc = dir + "/collocations.tab", ortho = dir + "/ortho_context.tab";
  const auto cl = read_lines(colloc);
  for (size_t i = 0; i < cl.size(); ++i) collocations_.insert(tab_pair(cl[i], colloc, i + 1));
  const auto ol = read_lines(ortho);
  for (size_t i = 0; i < ol.size(); ++i) {
    const auto [type, flags] = tab_pair(ol[i], ortho, i + 1);
    try {
      size_t used = 0;
      ortho_[type] = std::stoi(flags, &used);
      if (used != flags.size()) throw std::invalid_argument(flags);
    } catch (const std::exception&) {
      fail("{}:{}: the flags of '{}' must be an integer, got '{}'", ortho, i + 1, type, flags);
    }
  }
  if (abbrev_.empty() || ortho_.empty()) fail("{}: empty Punkt tables", dir);
  // PunktLanguageVars' word tokenizer: multi-character punctuation, a word up to where punctuation
  // or whitespace ends it, or any other single non-space character.
  const std::string non_word_class = "(?:[)\";}\\]\\*:@'\\({\\[\\x{2018}\\x{2019}\\x{201c}\\x{201d}\\x{ab}\\x{bb}?!])";
  const std::string multi = "(?:\\-{2,}|\\.{2,}|(?:\\.\\s){2,}\\.)";
  word_re_ = std::make_unique<Regex>(
      fmt::format("{1}|(?=[^\\(\"`{{\\[:;&\\#\\*@\\)}}\\]\\-,])\\S+?(?=\\s|$|{0}|{1}|,(?=$|\\s|{0}|{1}))|\\S",
                  non_word_class, multi));
}

Punkt::~Punkt() = default;

const Punkt& Punkt::english(const std::string& data_dir) {
  static std::mutex m;
  static std::map<std::string, std::unique_ptr<Punkt>> loaded;
  std::lock_guard lock(m);
  auto& p = loaded[data_dir];
  if (!p) p = std::make_unique<Punkt>(data_dir + "/punkt/english");
  return *p;
}

int Punkt::ortho(const std::string& type) const {
  const auto it = ortho_.find(type);
  return it == ortho_.end() ? 0 : it->second;
}

std::vector<Punkt::Token> Punkt::words(std::string_view text) const {
  std::vector<Token> out;
  size_t start = 0;
  while (start <= text.size()) {
    size_t end = text.find('\n', start);
    if (end == std::string_view::npos) end = text.size();
    const std::string_view line = text.substr(start, end - start);
    if (!python_strip(line).empty())
      for (const auto& [b, e] : word_re_->find_all(line)) {
        Token t;
        t.tok = std::string(line.substr(b, e - b));
        t.type = numeric(t.tok) ? "##number##" : python_lower(t.tok);
        t.period_final = t.tok.back() == '.';
        out.push_back(std::move(t));
      }
    start = end + 1;
  }
  return out;
}

void Punkt::first_pass(Token& t) const {
  if (t.tok == "." || t.tok == "?" || t.tok == "!") {
    t.sentbreak = true;
  } else if (ellipsis(t.tok)) {
    t.ellipsis = true;
  } else if (t.period_final && !t.tok.ends_with("..")) {
    const std::string base = python_lower(std::string_view(t.tok).substr(0, t.tok.size() - 1));
    const size_t dash = base.rfind('-');
    if (abbrev_.count(base) || abbrev_.count(dash == std::string::npos ? base : base.substr(dash + 1)))
      t.abbr = true;
    else
      t.sentbreak = true;
  }
}

int Punkt::ortho_heuristic(const Token& t) const {
  if (t.tok.size() == 1 && std::string_view(";:,.!?").find(t.tok[0]) != std::string_view::npos) return 0;
  const int oc = ortho(t.type_no_sentperiod());
  if (t.first_upper() && (oc & kLc) && !(oc & kMidUc)) return 1;
  if (t.first_lower() && ((oc & kUc) || !(oc & kBegLc))) return 0;
  return -1;
}

void Punkt::second_pass(Token& t, const Token& next) const {
  if (!t.period_final) return;
  const std::string typ = t.type_no_period(), next_typ = next.type_no_sentperiod();
  const bool is_initial = initial(t.tok);
  // Collocation heuristic: a known pair across the period is no sentence break.
  if (collocations_.count({typ, next_typ})) {
    t.sentbreak = false;
    t.abbr = true;
    return;
  }
  // An abbreviation or ellipsis also ends a sentence if the next word looks like a sentence start.
  if ((t.abbr || t.ellipsis) && !is_initial) {
    if (ortho_heuristic(next) == 1 || (next.first_upper() && starters_.count(next_typ))) {
      t.sentbreak = true;
      return;
    }
  }
  // Initials and ordinals are abbreviations unless the next word looks like a sentence start.
  if (is_initial || typ == "##number##") {
    const int starter = ortho_heuristic(next);
    if (starter == 0 || (starter == -1 && is_initial && next.first_upper() && !(ortho(next_typ) & kLc))) {
      t.sentbreak = false;
      t.abbr = true;
    }
  }
}

bool Punkt::contains_sentbreak(std::string_view context) const {
  auto toks = words(context);
  for (auto& t : toks) first_pass(t);
  // True when a token other than the last is a sentence break (each token's second pass sees the
  // next token as the first pass left it).
  for (size_t i = 0; i + 1 < toks.size(); ++i) {
    second_pass(toks[i], toks[i + 1]);
    if (toks[i].sentbreak) return true;
  }
  return false;
}

std::vector<std::pair<size_t, size_t>> Punkt::spans(std::string_view text) const {
  constexpr size_t npos = std::string_view::npos;
  // Potential sentence ends: '.', '?' or '!' followed by non-word punctuation, or by whitespace and
  // a next token. Each comes with the word before it; a match whose word overlaps the previous
  // match's context replaces it (_match_potential_end_contexts).
  struct End {
    size_t end, next_tok;
    std::string context;
  };
  std::vector<End> ends;
  size_t prev_start = 0, prev_stop = 0;
  bool have_prev = false;
  End prev{};
  for (size_t i = 0; i < text.size(); ++i) {
    const char c = text[i];
    if (c != '.' && c != '?' && c != '!') continue;
    size_t j = i + 1, after_end = npos, next_tok = npos;
    if (j < text.size()) {
      size_t k = j;
      const uint32_t n = next_cp(text, k);
      if (non_word(n)) {
        after_end = k;
      } else if (python_space(n)) {
        while (k < text.size()) {
          size_t q = k;
          if (!python_space(next_cp(text, q))) break;
          k = q;
        }
        if (k < text.size()) {
          next_tok = k;
          while (k < text.size()) {
            size_t q = k;
            if (python_space(next_cp(text, q))) break;
            k = q;
          }
          after_end = k;
        }
      }
    }
    if (after_end == npos) continue;
    const std::string_view before = text.substr(prev_stop, i - prev_stop);
    size_t word_start = before.find_last_of(" \t\n\r\x0b\x0c");
    // Python's index test treats a space at index 0 like no space at all.
    word_start = word_start != npos && word_start != 0 ? word_start + prev_stop + 1 : prev_start;
    if (have_prev && prev_stop <= word_start) ends.push_back(prev);
    prev = {i + 1, next_tok,
            std::string(text.substr(word_start, word_start <= i ? i - word_start : 0)) +
                std::string(text.substr(i, after_end - i))};
    have_prev = true;
    prev_start = word_start;
    prev_stop = i;
  }
  if (have_prev) ends.push_back(prev);

  std::vector<std::pair<size_t, size_t>> slices;
  size_t last_break = 0;
  for (const End& e : ends)
    if (contains_sentbreak(e.context)) {
      slices.push_back({last_break, e.end});
      last_break = e.next_tok != npos ? e.next_tok : e.end;
    }
  slices.push_back({last_break, python_rstrip_end(text)});

  // realign_boundaries: closing quotes and brackets after a break belong to the sentence before.
  std::vector<std::pair<size_t, size_t>> out;
  size_t realign = 0;
  for (size_t k = 0; k < slices.size(); ++k) {
    const size_t s1 = slices[k].first + realign, e1 = slices[k].second;
    if (k + 1 == slices.size()) {
      if (s1 < e1) out.push_back({s1, e1});
      continue;
    }
    const auto [s2, e2] = slices[k + 1];
    const std::string_view next = s2 < e2 ? text.substr(s2, e2 - s2) : std::string_view();
    size_t j = 0, match_end = npos;
    while (j < next.size()) {
      size_t q = j;
      if (!closing(next_cp(next, q))) break;
      j = q;
      // (?:\s+|(?=--)|$), in that order of preference.
      size_t w = j;
      while (w < next.size()) {
        size_t r = w;
        if (!python_space(next_cp(next, r))) break;
        w = r;
      }
      if (w > j || next.substr(j, 2) == "--" || j == next.size()) {
        match_end = w;
        break;
      }
    }
    if (match_end != npos) {
      out.push_back({s1, s2 + python_rstrip_end(next.substr(0, match_end))});
      realign = match_end;
    } else {
      realign = 0;
      if (s1 < e1) out.push_back({s1, e1});
    }
  }
  return out;
}

std::vector<std::string> Punkt::sentences(std::string_view text) const {
  std::vector<std::string> out;
  for (const auto& [b, e] : spans(text)) out.emplace_back(b < e ? text.substr(b, e - b) : std::string_view());
  return out;
}

}  // namespace kvb
