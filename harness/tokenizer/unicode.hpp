#pragma once
// UTF-8 helpers shared by the tokenizers.
#include <array>
#include <cstdint>
#include <string>
#include <string_view>

namespace kvb {

// Length in bytes of the UTF-8 sequence starting with lead byte c (1 for invalid lead bytes).
inline size_t utf8_len(unsigned char c) {
  if (c < 0x80) return 1;
  if ((c & 0xE0) == 0xC0) return 2;
  if ((c & 0xF0) == 0xE0) return 3;
  if ((c & 0xF8) == 0xF0) return 4;
  return 1;
}

// Byte offset of the first invalid sequence, or npos if `s` is valid UTF-8.
size_t utf8_invalid_at(std::string_view s);
// Throws an Error naming `what` and the offset if `s` is not valid UTF-8.
void require_utf8(std::string_view s, std::string_view what);

void append_utf8(std::string& out, uint32_t cp);

// Replaces each maximal ill-formed subsequence with U+FFFD, as Unicode recommends and as Rust's
// String::from_utf8_lossy (the Hugging Face decoders) and Python's errors="replace" do.
std::string utf8_lossy(std::string_view s);

// Unicode canonical composition (NFC), as Hugging Face's NFC normalizer applies it.
std::string nfc(std::string_view s);

// Python's str.isspace() for one code point.
bool python_space(uint32_t c);
// Decodes the code point at s[i] (an invalid byte stands for itself as 0xFFFFFFFF) and advances i.
uint32_t next_cp(std::string_view s, size_t& i);
// str.strip() with no argument (Jinja's |trim is the same).
std::string python_strip(std::string_view s);
// len(s[b:].rstrip()) + b: where the text ends once trailing whitespace is stripped.
size_t python_rstrip_end(std::string_view s, size_t b = 0);

// GPT-2's reversible byte <-> printable character mapping used by byte-level BPE: each byte is
// represented by one Unicode character so that vocabularies never contain raw control bytes.
struct ByteLevelMap {
  std::array<std::string, 256> byte_to_utf8;  // UTF-8 of the character standing for each byte
  // Inverse, indexed by code point (all stand-ins are below 324); -1 where no byte maps.
  std::array<int16_t, 324> cp_to_byte;
  static const ByteLevelMap& get();
};

}  // namespace kvb
