#pragma once
// Binary token fingerprints and the grouping KVCrush builds on them (README.md §2-§6): one bit
// per attention head saying whether that head ranks the token in its top share, Hamming distances to
// one anchor fingerprint, and representatives picked along the distance order.
#include <cstdint>
#include <string>
#include <vector>

#include "harness/method/method.hpp"

namespace kvb {

// Bit h of a token's fingerprint; multiword beyond 64 heads.
using Bits = std::vector<uint64_t>;

inline bool test_bit(const Bits& b, int i) { return (b[size_t(i) / 64] >> (i % 64)) & 1U; }
inline void set_bit(Bits& b, int i) { b[size_t(i) / 64] |= uint64_t{1} << (i % 64); }
int hamming(const Bits& a, const Bits& b);      // popcount of a XOR b
int hamming_ref(const Bits& a, const Bits& b);  // bit by bit

// Fingerprints of the prefix [0, E): bit h of token j is set when scores[h][j] is at least head h's
// value at rank marked[h], descending (so each head marks its top marked[h] tokens, plus ties at the
// threshold). marked[h] is clamped to [1, E].
std::vector<Bits> fingerprints(const HeadScores& scores, int E, const std::vector<int>& marked);
// The marked counts of a share q of the prefix, the same for every head: ceil(q E).
std::vector<int> share_counts(int heads, int E, double q);

// The anchor fingerprint of `bits` bits. alternate: bit i = i mod 2; zeros; ones; mean: the majority
// (more than half set) over the candidates; inv_mean: its complement; random: i.i.d. bits of a
// splitmix64 stream seeded by (seed, layer, head).
Bits anchor_fingerprint(const std::string& mode, const std::vector<Bits>& prints, const std::vector<int32_t>& cand,
                        int bits, uint64_t seed, int layer, int head);

// The candidates ordered by (Hamming distance to the anchor, position), by counting sort: linear in
// their number.
std::vector<int32_t> order_by_distance(const std::vector<Bits>& prints, const std::vector<int32_t>& cand,
                                       const Bits& anchor);

// n picks from an ordered list of more than n. sorted_stride: ranks round(i (C - 1) / (n - 1)), half to
// even in exact arithmetic, so the nearest and the farthest are both picked. floor_stride: ranks
// i floor(C / n) from 0 (OpenVINO GenAI's picks). bucket_centroid: n contiguous buckets (the first C mod
// n one larger), each represented by the member nearest its bitwise-majority centroid (ties: lowest
// position).
std::vector<int32_t> pick_representatives(const std::string& group, const std::vector<Bits>& prints,
                                          const std::vector<int32_t>& ordered, int n);

}  // namespace kvb
