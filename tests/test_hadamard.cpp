// Hadamard rotations (kernels/cpu/hadamard.hpp) against their definition: orthonormal, the fast
// transform equal to the reference matrix, the transpose its inverse.
#include <catch2/catch.hpp>
#include <cmath>
#include <random>
#include <string>
#include <tuple>
#include <vector>

#include "kernels/cpu/hadamard.hpp"

using namespace kvb;

TEST_CASE("hadamard: Palu's orders and matrices, orthonormal, the fast transform is the matrix",
          "[kernels][hadamard]") {
  // Palu's get_hadK: the first listed factor dividing n, with a power-of-two quotient.
  CHECK(hadamard_order(64) == 1);
  CHECK(hadamard_order(96) == 12);
  CHECK(hadamard_order(160) == 40);  // 40 comes before 20 in Palu's list
  CHECK(hadamard_order(320) == 40);
  CHECK(hadamard_order(120) == 60);
  CHECK(hadamard_order(224) == 28);  // a table kvbench does not build
  CHECK(!hadamard_buildable(28));
  CHECK(hadamard_order(360) == 180);
  CHECK(hadamard_order(72) == 36);  // before 12: another table
  CHECK(!hadamard_buildable(36));
  CHECK(hadamard_order(540) == 0);  // 180 x 3: Palu's assertion fails
  CHECK(hadamard_order(6) == 0);
  CHECK(hadamard_order(0) == 0);
  // The orientation of Palu's stored order-12 matrix (its hadamard_utils.py get_had12), rows 0 and 1:
  // a transposed Paley matrix would give another rotation.
  const std::vector<double> h96 = hadamard_matrix_ref(96);
  const std::vector<int> row0 = {1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1, -1};
  const std::vector<int> row1 = {1, 1, -1, 1, -1, -1, -1, 1, 1, 1, -1, 1};
  for (int j = 0; j < 12; ++j) {
    // H_96 = (H_12 (x) S_8) / sqrt(96): element (8 a, 8 c) is H_12[a][c] / sqrt(96).
    CHECK(h96[size_t(0) * 96 + 8 * j] * std::sqrt(96.0) == Approx(row0[size_t(j)]));
    CHECK(h96[size_t(8) * 96 + 8 * j] * std::sqrt(96.0) == Approx(row1[size_t(j)]));
  }
  std::mt19937 rng(7);
  std::normal_distribution<float> normal;
  for (int n : {1, 2, 4, 8, 32, 64, 96, 120, 160, 192, 320, 360}) {
    INFO("n = " << n);
    const std::vector<double> H = hadamard_matrix_ref(n);
    double worst = 0;
    for (int i = 0; i < n; ++i)
      for (int j = 0; j < n; ++j) {
        CHECK(std::abs(std::abs(H[size_t(i) * n + j]) * std::sqrt(double(n)) - 1) < 1e-12);
        double s = 0;
        for (int c = 0; c < n; ++c) s += H[size_t(i) * n + c] * H[size_t(j) * n + c];
        worst = std::max(worst, std::abs(s - (i == j ? 1.0 : 0.0)));
      }
    CHECK(worst < 1e-12);
    std::vector<float> x(static_cast<size_t>(n));
    for (float& v : x) v = normal(rng);
    for (bool transpose : {false, true}) {
      std::vector<float> y = x;
      hadamard_rotate(y.data(), n, transpose);
      for (int i = 0; i < n; ++i) {
        double want = 0;
        for (int c = 0; c < n; ++c) want += (transpose ? H[size_t(c) * n + i] : H[size_t(i) * n + c]) * x[size_t(c)];
        CHECK(std::abs(y[size_t(i)] - want) < 1e-5);
      }
      hadamard_rotate(y.data(), n, !transpose);
      for (int i = 0; i < n; ++i) CHECK(std::abs(y[size_t(i)] - x[size_t(i)]) < 1e-5);
    }
  }
  // Sylvester in natural order, as Palu's butterflies: row 1 of S_4 is (1, -1, 1, -1) / 2.
  const std::vector<double> s4 = hadamard_matrix_ref(4);
  CHECK(s4[4] == 0.5);
  CHECK(s4[5] == -0.5);
  CHECK(s4[6] == 0.5);
  CHECK(s4[7] == -0.5);
  // Every factor kvbench builds against Palu's table of that order: rows 1 and K - 1 as bits (+1: 1),
  // column 0 the most significant, read off its hadamard_utils.py.
  const std::vector<std::tuple<int, std::string, std::string>> palu_rows = {
      {12, "d1d", "a3b"},
      {20, "d8579", "b0af3"},
      {40, "d8579d8579", "b0af34f50c"},
      {60, "d15b10c1f3dc95d", "a2b62183e7b92bb"},
      {108, "d3c0b754c10b199cbdf3544bf0d", "a7816ea9821633397be6a897e1b"},
      {140, "d855bb9860c8525f057c16d7b3e79889579", "b0ab7730c190a4be0af82daf67cf3112af3"},
      {180, "d1d812d57b64139182e1851d79e2f9d8df648552df91d", "a3b025aaf6c8272305c30a3af3c5f3b1bec90aa5bf23b"}};
  for (const auto& [K, second, last] : palu_rows) {
    INFO("order " << K);
    REQUIRE(hadamard_order(K) == K);
    const std::vector<double> h = hadamard_matrix_ref(K);
    auto bits = [&](int row) {
      std::string hex;
      const int pad = (4 - K % 4) % 4;  // the hex string's leading bits
      unsigned nibble = 0;
      for (int j = -pad; j < K; ++j) {
        nibble = nibble * 2 + (j >= 0 && h[size_t(row) * K + j] > 0 ? 1 : 0);
        if ((j + pad + 1) % 4 == 0) {
          hex += "0123456789abcdef"[nibble];
          nibble = 0;
        }
      }
      return hex.substr(hex.find_first_not_of('0'));
    };
    CHECK(bits(1) == second);
    CHECK(bits(K - 1) == last);
  }
  std::vector<float> bad(224, 1.0f);
  CHECK_THROWS(hadamard_rotate(bad.data(), 6));
  CHECK_THROWS(hadamard_rotate(bad.data(), 224));  // Palu's order-28 table, not built
}
