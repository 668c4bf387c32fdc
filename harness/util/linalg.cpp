#include "harness/util/linalg.hpp"

#include <algorithm>
#include <numeric>

#include "harness/util/error.hpp"

// LAPACK (Fortran ABI), provided by OpenBLAS.
extern "C" {
void dsyevd_(const char* jobz, const char* uplo, const int* n, double* a, const int* lda, double* w, double* work,
             const int* lwork, int* iwork, const int* liwork, int* info);
void dgetrf_(const int* m, const int* n, double* a, const int* lda, int* ipiv, int* info);
void dpotrf_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dpotri_(const char* uplo, const int* n, double* a, const int* lda, int* info);
void dgetri_(const int* n, double* a, const int* lda, const int* ipiv, double* work, const int* lwork, int* info);
}

namespace kvb {

void symmetric_eigen(std::vector<double> a, int d, std::vector<double>& vals, std::vector<double>& vecs) {
  if (a.size() != size_t(d) * d) fail("symmetric_eigen: {} numbers for a {} x {} matrix", a.size(), d, d);
  std::vector<double> w(static_cast<size_t>(d));
  // Row-major upper triangle = column-major lower triangle.
  char jobz = 'V', uplo = 'L';
  int n = d, lda = d, lwork = -1, liwork = -1, info = 0, iwork_query = 0;
  double work_query = 0;
  dsyevd_(&jobz, &uplo, &n, a.data(), &lda, w.data(), &work_query, &lwork, &iwork_query, &liwork, &info);
  lwork = static_cast<int>(work_query);
  liwork = iwork_query;
  std::vector<double> work(static_cast<size_t>(lwork));
  std::vector<int> iwork(static_cast<size_t>(liwork));
  dsyevd_(&jobz, &uplo, &n, a.data(), &lda, w.data(), work.data(), &lwork, iwork.data(), &liwork, &info);
  if (info != 0) fail("symmetric_eigen: the eigensolver failed (LAPACK dsyevd info {})", info);
  std::vector<int> order(static_cast<size_t>(d));
  std::iota(order.begin(), order.end(), 0);
  std::stable_sort(order.begin(), order.end(), [&](int x, int y) { return w[size_t(x)] > w[size_t(y)]; });
  vals.resize(size_t(d));
  vecs.resize(size_t(d) * d);
  // Column-major output: eigenvector k is a[k*d .. k*d + d).
  for (int j = 0; j < d; ++j) {
    vals[size_t(j)] = w[size_t(order[size_t(j)])];
    for (int i = 0; i < d; ++i) vecs[size_t(i) * d + j] = a[size_t(order[size_t(j)]) * d + i];
  }
}

bool invert_in_place(std::vector<double>& a, int d) {
  if (a.size() != size_t(d) * d) fail("invert_in_place: {} numbers for a {} x {} matrix", a.size(), d, d);
  // inv(A^T) = inv(A)^T, so LAPACK's column-major view of the row-major array inverts it just as well.
  std::vector<int> ipiv(static_cast<size_t>(d));
  int n = d, info = 0;
  dgetrf_(&n, &n, a.data(), &n, ipiv.data(), &info);
  if (info != 0) return false;
  int lwork = -1;
  double query = 0;
  dgetri_(&n, a.data(), &n, ipiv.data(), &query, &lwork, &info);
  lwork = std::max(1, static_cast<int>(query));
  std::vector<double> work(static_cast<size_t>(lwork));
  dgetri_(&n, a.data(), &n, ipiv.data(), work.data(), &lwork, &info);
  return info == 0;
}

bool inverse_cholesky_upper(std::vector<double>& a, int d) {
  if (a.size() != size_t(d) * d) fail("inverse_cholesky_upper: {} numbers for a {} x {} matrix", a.size(), d, d);
  // LAPACK's column-major lower triangle is the row-major upper one: a = L L^T there is U^T U here.
  char uplo = 'L';
  int n = d, info = 0;
  dpotrf_(&uplo, &n, a.data(), &n, &info);
  if (info != 0) return false;
  dpotri_(&uplo, &n, a.data(), &n, &info);
  if (info != 0) return false;
  dpotrf_(&uplo, &n, a.data(), &n, &info);
  if (info != 0) return false;
  for (int i = 1; i < d; ++i) std::fill_n(a.data() + size_t(i) * d, i, 0.0);  // below the diagonal: untouched input
  return true;
}

}  // namespace kvb
