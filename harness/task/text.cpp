#include "harness/task/text.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <iterator>
#include <utility>

#include <vector>

#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"

namespace kvb {

namespace {

// Unicode "Cased" and "Case_Ignorable" (what Python's final-sigma rule looks at), from the general
// category and the case mappings.
bool cased(uint32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT ||
         utf8proc_tolower(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c) ||
         utf8proc_toupper(static_cast<utf8proc_int32_t>(c)) != static_cast<utf8proc_int32_t>(c);
}
bool case_ignorable(uint32_t c) {
  const auto cat = utf8proc_category(static_cast<utf8proc_int32_t>(c));
  if (cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_ME || cat == UTF8PROC_CATEGORY_CF ||
      cat == UTF8PROC_CATEGORY_LM || cat == UTF8PROC_CATEGORY_SK)
    return true;
  // Word_Break MidLetter, MidNumLet and Single_Quote.
  for (uint32_t m : {0x27u, 0x2Eu, 0x3Au, 0xB7u, 0x387u, 0x5F4u, 0x2018u, 0x2019u, 0x2024u, 0x2027u, 0xFE13u, 0xFE52u,
                     0xFE55u, 0xFF07u, 0xFF0Eu, 0xFF1Au})
    if (c == m) return true;
  return false;
}

}  // namespace

std::vector<std::string> python_split(std::string_view s) {
  std::vector<std::string> out;
  size_t i = 0, start = std::string_view::npos;
  while (i < s.size()) {
    const size_t at = i;
    const uint32_t c = next_cp(s, i);
    if (python_space(c)) {
      if (start != std::string_view::npos) out.emplace_back(s.substr(start, at - start));
      start = std::string_view::npos;
    } else if (start == std::string_view::npos) {
      start = at;
    }
  }
  if (start != std::string_view::npos) out.emplace_back(s.substr(start));
  return out;
}

namespace {

// str.lower() of s from byte `from` on, the final sigma judged in all of s (capitalize lowers the rest of
// a string whose first character it title-cases).
std::string lower_from(std::string_view s, size_t from) {
  std::vector<uint32_t> cps;  // 0xFFFFFFFF marks an invalid byte, kept as it is
  std::vector<size_t> starts;
  for (size_t i = 0; i < s.size();) {
    starts.push_back(i);
    cps.push_back(next_cp(s, i));
  }
  starts.push_back(s.size());
  std::string out;
  out.reserve(s.size());
  for (size_t k = 0; k < cps.size(); ++k) {
    const uint32_t c = cps[k];
    if (starts[k] < from) continue;
    if (c == 0xFFFFFFFFu) {
      out.append(s.substr(starts[k], starts[k + 1] - starts[k]));
    } else if (c == 0x130) {  // SpecialCasing: capital I with dot above lowers to i + combining dot
      out += "i\u0307";
    } else if (c == 0x3A3) {
      // Final sigma: preceded by a cased letter and not followed by one (case-ignorables skipped).
      auto cased_at = [&](size_t j) { return cps[j] != 0xFFFFFFFFu && cased(cps[j]); };
      auto ignorable_at = [&](size_t j) { return cps[j] != 0xFFFFFFFFu && case_ignorable(cps[j]); };
      size_t j = k;
      while (j > 0 && ignorable_at(j - 1)) --j;
      const bool before = j > 0 && cased_at(j - 1);
      j = k + 1;
      while (j < cps.size() && ignorable_at(j)) ++j;
      const bool after = j < cps.size() && cased_at(j);
      append_utf8(out, before && !after ? 0x3C2 : 0x3C3);
    } else {
      append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
    }
  }
  return out;
}

}  // namespace

std::string python_lower(std::string_view s) { return lower_from(s, 0); }

size_t python_len(std::string_view s) {
  size_t n = 0;
  for (size_t i = 0; i < s.size(); ++n) next_cp(s, i);
  return n;
}

// The characters whose title case is several (SpecialCasing.txt, unconditional), as Python's
// str.title() and capitalize() give them (CPython 3.11, Unicode 14); the rest take utf8proc's simple one.
constexpr std::pair<uint32_t, const char*> kFullTitle[] = {{0xDF, "Ss"},
                                                           {0x149, "\u02BCN"},
                                                           {0x1F0, "J\u030C"},
                                                           {0x390, "\u0399\u0308\u0301"},
                                                           {0x3B0, "\u03A5\u0308\u0301"},
                                                           {0x587, "\u0535\u0582"},
                                                           {0x1E96, "H\u0331"},
                                                           {0x1E97, "T\u0308"},
                                                           {0x1E98, "W\u030A"},
                                                           {0x1E99, "Y\u030A"},
                                                           {0x1E9A, "A\u02BE"},
                                                           {0x1F50, "\u03A5\u0313"},
                                                           {0x1F52, "\u03A5\u0313\u0300"},
                                                           {0x1F54, "\u03A5\u0313\u0301"},
                                                           {0x1F56, "\u03A5\u0313\u0342"},
                                                           {0x1FB2, "\u1FBA\u0345"},
                                                           {0x1FB4, "\u0386\u0345"},
                                                           {0x1FB6, "\u0391\u0342"},
                                                           {0x1FB7, "\u0391\u0342\u0345"},
                                                           {0x1FC2, "\u1FCA\u0345"},
                                                           {0x1FC4, "\u0389\u0345"},
                                                           {0x1FC6, "\u0397\u0342"},
                                                           {0x1FC7, "\u0397\u0342\u0345"},
                                                           {0x1FD2, "\u0399\u0308\u0300"},
                                                           {0x1FD3, "\u0399\u0308\u0301"},
                                                           {0x1FD6, "\u0399\u0342"},
                                                           {0x1FD7, "\u0399\u0308\u0342"},
                                                           {0x1FE2, "\u03A5\u0308\u0300"},
                                                           {0x1FE3, "\u03A5\u0308\u0301"},
                                                           {0x1FE4, "\u03A1\u0313"},
                                                           {0x1FE6, "\u03A5\u0342"},
                                                           {0x1FE7, "\u03A5\u0308\u0342"},
                                                           {0x1FF2, "\u1FFA\u0345"},
                                                           {0x1FF4, "\u038F\u0345"},
                                                           {0x1FF6, "\u03A9\u0342"},
                                                           {0x1FF7, "\u03A9\u0342\u0345"},
                                                           {0xFB00, "Ff"},
                                                           {0xFB01, "Fi"},
                                                           {0xFB02, "Fl"},
                                                           {0xFB03, "Ffi"},
                                                           {0xFB04, "Ffl"},
                                                           {0xFB05, "St"},
                                                           {0xFB06, "St"},
                                                           {0xFB13, "\u0544\u0576"},
                                                           {0xFB14, "\u0544\u0565"},
                                                           {0xFB15, "\u0544\u056B"},
                                                           {0xFB16, "\u054E\u0576"},
                                                           {0xFB17, "\u0544\u056D"}};

std::string python_capitalize(std::string_view s) {
  if (s.empty()) return {};
  size_t i = 0;
  const uint32_t first = next_cp(s, i);
  std::string out;
  if (first == 0xFFFFFFFFu)
    out.append(s.substr(0, i));
  else if (const auto* full = std::find_if(std::begin(kFullTitle), std::end(kFullTitle),
                                           [&](const auto& e) { return e.first == first; });
           full != std::end(kFullTitle))
    out += full->second;
  else
    append_utf8(out, static_cast<uint32_t>(utf8proc_totitle(static_cast<utf8proc_int32_t>(first))));
  return out + lower_from(s, i);
}

std::string python_collapse_space(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  bool in_space = false;
  for (size_t i = 0; i < s.size();) {
    const size_t start = i;
    const bool space = python_space(next_cp(s, i));
    if (!space)
      out.append(s.substr(start, i - start));
    else if (!in_space)
      out += ' ';
    in_space = space;
  }
  return out;
}

std::string fill_template(const std::string& t, const std::map<std::string, std::string>& fields) {
  std::string out;
  for (size_t i = 0; i < t.size();) {
    if ((t[i] == '{' || t[i] == '}') && i + 1 < t.size() && t[i + 1] == t[i]) {
      out += t[i];
      i += 2;
    } else if (t[i] == '{') {
      const size_t close = t.find('}', i);
      if (close == std::string::npos) fail("template: unclosed '{{' at {}", i);
      const auto f = fields.find(t.substr(i + 1, close - i - 1));
      if (f == fields.end()) fail("template: no value for field {}", t.substr(i, close - i + 1));
      out += f->second;
      i = close + 1;
    } else {
      out += t[i++];
    }
  }
  return out;
}

}  // namespace kvb
