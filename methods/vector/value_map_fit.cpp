#include "methods/vector/value_map_fit.hpp"

#include <cblas.h>

#include "harness/util/error.hpp"

// LAPACK's Cholesky solve (OpenBLAS ships it); column-major, as Fortran.
extern "C" void dposv_(const char* uplo, const int* n, const int* nrhs, double* a, const int* lda, double* b,
                       const int* ldb, int* info);

namespace kvb {

OlsFit::OlsFit(int dx, int dy) : dx_(dx), dy_(dy), gxx_(size_t(dx) * dx, 0.0), gxy_(size_t(dx) * dy, 0.0) {}

void OlsFit::add(const float* x, size_t xs, const float* y, size_t ys, size_t rows) {
  buf_x_.resize(rows * size_t(dx_));
  buf_y_.resize(rows * size_t(dy_));
  for (size_t r = 0; r < rows; ++r) {
    for (int i = 0; i < dx_; ++i) buf_x_[r * dx_ + i] = x[r * xs + i];
    for (int i = 0; i < dy_; ++i) buf_y_[r * dy_ + i] = y[r * ys + i];
  }
  const int n = static_cast<int>(rows);
  cblas_dsyrk(CblasRowMajor, CblasUpper, CblasTrans, dx_, n, 1.0, buf_x_.data(), dx_, 1.0, gxx_.data(), dx_);
  cblas_dgemm(CblasRowMajor, CblasTrans, CblasNoTrans, dx_, dy_, n, 1.0, buf_x_.data(), dx_, buf_y_.data(), dy_, 1.0,
              gxy_.data(), dy_);
  n_ += rows;
}

void OlsFit::add_ref(const float* x, size_t xs, const float* y, size_t ys, size_t rows) {
  for (size_t r = 0; r < rows; ++r) {
    for (int i = 0; i < dx_; ++i) {
      for (int j = i; j < dx_; ++j) gxx_[size_t(i) * dx_ + j] += double(x[r * xs + i]) * x[r * xs + j];
      for (int j = 0; j < dy_; ++j) gxy_[size_t(i) * dy_ + j] += double(x[r * xs + i]) * y[r * ys + j];
    }
  }
  n_ += rows;
}

std::vector<double> OlsFit::solve(double rel_lambda) const {
  if (n_ == 0) fail("least squares: no rows were added");
  std::vector<double> a = gxx_, b = gxy_;
  double trace = 0;
  for (int i = 0; i < dx_; ++i) trace += a[size_t(i) * dx_ + i];
  const double lambda = rel_lambda * trace / dx_;
  for (int i = 0; i < dx_; ++i) a[size_t(i) * dx_ + i] += lambda;
  // Column-major: the symmetric Gram is its own transpose (its upper triangle in row-major is the lower
  // in column-major), and B goes in as B^T [dy, dx] column-major = our row-major [dx, dy] transposed.
  std::vector<double> bt(size_t(dx_) * dy_);
  for (int i = 0; i < dx_; ++i)
    for (int j = 0; j < dy_; ++j) bt[size_t(j) * dx_ + i] = b[size_t(i) * dy_ + j];
  const char uplo = 'L';
  int info = 0;
  dposv_(&uplo, &dx_, &dy_, a.data(), &dx_, bt.data(), &dx_, &info);
  if (info != 0)
    fail(
        "least squares: the {}x{} Gram matrix of {} rows is not positive definite (LAPACK info {}); add rows or "
        "raise the ridge",
        dx_, dx_, n_, info);
  // bt holds the solution X [dx, dy] column-major, i.e. X^T [dy, dx] row-major: W = X^T.
  return bt;
}

void R2Score::add(const double* pred, const float* y, size_t ys, size_t rows) {
  const size_t dy = sum_.size();
  for (size_t r = 0; r < rows; ++r)
    for (size_t i = 0; i < dy; ++i) {
      const double v = y[r * ys + i], e = v - pred[r * dy + i];
      sse_ += e * e;
      sum_[i] += v;
      sumsq_ += v * v;
    }
  n_ += rows;
}

void R2Score::merge(const R2Score& o) {
  for (size_t i = 0; i < sum_.size(); ++i) sum_[i] += o.sum_[i];
  sse_ += o.sse_;
  sumsq_ += o.sumsq_;
  n_ += o.n_;
}

double R2Score::r2() const {
  if (n_ == 0) return 0.0;
  double sst = sumsq_;
  for (double s : sum_) sst -= s * s / static_cast<double>(n_);
  return sst > 0 ? 1.0 - sse_ / sst : 0.0;
}

}  // namespace kvb
