// PyramidKV's budget schedule against the reference's worked example.
#include <catch2/catch.hpp>

#include <algorithm>
#include <numeric>

#include "methods/pyramidkv/pyramidkv.hpp"

using namespace kvb;

TEST_CASE("PyramidKV schedule: the reference's worked example and exact totals", "[methods]") {
  // README.md §2: T=128, w=8, beta=20, L=32, S=8000 -> 234, 227, ..., 17 (+ window).
  const auto repro = pyramid_budgets(128, 8, 20, 8000, 32, false);
  CHECK(repro.front() == 234 + 8);
  CHECK(repro[1] == 227 + 8);
  CHECK(repro.back() == 17 + 8);
  CHECK(std::accumulate(repro.begin(), repro.end(), 0) - 32 * 8 == 4016);
  for (int T : {64, 128, 512, 2048})
    for (int S : {300, 2100, 5000, 8000}) {
      if (S <= T) continue;
      const auto exact = pyramid_budgets(T, 8, 20, S, 32, true);
      INFO("T=" << T << " S=" << S);
      CHECK(std::accumulate(exact.begin(), exact.end(), 0) == 32 * T);
      CHECK(std::is_sorted(exact.rbegin(), exact.rend()));  // non-increasing with depth
      for (int c : exact) CHECK(c <= S);
    }
}
