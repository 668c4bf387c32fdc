#include "harness/task/rouge_score.hpp"

#include <functional>
#include <map>
#include <unordered_map>

#include "harness/task/text.hpp"

namespace kvb {
namespace {

// The Porter stemmer as NLTK implements it in NLTK_EXTENSIONS mode (its default, and what rouge_score
// uses): Porter's five steps plus NLTK's irregular forms and its departures from the 1980 paper.

bool vowel(char c) { return c == 'a' || c == 'e' || c == 'i' || c == 'o' || c == 'u'; }

// A 'y' is a consonant unless it follows a consonant; runs of 'y' alternate.
bool consonant(const std::string& w, size_t i) {
  if (vowel(w[i])) return false;
  if (w[i] != 'y') return true;
  bool negate = false;
  while (i > 0 && w[i] == 'y') {
    negate = !negate;
    --i;
  }
  return !vowel(w[i]) != negate;
}

// m in [C](VC)^m[V].
int measure(const std::string& s) {
  int m = 0;
  for (size_t i = 1; i < s.size(); ++i)
    if (!consonant(s, i - 1) && consonant(s, i)) ++m;
  return m;
}

bool has_vowel(const std::string& s) {
  for (size_t i = 0; i < s.size(); ++i)
    if (!consonant(s, i)) return true;
  return false;
}

bool ends_double_consonant(const std::string& w) {
  const size_t n = w.size();
  return n >= 2 && w[n - 1] == w[n - 2] && consonant(w, n - 1);
}

// *o: the stem ends consonant-vowel-consonant, the last not w, x or y; NLTK adds two-letter
// vowel-consonant stems.
bool ends_cvc(const std::string& w) {
  const size_t n = w.size();
  if (n >= 3 && consonant(w, n - 3) && !consonant(w, n - 2) && consonant(w, n - 1) && w[n - 1] != 'w' &&
      w[n - 1] != 'x' && w[n - 1] != 'y')
    return true;
  return n == 2 && !consonant(w, 0) && consonant(w, 1);
}

bool ends_with(const std::string& w, std::string_view s) {
  return w.size() >= s.size() && std::string_view(w).substr(w.size() - s.size()) == s;
}

std::string cut(const std::string& w, std::string_view suffix) { return w.substr(0, w.size() - suffix.size()); }

using Condition = std::function<bool(const std::string& stem)>;
struct Rule {
  std::string_view suffix, replacement;
  Condition condition;  // empty: unconditional
};
constexpr std::string_view kDouble = "*d";  // the rule that applies to a word ending in a double consonant

// The first rule whose suffix matches decides: its replacement if its condition holds, else no change.
std::string apply_rules(const std::string& w, const std::vector<Rule>& rules) {
  for (const Rule& r : rules) {
    std::string stem;
    if (r.suffix == kDouble) {
      if (!ends_double_consonant(w)) continue;
      stem = w.substr(0, w.size() - 2);
    } else if (ends_with(w, r.suffix)) {
      stem = cut(w, r.suffix);
    } else {
      continue;
    }
    return !r.condition || r.condition(stem) ? stem + std::string(r.replacement) : w;
  }
  return w;
}

bool positive_measure(const std::string& s) { return measure(s) > 0; }
bool measure_above_1(const std::string& s) { return measure(s) > 1; }

std::string step1a(const std::string& w) {
  if (ends_with(w, "ies") && w.size() == 4) return cut(w, "ies") + "ie";
  return apply_rules(w, {{"sses", "ss", {}}, {"ies", "i", {}}, {"ss", "ss", {}}, {"s", "", {}}});
}

std::string step1b(const std::string& w) {
  if (ends_with(w, "ied")) return cut(w, "ied") + (w.size() == 4 ? "ie" : "i");
  if (ends_with(w, "eed")) {
    const std::string stem = cut(w, "eed");
    return measure(stem) > 0 ? stem + "ee" : w;
  }
  std::string stem;
  bool cut_ok = false;
  for (std::string_view suffix : {std::string_view("ed"), std::string_view("ing")}) {
    if (ends_with(w, suffix)) {
      stem = cut(w, suffix);
      if (has_vowel(stem)) {
        cut_ok = true;
        break;
      }
    }
  }
  if (!cut_ok) return w;
  const char last = stem.back();
  const std::string last_s(1, last);
  return apply_rules(
      stem, {{"at", "ate", {}},
             {"bl", "ble", {}},
             {"iz", "ize", {}},
             {kDouble, last_s, [last](const std::string&) { return last != 'l' && last != 's' && last != 'z'; }},
             {"", "e", [](const std::string& s) { return measure(s) == 1 && ends_cvc(s); }}});
}

std::string step1c(const std::string& w) {
  return apply_rules(w, {{"y", "i", [](const std::string& s) { return s.size() > 1 && consonant(s, s.size() - 1); }}});
}

std::string step2(const std::string& w) {
  if (ends_with(w, "alli") && positive_measure(cut(w, "alli"))) return step2(cut(w, "alli") + "al");
  static const Condition m = positive_measure;
  return apply_rules(
      w, {{"ational", "ate", m},
          {"tional", "tion", m},
          {"enci", "ence", m},
          {"anci", "ance", m},
          {"izer", "ize", m},
          {"bli", "ble", m},
          {"alli", "al", m},
          {"entli", "ent", m},
          {"eli", "e", m},
          {"ousli", "ous", m},
          {"ization", "ize", m},
          {"ation", "ate", m},
          {"ator", "ate", m},
          {"alism", "al", m},
          {"iveness", "ive", m},
          {"fulness", "ful", m},
          {"ousness", "ous", m},
          {"aliti", "al", m},
          {"iviti", "ive", m},
          {"biliti", "ble", m},
          {"fulli", "ful", m},
          // NLTK measures the stem with its 'l' kept.
          {"logi", "log", [&w](const std::string&) { return positive_measure(w.substr(0, w.size() - 3)); }}});
}

std::string step3(const std::string& w) {
  static const Condition m = positive_measure;
  return apply_rules(w, {{"icate", "ic", m},
                         {"ative", "", m},
                         {"alize", "al", m},
                         {"iciti", "ic", m},
                         {"ical", "ic", m},
                         {"ful", "", m},
                         {"ness", "", m}});
}

std::string step4(const std::string& w) {
  static const Condition m = measure_above_1;
  return apply_rules(
      w, {{"al", "", m},
          {"ance", "", m},
          {"ence", "", m},
          {"er", "", m},
          {"ic", "", m},
          {"able", "", m},
          {"ible", "", m},
          {"ant", "", m},
          {"ement", "", m},
          {"ment", "", m},
          {"ent", "", m},
          {"ion", "", [](const std::string& s) { return measure(s) > 1 && (s.back() == 's' || s.back() == 't'); }},
          {"ou", "", m},
          {"ism", "", m},
          {"ate", "", m},
          {"iti", "", m},
          {"ous", "", m},
          {"ive", "", m},
          {"ize", "", m}});
}

std::string step5a(const std::string& w) {
  if (!ends_with(w, "e")) return w;
  const std::string stem = cut(w, "e");
  const int m = measure(stem);
  return m > 1 || (m == 1 && !ends_cvc(stem)) ? stem : w;
}

std::string step5b(const std::string& w) {
  return apply_rules(w, {{"ll", "l", [&w](const std::string&) { return measure(cut(w, "l")) > 1; }}});
}

}  // namespace

std::string porter_stem(std::string_view word) {
  static const std::unordered_map<std::string_view, std::string_view> irregular = {
      {"sky", "sky"},        {"skies", "sky"},       {"dying", "die"},        {"lying", "lie"},
      {"tying", "tie"},      {"news", "news"},       {"innings", "inning"},   {"inning", "inning"},
      {"outings", "outing"}, {"outing", "outing"},   {"cannings", "canning"}, {"canning", "canning"},
      {"howe", "howe"},      {"proceed", "proceed"}, {"exceed", "exceed"},    {"succeed", "succeed"}};
  if (auto it = irregular.find(word); it != irregular.end()) return std::string(it->second);
  std::string w(word);
  if (w.size() <= 2) return w;
  for (auto step : {step1a, step1b, step1c, step2, step3, step4, step5a, step5b}) w = step(w);
  return w;
}

std::vector<std::string> rouge_tokens(std::string_view text) {
  // str.lower() maps U+0130 to "i" + U+0307, which the separator rule then splits; a one-to-one
  // lowercase would glue the "i" to the rest of the word.
  std::string src;
  for (size_t i = 0; i < text.size(); ++i) {
    if (text.compare(i, 2, "\xC4\xB0") == 0) {
      src += "i ";
      ++i;
    } else {
      src += text[i];
    }
  }
  const std::string lower = python_lower(src);
  std::vector<std::string> out;
  std::string cur;
  auto flush = [&] {
    if (cur.empty()) return;
    out.push_back(cur.size() > 3 ? porter_stem(cur) : cur);
    cur.clear();
  };
  for (char c : lower) {
    if ((c >= 'a' && c <= 'z') || (c >= '0' && c <= '9'))
      cur += c;
    else
      flush();
  }
  flush();
  return out;
}

RougeScore rouge_n(std::string_view target, std::string_view prediction, int n) {
  auto grams = [n](const std::vector<std::string>& t) {
    std::map<std::vector<std::string>, long> c;
    for (size_t i = 0; i + static_cast<size_t>(n) <= t.size(); ++i)
      ++c[std::vector<std::string>(t.begin() + static_cast<long>(i), t.begin() + static_cast<long>(i) + n)];
    return c;
  };
  const auto tg = grams(rouge_tokens(target)), pg = grams(rouge_tokens(prediction));
  long common = 0, nt = 0, np = 0;
  for (const auto& [g, c] : tg) {
    nt += c;
    if (auto it = pg.find(g); it != pg.end()) common += std::min(c, it->second);
  }
  for (const auto& [g, c] : pg) np += c;
  RougeScore s;
  s.precision = static_cast<double>(common) / static_cast<double>(std::max(np, 1L));
  s.recall = static_cast<double>(common) / static_cast<double>(std::max(nt, 1L));
  s.fmeasure = s.precision + s.recall > 0 ? 2 * s.precision * s.recall / (s.precision + s.recall) : 0.0;
  return s;
}

}  // namespace kvb
