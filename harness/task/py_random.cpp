#include "harness/task/py_random.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <bit>
#include <cmath>
#include <set>

#include "harness/util/error.hpp"

namespace kvb {

void MT19937::init_genrand(uint32_t s) {
  mt_[0] = s;
  for (int i = 1; i < 624; ++i) mt_[i] = 1812433253u * (mt_[i - 1] ^ (mt_[i - 1] >> 30)) + uint32_t(i);
  i_ = 624;
}

void MT19937::init_by_array(const std::vector<uint32_t>& key) {
  init_genrand(19650218u);
  int i = 1;
  size_t j = 0;
  for (size_t k = std::max<size_t>(624, key.size()); k; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1664525u)) + key[j] + uint32_t(j);
    ++i;
    ++j;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
    if (j >= key.size()) j = 0;
  }
  for (int k = 623; k; --k) {
    mt_[i] = (mt_[i] ^ ((mt_[i - 1] ^ (mt_[i - 1] >> 30)) * 1566083941u)) - uint32_t(i);
    ++i;
    if (i >= 624) {
      mt_[0] = mt_[623];
      i = 1;
    }
  }
  mt_[0] = 0x80000000u;
  i_ = 624;
}

uint32_t MT19937::next32() {
  if (i_ >= 624) {
    for (int k = 0; k < 624; ++k) {
      const uint32_t y = (mt_[k] & 0x80000000u) | (mt_[(k + 1) % 624] & 0x7fffffffu);
      mt_[k] = mt_[(k + 397) % 624] ^ (y >> 1) ^ ((y & 1u) ? 0x9908b0dfu : 0u);
    }
    i_ = 0;
  }
  uint32_t y = mt_[i_++];
  y ^= y >> 11;
  y ^= (y << 7) & 0x9d2c5680u;
  y ^= (y << 15) & 0xefc60000u;
  y ^= y >> 18;
  return y;
}

void PyRandom::seed_int(uint64_t seed) {
  std::vector<uint32_t> key;
  do {
    key.push_back(static_cast<uint32_t>(seed));
    seed >>= 32;
  } while (seed);
  mt_.init_by_array(key);
}

double PyRandom::random() {
  const uint32_t a = mt_.next32() >> 5, b = mt_.next32() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

uint32_t PyRandom::getrandbits32(int k) {
  if (k <= 0 || k > 32) fail("getrandbits32: k = {}", k);
  return mt_.next32() >> (32 - k);
}

std::array<uint32_t, 4> PyRandom::getrandbits128() {
  std::array<uint32_t, 4> w{};
  for (auto& x : w) x = mt_.next32();
  return w;
}

uint64_t PyRandom::randbelow(uint64_t n) {
  if (n == 0) fail("randbelow(0)");
  const int k = static_cast<int>(std::bit_width(n));
  if (k > 32) fail("randbelow: {} needs more than 32 bits", n);
  uint64_t r = getrandbits32(k);
  while (r >= n) r = getrandbits32(k);
  return r;
}

std::vector<size_t> PyRandom::sample(size_t n, size_t k) {
  if (k > n) fail("sample larger than population ({} > {})", k, n);
  size_t setsize = 21;
  if (k > 5) setsize += size_t(std::pow(4.0, std::ceil(std::log(3.0 * double(k)) / std::log(4.0))));
  std::vector<size_t> out;
  if (n <= setsize) {
    std::vector<size_t> pool(n);
    for (size_t i = 0; i < n; ++i) pool[i] = i;
    for (size_t i = 0; i < k; ++i) {
      const size_t j = static_cast<size_t>(randbelow(n - i));
      out.push_back(pool[j]);
      pool[j] = pool[n - i - 1];
    }
  } else {
    std::set<size_t> used;
    for (size_t i = 0; i < k; ++i) {
      size_t j = static_cast<size_t>(randbelow(n));
      while (used.count(j)) j = static_cast<size_t>(randbelow(n));
      used.insert(j);
      out.push_back(j);
    }
  }
  return out;
}

std::string PyRandom::uuid4() {
  auto w = getrandbits128();  // w[0] least significant
  // version nibble (bits 76-79) = 4; variant bits 62-63 = 10
  w[2] = (w[2] & ~0x0000f000u) | 0x00004000u;
  w[1] = (w[1] & ~0xc0000000u) | 0x80000000u;
  const std::string hex = fmt::format("{:08x}{:08x}{:08x}{:08x}", w[3], w[2], w[1], w[0]);
  return hex.substr(0, 8) + "-" + hex.substr(8, 4) + "-" + hex.substr(12, 4) + "-" + hex.substr(16, 4) + "-" +
         hex.substr(20);
}

int64_t NumpyRandom::randint(int64_t lo, int64_t hi) {
  const uint64_t rng = uint64_t(hi - 1 - lo);
  uint64_t mask = rng;
  for (int s = 1; s < 64; s <<= 1) mask |= mask >> s;
  uint64_t v = mt_.next32() & mask;
  while (v > rng) v = mt_.next32() & mask;
  return lo + int64_t(v);
}

double NumpyRandom::rand() {
  const uint32_t a = mt_.next32() >> 5, b = mt_.next32() >> 6;
  return (a * 67108864.0 + b) * (1.0 / 9007199254740992.0);
}

}  // namespace kvb
