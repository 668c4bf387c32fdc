#pragma once
// Orthonormal Hadamard rotations of length n = K 2^m, as Palu's latent quantization (after QuaRot and
// QuIP#) applies them: H = (H_K (x) S) / sqrt(n), S the Sylvester matrix of order 2^m in natural order
// (S_1 = [1], S_2j = [[S_j, S_j], [S_j, -S_j]]) on the low index bits, H_K on the high index: element
// i = a 2^m + b. K is the factor Palu's get_hadK picks: the first of 244, 180, 172, 156, 140, 108, 92,
// 84, 76, 68, 60, 52, 44, 36, 28, 40, 20, 12 that divides n with a power-of-two quotient, else 1. Palu
// stores its H_K as tables; those of orders 12, 20, 60, 108, 140 and 180 are Paley's first
// construction for the prime q = K - 1, I + [[0, -1^T], [1, Q]] with Q_ij = chi(i - j) (chi the
// quadratic character mod q), and order 40 is S_2 (x) H_20. kvbench builds these; the others it
// refuses rather than rotate by another matrix.
#include <vector>

namespace kvb {

// The order K of the H_K factor Palu takes for length n: 1 for a power of two, 0 where Palu has none.
int hadamard_order(int n);
// Whether kvbench builds Palu's H_K of order K (K = 1 included).
bool hadamard_buildable(int K);
// x[0..n) <- H x, or H^T x; hadamard_buildable(hadamard_order(n)) must hold.
void hadamard_rotate(float* x, int n, bool transpose = false);
// The plain reference: H [n, n] row-major in double, each element from its definition.
std::vector<double> hadamard_matrix_ref(int n);

}  // namespace kvb
