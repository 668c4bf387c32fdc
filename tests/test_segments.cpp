// Segment formats against their dense reconstructions, and KVmix's packing rules.
#include <algorithm>
#include <numeric>
#include <random>

#include "harness/cache/layer_cache.hpp"
#include "harness/cache/quantized_segment.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_quant.hpp"
#include "test_util.hpp"

using namespace kvb;

TEST_CASE("KV code packing: 32/b codes per word, 3-bit packs 11 with slot 10 in bits 30-31", "[segments]") {
  std::mt19937 rng(1);
  for (int bits : {1, 2, 3, 4}) {
    const int per = codes_per_word(bits), n = per * 5;
    std::vector<uint32_t> codes(n), back(n), words((n + per - 1) / per);
    for (int i = 0; i < n; ++i) codes[i] = static_cast<uint32_t>(rng() % (max_code(bits, i % per) + 1));
    pack_codes(codes.data(), n, bits, words.data());
    unpack_codes(words.data(), n, bits, back.data());
    CHECK(back == codes);
  }
  CHECK(codes_per_word(3) == 11);
  std::vector<uint32_t> c(11, 0), w(1);
  c[10] = 3;
  pack_codes(c.data(), 11, 3, w.data());
  CHECK(w[0] == 0xC0000000u);
  c[10] = 0;
  c[9] = 7;
  pack_codes(c.data(), 11, 3, w.data());
  CHECK(w[0] == 7u << 27);
}

TEST_CASE("group quantization error bounds; constant groups", "[segments]") {
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 2.0f);
  for (int bits : {1, 2, 3, 4}) {
    const int n = bits == 3 ? 11 : 32;
    std::vector<float> x(n);
    for (auto& v : x) v = nd(rng);
    std::vector<uint32_t> codes(n);
    uint16_t s16, m16;
    quantize_group(x.data(), n, 1, bits, codes.data(), s16, m16);
    const float s = half_to_float(s16), m = half_to_float(m16);
    const float qmax = static_cast<float>((1 << bits) - 1);
    for (int i = 0; i < n; ++i) {
      const float xhat = static_cast<float>(codes[i]) * s + m;
      const float tol = s / 2 + qmax * s * std::ldexp(1.0f, -11) + std::abs(m) * std::ldexp(1.0f, -11) + 1e-6f;
      if (bits == 3 && i == 10 && x[i] > m + 3.5f * s)
        CHECK(xhat == Approx(m + 3 * s));  // slot 10 saturates at code 3
      else
        CHECK(std::abs(x[i] - xhat) <= tol);
    }
  }
  std::vector<float> flat(32, 1.25f);
  std::vector<uint32_t> codes(32);
  uint16_t s16, m16;
  quantize_group(flat.data(), 32, 1, 2, codes.data(), s16, m16);
  CHECK(half_to_float(s16) == 0.0f);
  CHECK(half_to_float(m16) == 1.25f);
  CHECK(std::all_of(codes.begin(), codes.end(), [](uint32_t c) { return c == 0; }));
}

TEST_CASE("attention over quantized + dense segments equals attention over the reconstruction",
          "[segments]") {
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int d = 64, hq = 4, hkv = 2;
  for (auto [kb, vb, kg] : {std::tuple{2, 2, 32}, {3, 4, 11}, {4, 4, 32}, {1, 2, 32}}) {
    INFO("k" << kb << " v" << vb << " group " << kg);
    const int nq = kg * 3;
    LayerCache cache(hq, hkv, d), ref(hq, hkv, d);
    for (int h = 0; h < hkv; ++h) {
      std::vector<float> k(size_t(nq) * d), v(k.size());
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      std::vector<int32_t> pos(nq);
      std::iota(pos.begin(), pos.end(), 0);
      auto q = std::make_unique<QuantizedSegment>(d, kb, vb, kg, 32);
      q->append(k.data(), v.data(), nq, pos.data());
      std::vector<float> rk, rv;
      q->reconstruct(rk, rv);
      auto dense = std::make_unique<DenseSegment>(d);
      for (int t = 0; t < nq; ++t) dense->append(rk.data() + size_t(t) * d, rv.data() + size_t(t) * d, t);
      cache.segments(h).push_back(std::move(q));
      ref.segments(h).push_back(std::move(dense));
    }
    // A recent full-precision window after the quantized part, in both caches.
    for (int t = 0; t < 5; ++t) {
      std::vector<float> k(size_t(hkv) * d), v(k.size());
      for (auto& x : k) x = nd(rng);
      for (auto& x : v) x = nd(rng);
      cache.append(k.data(), v.data(), nq + t);
      ref.append(k.data(), v.data(), nq + t);
    }
    std::vector<float> q(size_t(hq) * d), a(q.size()), b(q.size()), c(q.size());
    for (auto& x : q) x = nd(rng);
    attend(cache, q.data(), a.data());
    attend(ref, q.data(), b.data());
    attend_ref(cache, q.data(), c.data());
    for (size_t i = 0; i < a.size(); ++i) {
      REQUIRE(a[i] == Approx(b[i]).margin(1e-4));
      REQUIRE(c[i] == Approx(b[i]).margin(1e-4));
    }
  }
}

TEST_CASE("quantized segment bytes: codes plus fp16 scale and minimum per group", "[segments]") {
  const int d = 64;
  std::vector<float> k(64 * d, 0.5f), v(64 * d, -0.5f);
  std::vector<int32_t> pos(64);
  std::iota(pos.begin(), pos.end(), 0);
  QuantizedSegment s(d, 2, 2, 32, 32);
  s.append(k.data(), v.data(), 64, pos.data());
  // Keys: 2 token groups x 64 channels x (2 words + 2 halves); values: 64 tokens x (4 words + 2 x 2 halves).
  CHECK(s.bytes() == 2 * 64 * (8 + 4) + 64 * (16 + 8));
  // 2-bit with groups of 32 costs 3.0 bits per element (spec/methods-a.md 3.2).
  CHECK(static_cast<double>(s.bytes()) * 8 / (64.0 * d * 2) == 3.0);
  test::require_error([&] { QuantizedSegment(d, 3, 3, 11, 32); }, {"3-bit values"});
  test::require_error([&] { s.append(k.data(), v.data(), 10, pos.data()); }, {"10 tokens", "32-token key groups"});
}
