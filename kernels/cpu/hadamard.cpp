#include "kernels/cpu/hadamard.hpp"

#include <bit>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

namespace kvb {
namespace {

bool is_prime(int q) {
  if (q < 2) return false;
  for (int f = 2; f * f <= q; ++f)
    if (q % f == 0) return false;
  return true;
}

// Paley's first construction of order K = q + 1 (entries +-1, row-major); [1] for K = 1.
std::vector<int> paley(int K) {
  if (K == 1) return {1};
  const int q = K - 1;
  std::vector<bool> square(size_t(q), false);  // the quadratic residues mod q
  for (int x = 1; x < q; ++x) square[size_t(x * x % q)] = true;
  auto chi = [&](int x) { return x % q == 0 ? 0 : square[size_t((x % q + q) % q)] ? 1 : -1; };
  std::vector<int> h(size_t(K) * K);
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) {
      int s;  // S = [[0, 1^T], [-1, Q]], Q_ij = chi(j - i)
      if (i == 0)
        s = j == 0 ? 0 : 1;
      else if (j == 0)
        s = -1;
      else
        s = chi(j - i);
      h[size_t(i) * K + j] = s + (i == j ? 1 : 0);
    }
  return h;
}

const std::vector<int>& paley_cached(int K) {
  static std::mutex mu;
  static std::map<int, std::vector<int>> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(K);
  if (it == cache.end()) it = cache.emplace(K, paley(K)).first;
  return it->second;
}

}  // namespace

int hadamard_order(int n) {
  if (n < 1) return 0;
  if (std::has_single_bit(unsigned(n))) return 1;
  const int odd = n >> std::countr_zero(unsigned(n));
  for (int K = odd * 4; K <= n; K *= 2)
    if (n % K == 0 && is_prime(K - 1) && (K - 1) % 4 == 3) return K;
  return 0;
}

void hadamard_rotate(float* x, int n, bool transpose) {
  const int K = hadamard_order(n);
  if (K == 0) throw std::invalid_argument("hadamard_rotate: no Hadamard order for this length");
  const int M = n / K;
  // S on the low bits of every block of M: the butterflies in double, one block at a time.
  std::vector<double> y(x, x + n);
  for (int a = 0; a < K; ++a) {
    double* blk = y.data() + size_t(a) * M;
    for (int h = 1; h < M; h *= 2)
      for (int i = 0; i < M; i += 2 * h)
        for (int j = i; j < i + h; ++j) {
          const double u = blk[j], w = blk[j + h];
          blk[j] = u + w;
          blk[j + h] = u - w;
        }
  }
  const double scale = 1.0 / std::sqrt(double(n));
  if (K == 1) {
    for (int i = 0; i < n; ++i) x[i] = static_cast<float>(y[size_t(i)] * scale);
    return;
  }
  // H_K (or its transpose) across the blocks.
  const std::vector<int>& h = paley_cached(K);
  for (int b = 0; b < M; ++b)
    for (int a = 0; a < K; ++a) {
      double s = 0;
      for (int c = 0; c < K; ++c) s += (transpose ? h[size_t(c) * K + a] : h[size_t(a) * K + c]) * y[size_t(c) * M + b];
      x[size_t(a) * M + b] = static_cast<float>(s * scale);
    }
}

std::vector<double> hadamard_matrix_ref(int n) {
  const int K = hadamard_order(n);
  if (K == 0) throw std::invalid_argument("hadamard_matrix_ref: no Hadamard order for this length");
  const int M = n / K;
  const std::vector<int> h = paley(K);
  std::vector<double> out(size_t(n) * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const int sylvester = std::popcount(unsigned((i % M) & (j % M))) % 2 ? -1 : 1;
      out[size_t(i) * n + j] = h[size_t(i / M) * K + j / M] * sylvester / std::sqrt(double(n));
    }
  return out;
}

}  // namespace kvb
