#include "methods/kvcrush/fingerprints.hpp"

#include <algorithm>
#include <bit>
#include <cmath>
#include <functional>

#include "harness/util/error.hpp"

namespace kvb {
namespace {

uint64_t splitmix64(uint64_t& state) {
  uint64_t z = (state += 0x9E3779B97F4A7C15ULL);
  z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ULL;
  z = (z ^ (z >> 27)) * 0x94D049BB133111EBULL;
  return z ^ (z >> 31);
}

// round(num / den), half to even, in integers (numpy's float linspace can land an ulp off a tie).
long round_ratio(long num, long den) {
  const long q = num / den, r2 = 2 * (num % den);
  return r2 > den || (r2 == den && q % 2 == 1) ? q + 1 : q;
}

}  // namespace

int hamming(const Bits& a, const Bits& b) {
  int d = 0;
  for (size_t i = 0; i < a.size(); ++i) d += std::popcount(a[i] ^ b[i]);
  return d;
}

int hamming_ref(const Bits& a, const Bits& b) {
  int d = 0;
  for (int i = 0; i < static_cast<int>(a.size()) * 64; ++i) d += test_bit(a, i) != test_bit(b, i);
  return d;
}

std::vector<int> share_counts(int heads, int E, double q) {
  return std::vector<int>(size_t(heads), static_cast<int>(std::ceil(q * E)));
}

std::vector<Bits> fingerprints(const HeadScores& scores, int E, const std::vector<int>& marked) {
  const int hq = static_cast<int>(scores.size());
  std::vector<Bits> out(size_t(E), Bits(size_t(hq + 63) / 64, 0));
  if (E == 0) return out;
  if (marked.size() != scores.size()) fail("internal: {} marked counts for {} heads", marked.size(), hq);
  std::vector<float> sorted;
  for (int h = 0; h < hq; ++h) {
    if (static_cast<int>(scores[h].size()) < E) fail("internal: {} scores for {} prefix tokens", scores[h].size(), E);
    const int rank = std::clamp(marked[size_t(h)], 1, E);
    sorted.assign(scores[h].begin(), scores[h].begin() + E);
    std::nth_element(sorted.begin(), sorted.begin() + (rank - 1), sorted.end(), std::greater<>());
    const float theta = sorted[size_t(rank - 1)];
    for (int j = 0; j < E; ++j)
      if (scores[h][j] >= theta) set_bit(out[size_t(j)], h);
  }
  return out;
}

Bits anchor_fingerprint(const std::string& mode, const std::vector<Bits>& prints, const std::vector<int32_t>& cand,
                        int bits, uint64_t seed, int layer, int head) {
  Bits a(size_t(bits + 63) / 64, 0);
  if (mode == "alternate") {
    for (int i = 1; i < bits; i += 2) set_bit(a, i);
  } else if (mode == "ones") {
    for (int i = 0; i < bits; ++i) set_bit(a, i);
  } else if (mode == "mean" || mode == "inv_mean") {
    for (int i = 0; i < bits; ++i) {
      size_t ones = 0;
      for (int32_t j : cand) ones += test_bit(prints[size_t(j)], i);
      if ((2 * ones > cand.size()) == (mode == "mean")) set_bit(a, i);
    }
  } else if (mode == "random") {
    uint64_t state = seed * 0x100000001B3ULL ^ (static_cast<uint64_t>(layer) << 32 | static_cast<uint64_t>(head));
    uint64_t word = 0;
    for (int i = 0; i < bits; ++i) {
      if (i % 64 == 0) word = splitmix64(state);
      if ((word >> (i % 64)) & 1U) set_bit(a, i);
    }
  } else if (mode != "zeros") {
    fail("anchor '{}' is not one of alternate, mean, random, zeros, ones, inv_mean", mode);
  }
  return a;
}

std::vector<int32_t> order_by_distance(const std::vector<Bits>& prints, const std::vector<int32_t>& cand,
                                       const Bits& anchor) {
  std::vector<std::vector<int32_t>> by_distance(anchor.size() * 64 + 1);
  for (int32_t j : cand) by_distance[size_t(hamming(prints[size_t(j)], anchor))].push_back(j);
  std::vector<int32_t> order;
  order.reserve(cand.size());
  for (auto& bucket : by_distance) {
    std::sort(bucket.begin(), bucket.end());  // already ascending when the candidates are
    order.insert(order.end(), bucket.begin(), bucket.end());
  }
  return order;
}

std::vector<int32_t> pick_representatives(const std::string& group, const std::vector<Bits>& prints,
                                          const std::vector<int32_t>& ordered, int n) {
  const long C = static_cast<long>(ordered.size());
  if (n <= 0) return {};
  if (C <= n) return ordered;
  std::vector<int32_t> out;
  if (group == "sorted_stride") {
    for (long i = 0; i < n; ++i) out.push_back(ordered[size_t(n == 1 ? 0 : round_ratio(i * (C - 1), n - 1))]);
  } else if (group == "floor_stride") {
    for (long i = 0; i < n; ++i) out.push_back(ordered[size_t(i * (C / n))]);
  } else if (group == "bucket_centroid") {
    const int bits = prints.empty() ? 0 : static_cast<int>(prints[0].size()) * 64;
    long start = 0;
    for (long g = 0; g < n; ++g) {
      const long size = C / n + (g < C % n ? 1 : 0);
      Bits centroid(prints[0].size(), 0);
      for (int i = 0; i < bits; ++i) {
        long ones = 0;
        for (long r = start; r < start + size; ++r) ones += test_bit(prints[size_t(ordered[size_t(r)])], i);
        if (2 * ones > size) set_bit(centroid, i);
      }
      int32_t best = -1;
      int best_d = 0;
      for (long r = start; r < start + size; ++r) {
        const int32_t j = ordered[size_t(r)];
        const int d = hamming(prints[size_t(j)], centroid);
        if (best < 0 || d < best_d || (d == best_d && j < best)) {
          best = j;
          best_d = d;
        }
      }
      out.push_back(best);
      start += size;
    }
  } else {
    fail("grouping '{}' is not one of sorted_stride, floor_stride, bucket_centroid", group);
  }
  return out;
}

}  // namespace kvb
