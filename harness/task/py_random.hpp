#pragma once
// Python's `random` module and numpy's legacy global generator, call for call (as CPython's
// Lib/random.py and numpy's legacy RandomState compute them), so that RULER samples generated here can
// be compared with RULER's own and lm-evaluation-harness's few-shot draws reproduced.
#include <array>
#include <cstdint>
#include <string>
#include <vector>

namespace kvb {

class MT19937 {
 public:
  void init_genrand(uint32_t s);
  void init_by_array(const std::vector<uint32_t>& key);
  uint32_t next32();

 private:
  std::array<uint32_t, 624> mt_{};
  int i_ = 625;
};

class PyRandom {
 public:
  explicit PyRandom(uint64_t seed) { seed_int(seed); }
  void seed_int(uint64_t seed);
  double random();
  uint32_t getrandbits32(int k);             // k <= 32
  std::array<uint32_t, 4> getrandbits128();  // least significant word first
  uint64_t randbelow(uint64_t n);
  int64_t randint(int64_t a, int64_t b) { return a + static_cast<int64_t>(randbelow(uint64_t(b - a + 1))); }
  size_t choice_index(size_t n) { return static_cast<size_t>(randbelow(n)); }
  template <typename T>
  void shuffle(std::vector<T>& x) {
    for (size_t i = x.size(); i-- > 1;) std::swap(x[i], x[static_cast<size_t>(randbelow(i + 1))]);
  }
  // random.sample(range(n), k)
  std::vector<size_t> sample(size_t n, size_t k);
  // uuid.UUID(int=getrandbits(128), version=4), lowercase 8-4-4-4-12
  std::string uuid4();

 private:
  MT19937 mt_;
};

// numpy.random legacy global generator (only randint and rand are needed).
class NumpyRandom {
 public:
  explicit NumpyRandom(uint32_t seed) { mt_.init_genrand(seed); }
  int64_t randint(int64_t lo, int64_t hi);  // hi exclusive
  double rand();

 private:
  MT19937 mt_;
};

}  // namespace kvb
