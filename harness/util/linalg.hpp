#pragma once
// Dense linear algebra in double through LAPACK (OpenBLAS): the symmetric eigensolver of PCA bases
// and the inverse of learned bases.
#include <vector>

namespace kvb {

// Eigen-decomposition of the symmetric matrix a[d, d] (row-major; only its upper triangle is read):
// eigenvalues in descending order, and vecs[d, d] row-major whose column j is the unit eigenvector of
// vals[j] (LAPACK dsyevd, as numpy.linalg.eigh). Eigenvector signs are arbitrary.
void symmetric_eigen(std::vector<double> a, int d, std::vector<double>& vals, std::vector<double>& vecs);

// Inverts a[d, d] (row-major) in place by LU with partial pivoting (dgetrf, dgetri); false when the
// matrix is singular to working precision (a is then unspecified).
bool invert_in_place(std::vector<double>& a, int d);

// The upper Cholesky factor U of the inverse of the symmetric positive definite a[d, d] (row-major):
// inverse(a) = U^T U, U upper triangular with zeros below (GPTQ's Hinv: torch.linalg.cholesky,
// cholesky_inverse, cholesky(upper=True)). False when a is not positive definite.
bool inverse_cholesky_upper(std::vector<double>& a, int d);

}  // namespace kvb
