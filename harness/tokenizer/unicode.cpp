#include "harness/tokenizer/unicode.hpp"

#include <utf8proc.h>

#include <algorithm>
#include <cstdlib>
#include <memory>

#include "harness/util/error.hpp"

namespace kvb {

size_t utf8_invalid_at(std::string_view s) {
  size_t i = 0;
  while (i < s.size()) {
    const auto* p = reinterpret_cast<const utf8proc_uint8_t*>(s.data() + i);
    utf8proc_int32_t cp;
    const auto n = utf8proc_iterate(p, static_cast<utf8proc_ssize_t>(s.size() - i), &cp);
    if (n <= 0) return i;
    i += static_cast<size_t>(n);
  }
  return std::string_view::npos;
}

void require_utf8(std::string_view s, std::string_view what) {
  const size_t at = utf8_invalid_at(s);
  if (at != std::string_view::npos)
    fail("{}: invalid UTF-8 at byte {} (byte 0x{:02x}); text must be valid UTF-8", what, at,
         static_cast<unsigned char>(s[at]));
}

void append_utf8(std::string& out, uint32_t cp) {
  utf8proc_uint8_t buf[4];
  const auto n = utf8proc_encode_char(static_cast<utf8proc_int32_t>(cp), buf);
  out.append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

std::string utf8_lossy(std::string_view s) {
  std::string out;
  out.reserve(s.size());
  size_t i = 0;
  while (i < s.size()) {
    const auto c = static_cast<unsigned char>(s[i]);
    size_t need = 0;
    unsigned char lo = 0x80, hi = 0xBF;  // allowed range of the second byte
    if (c < 0x80) {
      out += static_cast<char>(c);
      ++i;
      continue;
    } else if (c >= 0xC2 && c <= 0xDF) {
      need = 1;
    } else if (c >= 0xE0 && c <= 0xEF) {
      need = 2;
      if (c == 0xE0) lo = 0xA0;
      if (c == 0xED) hi = 0x9F;
    } else if (c >= 0xF0 && c <= 0xF4) {
      need = 3;
      if (c == 0xF0) lo = 0x90;
      if (c == 0xF4) hi = 0x8F;
    }
    size_t k = 1;
    while (k <= need && i + k < s.size()) {
      const auto b = static_cast<unsigned char>(s[i + k]);
      const bool ok = k == 1 ? (b >= lo && b <= hi) : (b >= 0x80 && b <= 0xBF);
      if (!ok) break;
      ++k;
    }
    if (need > 0 && k == need + 1) {
      out.append(s, i, k);
    } else {
      out += "\xEF\xBF\xBD";
    }
    i += (need > 0 && k == need + 1) ? k : std::max<size_t>(k, 1);
  }
  return out;
}

std::string nfc(std::string_view s) {
  utf8proc_uint8_t* out = nullptr;
  const auto n =
      utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(s.data()), static_cast<utf8proc_ssize_t>(s.size()), &out,
                   static_cast<utf8proc_option_t>(UTF8PROC_STABLE | UTF8PROC_COMPOSE));
  if (n < 0) fail("NFC normalisation failed: {}", utf8proc_errmsg(n));
  std::unique_ptr<utf8proc_uint8_t, decltype(&std::free)> guard(out, &std::free);
  return std::string(reinterpret_cast<const char*>(out), static_cast<size_t>(n));
}

const ByteLevelMap& ByteLevelMap::get() {
  static const ByteLevelMap m = [] {
    ByteLevelMap r;
    r.cp_to_byte.fill(-1);
    auto printable = [](int b) {
      return (b >= '!' && b <= '~') || (b >= 0xA1 && b <= 0xAC) || (b >= 0xAE && b <= 0xFF);
    };
    int next = 256;
    for (int b = 0; b < 256; ++b) {
      const int cp = printable(b) ? b : next++;
      append_utf8(r.byte_to_utf8[b], static_cast<uint32_t>(cp));
      r.cp_to_byte[cp] = static_cast<int16_t>(b);
    }
    return r;
  }();
  return m;
}

bool python_space(uint32_t c) {
  return (c >= 0x09 && c <= 0x0D) || (c >= 0x1C && c <= 0x20) || c == 0x85 || c == 0xA0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200A) || c == 0x2028 || c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

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

std::string python_strip(std::string_view s) {
  size_t b = 0;
  while (b < s.size()) {
    size_t i = b;
    if (!python_space(next_cp(s, i))) break;
    b = i;
  }
  return std::string(s.substr(b, python_rstrip_end(s, b) - b));
}

size_t python_rstrip_end(std::string_view s, size_t b) {
  size_t e = s.size();
  while (e > b) {
    // Step back to the start of the last code point.
    size_t start = e - 1;
    while (start > b && (static_cast<unsigned char>(s[start]) & 0xC0) == 0x80) --start;
    size_t i = start;
    if (!python_space(next_cp(s, i))) break;
    e = start;
  }
  return e;
}

}  // namespace kvb
