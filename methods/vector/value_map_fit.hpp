#pragma once
// Least-squares maps y ~ W x fitted by streaming rows into fp64 Gram sums (VECTOR's key-to-value
// regression, README.md §6), and the held-out R^2 of a map (§7).
#include <cstddef>
#include <vector>

namespace kvb {

class OlsFit {
 public:
  OlsFit(int dx, int dy);
  // Adds `rows` rows; row r of x starts at x + r * x_stride (dx floats), of y at y + r * y_stride.
  void add(const float* x, size_t x_stride, const float* y, size_t y_stride, size_t rows);      // BLAS
  void add_ref(const float* x, size_t x_stride, const float* y, size_t y_stride, size_t rows);  // loops
  // W [dy, dx] row-major, y = W x: (Gxx + lambda I)^-1 Gxy by Cholesky, lambda = rel_lambda trace(Gxx)/dx.
  std::vector<double> solve(double rel_lambda) const;
  size_t rows() const { return n_; }
  const std::vector<double>& gxx() const { return gxx_; }  // [dx, dx], upper triangle filled
  const std::vector<double>& gxy() const { return gxy_; }  // [dx, dy]

 private:
  int dx_, dy_;
  size_t n_ = 0;
  std::vector<double> gxx_, gxy_, buf_x_, buf_y_;
};

// R^2 = 1 - sum |y - W x|^2 / sum |y - mean y|^2 over the rows added (the mean per output dimension).
class R2Score {
 public:
  explicit R2Score(int dy) : sum_(size_t(dy), 0.0) {}
  // `pred` and `y` rows of dy values.
  void add(const double* pred, const float* y, size_t y_stride, size_t rows);
  void merge(const R2Score& o);
  double r2() const;
  double sse() const { return sse_; }

 private:
  std::vector<double> sum_;
  double sse_ = 0, sumsq_ = 0;
  size_t n_ = 0;
};

}  // namespace kvb
