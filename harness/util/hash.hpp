#pragma once
// FNV-1a 64: a stable, dependency-free hash for keys that must not change between builds or machines
// (cell keys, model fingerprints).
#include <cstdint>
#include <string_view>

namespace kvb {

inline uint64_t fnv1a(std::string_view s, uint64_t h = 0xcbf29ce484222325ull) {
  for (unsigned char c : s) h = (h ^ c) * 0x100000001b3ull;
  return h;
}

}  // namespace kvb
