// Python-compatible randomness (spec/benchmarks.md Appendix A test vectors) and RULER's synthetic tasks.
#include "tasks/ruler/py_random.hpp"
#include "test_util.hpp"

using namespace kvb;

TEST_CASE("Python random and numpy legacy streams match the reference vectors", "[tasks][ruler]") {
  {
    PyRandom r(42);
    CHECK(r.random() == 0.6394267984578837);
    CHECK(r.random() == 0.025010755222666936);
    CHECK(r.random() == 0.27502931836911926);
  }
  CHECK(PyRandom(42).getrandbits32(32) == 2746317213u);
  CHECK(PyRandom(42).randint(1000000, 9999999) == 2867825);
  CHECK(PyRandom(42).uuid4() == "bdd640fb-0667-4ad1-9c80-317fa3b1799d");
  std::vector<int> v = {0, 1, 2, 3, 4, 5, 6, 7, 8, 9};
  PyRandom(42).shuffle(v);
  CHECK(v == std::vector<int>{7, 3, 2, 8, 5, 6, 9, 4, 0, 1});
  CHECK(PyRandom(42).sample(100, 4) == std::vector<size_t>{81, 14, 3, 94});
  {
    PyRandom r(42);
    std::string s;
    for (int i = 0; i < 5; ++i) s += static_cast<char>('A' + static_cast<int>(r.random() * 26));
    CHECK(s == "QAHFT");
  }
  CHECK(NumpyRandom(42).rand() == 0.3745401188473625);
  NumpyRandom n(42);
  CHECK(n.randint(10000, 99999) == 25795);
  CHECK(n.randint(10000, 99999) == 10860);
  CHECK(NumpyRandom(42).randint(0, 100) == 51);
}
