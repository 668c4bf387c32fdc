// The confidence intervals of the report's scores against hand computations, exact enumeration and
// simulated coverage.
#include <random>

#include "harness/report/stats.hpp"
#include "test_util.hpp"

using namespace kvb;

TEST_CASE("Wilson's interval equals the closed form computed by hand", "[stats]") {
  // 7 of 10: centre (0.7 + z^2/20) / (1 + z^2/10), half-width z/(1 + z^2/10) sqrt(0.021 + z^2/400).
  const auto m = wilson_interval(7, 10);
  CHECK(m.mean == Approx(0.7));
  CHECK(m.low == Approx(0.396780).margin(1e-6));
  CHECK(m.high == Approx(0.892208).margin(1e-6));
  // All successes: the upper end is 1, the lower n / (n + z^2).
  const auto all = wilson_interval(20, 20);
  CHECK(all.high == 1.0);
  CHECK(all.low == Approx(20 / (20 + kZ95 * kZ95)));
  CHECK(std::string(score_interval({{0, 1, 1, 0, 1, 1, 1, 0, 1, 1}}).method) == "wilson");
  CHECK(std::string(score_interval({{0, 0.5, 1}}).method) == "bootstrap");
}

TEST_CASE("the bootstrap's percentiles match the exact resampling distribution", "[stats]") {
  // Four samples: all 4^4 resamples are equally likely; the exact 2.5% and 97.5% quantiles of their
  // means, against the bootstrap's estimate from 40,000 draws.
  const std::vector<double> x = {0.2, 0.5, 0.9, 0.4};
  std::vector<double> means;
  for (int a = 0; a < 4; ++a)
    for (int b = 0; b < 4; ++b)
      for (int c = 0; c < 4; ++c)
        for (int d = 0; d < 4; ++d) means.push_back((x[a] + x[b] + x[c] + x[d]) / 4);
  std::sort(means.begin(), means.end());
  auto exact = [&](double q) {  // numpy's linear interpolation over the 256 equally likely means
    const double h = q * 255;
    const size_t lo = size_t(h);
    return means[lo] + (h - double(lo)) * (means[std::min<size_t>(lo + 1, 255)] - means[lo]);
  };
  const auto m = bootstrap_interval({x}, Average::Samples, 0.95, 40000);
  CHECK(m.mean == Approx(0.5));
  CHECK(m.low == Approx(exact(0.025)).margin(0.0126));  // one step of the discrete distribution
  CHECK(m.high == Approx(exact(0.975)).margin(0.0126));
  CHECK(m.low < m.mean);
  CHECK(m.high > m.mean);
}

TEST_CASE("strata: the pooled mean or the mean of strata means, and one sample shows no interval", "[stats]") {
  const std::vector<std::vector<double>> s = {{1, 1, 1, 1}, {0, 0.5}};
  CHECK(bootstrap_interval(s, Average::Samples).mean == Approx(4.5 / 6));
  CHECK(bootstrap_interval(s, Average::Strata).mean == Approx((1 + 0.25) / 2));
  // A stratum with no spread adds nothing to the interval's width.
  const auto one = bootstrap_interval({{1, 1, 1, 1}, {0, 0.5}}, Average::Strata);
  const auto alone = bootstrap_interval({{0, 0.5}}, Average::Strata);
  CHECK(one.high - one.low == Approx((alone.high - alone.low) / 2).margin(0.01));
  const auto single = score_interval({{0.4}});
  CHECK_FALSE(single.has_interval());
  CHECK(interval_text(single) == "40.00");
  CHECK(interval_text(wilson_interval(7, 10)) == "70.00 [39.68, 89.22]");
  CHECK_FALSE(bootstrap_interval({{0.4}, {0.6}}).has_interval());  // one sample in every stratum
}

TEST_CASE("95% intervals cover the true mean about 95% of the time", "[stats]") {
  std::mt19937_64 rng(5);
  SECTION("Wilson, Bernoulli(0.3), 40 samples") {
    std::bernoulli_distribution coin(0.3);
    int covered = 0;
    const int sims = 4000;
    for (int s = 0; s < sims; ++s) {
      int k = 0;
      for (int i = 0; i < 40; ++i) k += coin(rng);
      const auto m = wilson_interval(k, 40);
      covered += m.low <= 0.3 && 0.3 <= m.high;
    }
    const double coverage = double(covered) / sims;
    INFO("coverage " << coverage);
    CHECK(coverage > 0.93);
    CHECK(coverage < 0.97);
  }
  SECTION("bootstrap, uniform scores, 40 samples") {
    std::uniform_real_distribution<double> u(0, 1);
    int covered = 0;
    const int sims = 600;
    for (int s = 0; s < sims; ++s) {
      std::vector<double> x(40);
      for (auto& v : x) v = u(rng);
      const auto m = bootstrap_interval({x}, Average::Samples, 0.95, 1000, 1000 + uint64_t(s));
      covered += m.low <= 0.5 && 0.5 <= m.high;
    }
    // The percentile bootstrap runs slightly narrow at n = 40 (about 94%).
    const double coverage = double(covered) / sims;
    INFO("coverage " << coverage);
    CHECK(coverage > 0.91);
    CHECK(coverage < 0.98);
  }
}

TEST_CASE("no zero-width intervals: constant 0/1 scores get Wilson's, constant others none", "[stats]") {
  const auto ones = score_interval({{1, 1, 1}, {1, 1}});  // RULER tasks all solved, pooled
  CHECK(std::string(ones.method) == "wilson");
  CHECK(ones.low < 1.0);
  CHECK(ones.high == 1.0);
  const auto flat = score_interval({{0.5, 0.5, 0.5}});
  CHECK_FALSE(flat.has_interval());
  CHECK(interval_text(flat) == "50.00");
  CHECK_FALSE(bootstrap_interval({{0.25, 0.25}, {-0.5, -0.5, -0.5}}, Average::Strata).has_interval());
  CHECK(bootstrap_interval({{0.25, 0.25}, {-0.5, 0.5}}, Average::Strata).has_interval());
}
