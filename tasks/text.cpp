#include "tasks/text.hpp"

#include <utf8proc.h>

#include "harness/tokenizer/unicode.hpp"

namespace kvb {
namespace {

// Python's str.isspace() set.
bool python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

// Decodes the code point at s[i] (invalid bytes stand for themselves) and advances i.
uint32_t next_cp(std::string_view s, size_t& i) {
  utf8proc_int32_t cp = -1;
  const auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i),
                                  static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
  if (n <= 0 || cp < 0) {
    ++i;
    return 0xFFFFFFFFu;
  }
  i += static_cast<size_t>(n);
  return static_cast<uint32_t>(cp);
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

std::string python_lower(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const size_t at = i;
    const uint32_t c = next_cp(s, i);
    if (c == 0xFFFFFFFFu)
      out.append(s.substr(at, i - at));
    else
      append_utf8(out, static_cast<uint32_t>(utf8proc_tolower(static_cast<utf8proc_int32_t>(c))));
  }
  return out;
}

std::string python_strip(std::string_view s) {
  size_t b = 0, e = s.size();
  while (b < e) {
    size_t i = b;
    if (!python_space(next_cp(s, i))) break;
    b = i;
  }
  while (e > b) {
    // Step back to the start of the last code point.
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!python_space(next_cp(s, i))) break;
    e = start;
  }
  return std::string(s.substr(b, e - b));
}

}  // namespace kvb
