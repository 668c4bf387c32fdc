#include "harness/util/base64.hpp"

#include <bit>
#include <cstring>

#include "harness/util/error.hpp"

namespace kvb {
namespace {
constexpr char kAlphabet[] = "ABCDEFGHIJKLMNOPQRSTUVWXYZabcdefghijklmnopqrstuvwxyz0123456789+/";

int value_of(char c) {
  if (c >= 'A' && c <= 'Z') return c - 'A';
  if (c >= 'a' && c <= 'z') return c - 'a' + 26;
  if (c >= '0' && c <= '9') return c - '0' + 52;
  if (c == '+') return 62;
  if (c == '/') return 63;
  return -1;
}
}  // namespace

std::string base64_encode(std::span<const uint8_t> b) {
  std::string out;
  out.reserve((b.size() + 2) / 3 * 4);
  for (size_t i = 0; i < b.size(); i += 3) {
    const uint32_t n = uint32_t(b[i]) << 16 | (i + 1 < b.size() ? uint32_t(b[i + 1]) << 8 : 0) |
                       (i + 2 < b.size() ? uint32_t(b[i + 2]) : 0);
    out += kAlphabet[(n >> 18) & 63];
    out += kAlphabet[(n >> 12) & 63];
    out += i + 1 < b.size() ? kAlphabet[(n >> 6) & 63] : '=';
    out += i + 2 < b.size() ? kAlphabet[n & 63] : '=';
  }
  return out;
}

std::vector<uint8_t> base64_decode(std::string_view s, const std::string& what) {
  if (s.size() % 4 != 0) fail("{}: base64 text of length {} is not a multiple of 4", what, s.size());
  std::vector<uint8_t> out;
  out.reserve(s.size() / 4 * 3);
  for (size_t i = 0; i < s.size(); i += 4) {
    uint32_t n = 0;
    int pad = 0;
    for (size_t j = 0; j < 4; ++j) {
      const char c = s[i + j];
      if (c == '=' && i + 4 == s.size() && j >= 2) {
        ++pad;
        n <<= 6;
        continue;
      }
      const int v = value_of(c);
      if (v < 0 || pad) fail("{}: invalid base64 character at offset {}", what, i + j);
      n = n << 6 | uint32_t(v);
    }
    out.push_back(uint8_t(n >> 16));
    if (pad < 2) out.push_back(uint8_t(n >> 8));
    if (pad < 1) out.push_back(uint8_t(n));
  }
  return out;
}

std::string floats_to_base64(std::span<const float> x) {
  static_assert(std::endian::native == std::endian::little, "artifacts store little-endian floats");
  return base64_encode({reinterpret_cast<const uint8_t*>(x.data()), x.size_bytes()});
}

std::vector<float> floats_from_base64(std::string_view text, const std::string& what) {
  const auto b = base64_decode(text, what);
  if (b.size() % sizeof(float)) fail("{}: {} bytes are not whole float32 values", what, b.size());
  std::vector<float> x(b.size() / sizeof(float));
  std::memcpy(x.data(), b.data(), b.size());
  return x;
}

}  // namespace kvb
