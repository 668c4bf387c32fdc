#include "kernels/cpu/hadamard.hpp"

#include <bit>
#include <cmath>
#include <map>
#include <mutex>
#include <stdexcept>

namespace kvb {
namespace {

// Palu's H_K (entries +-1, row-major): Paley's first construction for the prime q = K - 1 in the
// orientation of Palu's tables, S_2 (x) H_20 for 40, [1] for 1.
std::vector<int> palu_factor(int K) {
  if (K == 1) return {1};
  if (K == 40) {
    const std::vector<int> h = palu_factor(20);
    std::vector<int> out(size_t(40) * 40);
    for (int i = 0; i < 40; ++i)
      for (int j = 0; j < 40; ++j)
        out[size_t(i) * 40 + j] = (i >= 20 && j >= 20 ? -1 : 1) * h[size_t(i % 20) * 20 + j % 20];
    return out;
  }
  const int q = K - 1;
  std::vector<bool> square(size_t(q), false);  // the quadratic residues mod q
  for (int x = 1; x < q; ++x) square[size_t(x * x % q)] = true;
  auto chi = [&](int x) { return x % q == 0 ? 0 : square[size_t((x % q + q) % q)] ? 1 : -1; };
  std::vector<int> h(size_t(K) * K);
  for (int i = 0; i < K; ++i)
    for (int j = 0; j < K; ++j) {
      int s;  // S = [[0, -1^T], [1, Q]], Q_ij = chi(i - j)
      if (i == 0)
        s = j == 0 ? 0 : -1;
      else if (j == 0)
        s = 1;
      else
        s = chi(i - j);
      h[size_t(i) * K + j] = s + (i == j ? 1 : 0);
    }
  return h;
}

const std::vector<int>& palu_factor_cached(int K) {
  static std::mutex mu;
  static std::map<int, std::vector<int>> cache;
  std::lock_guard lock(mu);
  auto it = cache.find(K);
  if (it == cache.end()) it = cache.emplace(K, palu_factor(K)).first;
  return it->second;
}

}  // namespace

int hadamard_order(int n) {
  if (n < 1) return 0;
  for (int K : {244, 180, 172, 156, 140, 108, 92, 84, 76, 68, 60, 52, 44, 36, 28, 40, 20, 12})
    if (n % K == 0) return std::has_single_bit(unsigned(n / K)) ? K : 0;
  return std::has_single_bit(unsigned(n)) ? 1 : 0;
}

bool hadamard_buildable(int K) {
  for (int k : {1, 12, 20, 40, 60, 108, 140, 180})
    if (K == k) return true;
  return false;
}

void hadamard_rotate(float* x, int n, bool transpose) {
  const int K = hadamard_order(n);
  if (!hadamard_buildable(K)) throw std::invalid_argument("hadamard_rotate: no Hadamard matrix of this length");
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
  const std::vector<int>& h = palu_factor_cached(K);
  for (int b = 0; b < M; ++b)
    for (int a = 0; a < K; ++a) {
      double s = 0;
      for (int c = 0; c < K; ++c) s += (transpose ? h[size_t(c) * K + a] : h[size_t(a) * K + c]) * y[size_t(c) * M + b];
      x[size_t(a) * M + b] = static_cast<float>(s * scale);
    }
}

std::vector<double> hadamard_matrix_ref(int n) {
  const int K = hadamard_order(n);
  if (!hadamard_buildable(K)) throw std::invalid_argument("hadamard_matrix_ref: no Hadamard matrix of this length");
  const int M = n / K;
  const std::vector<int> h = palu_factor(K);
  std::vector<double> out(size_t(n) * n);
  for (int i = 0; i < n; ++i)
    for (int j = 0; j < n; ++j) {
      const int sylvester = std::popcount(unsigned((i % M) & (j % M))) % 2 ? -1 : 1;
      out[size_t(i) * n + j] = h[size_t(i / M) * K + j / M] * sylvester / std::sqrt(double(n));
    }
  return out;
}

}  // namespace kvb
