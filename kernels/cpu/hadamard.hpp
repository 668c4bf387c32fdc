#pragma once
// Orthonormal Hadamard rotations of length n = K 2^m, in the layout Palu's latent quantization (after
// QuaRot) applies them: H = (H_K (x) S) / sqrt(n), S the Sylvester matrix of order 2^m in natural order
// (S_1 = [1], S_2j = [[S_j, S_j], [S_j, -S_j]]) on the low index bits, H_K on the high index: element
// i = a 2^m + b. K = 1 where n is a power of two (Palu's matrix exactly); otherwise H_K is Paley's
// first construction, I + [[0, 1^T], [-1, Q]] with Q the Jacobsthal matrix of a prime q = K - 1 = 3
// mod 4, for the smallest such K = odd part of n times a power of two (Palu's code takes stored
// matrices of orders 12, 20, 28, ... there: another orthogonal rotation, not the same one).
#include <vector>

namespace kvb {

// The order K of the H_K factor for length n, or 0 where no Paley order fits (n = 224 takes K = 224).
int hadamard_order(int n);
// x[0..n) <- H x, or H^T x; n must have hadamard_order(n) > 0.
void hadamard_rotate(float* x, int n, bool transpose = false);
// The plain reference: H [n, n] row-major in double, each element from its definition.
std::vector<double> hadamard_matrix_ref(int n);

}  // namespace kvb
