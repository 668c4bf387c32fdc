// Segment formats against their dense reconstructions, and KVmix's packing rules.
#include <algorithm>
#include <numeric>
#include <random>

#include "harness/cache/layer_cache.hpp"
#include "harness/cache/lowrank_segment.hpp"
#include "harness/cache/quantized_segment.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/kv_quant.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "methods/vector/approx_value_segment.hpp"
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

TEST_CASE("group quantization error bounds, constant groups", "[segments]") {
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

TEST_CASE("attention over quantized + dense segments equals attention over the reconstruction", "[segments]") {
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

TEST_CASE("attention passes a NaN key on as NaN, not as a zero head", "[segments]") {
  const int d = 16, hq = 4, hkv = 2;
  LayerCache cache(hq, hkv, d);
  std::vector<float> k(size_t(hkv) * d, 0.5f), v(k.size(), 1.0f);
  for (int t = 0; t < 3; ++t) cache.append(k.data(), v.data(), t);
  k[3] = std::nanf("");  // head 0's next key
  cache.append(k.data(), v.data(), 3);
  std::vector<float> q(size_t(hq) * d, 0.1f), out(q.size());
  attend(cache, q.data(), out.data());
  for (int c = 0; c < 2 * d; ++c) CHECK(std::isnan(out[size_t(c)]));  // the query heads reading head 0
  for (size_t c = 2 * d; c < out.size(); ++c) CHECK(out[c] == Approx(1.0f));
}

TEST_CASE("fused quantized products equal their dequantize-then-dot references", "[segments]") {
  std::mt19937 rng(9);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  const int level = GENERATE(2, 1, 0);  // as far as the processor goes: AVX-512, AVX2, portable
  cap_kernels_at_avx2(level == 1);      // first: it resets a forced portable level
  force_portable_kernels(level == 0);
  INFO("vector path: " << cpu_kernel_path());
  if (level == 0) REQUIRE(cpu_kernel_path().starts_with("portable,"));
  // Key bits x token groups, value bits x channel groups, head dims including one not a multiple of 32.
  for (auto [bits, kg, vg] :
       {std::tuple{1, 32, 32}, {2, 32, 32}, {2, 16, 16}, {2, 64, 32}, {3, 11, 32}, {3, 22, 32}, {4, 32, 32}, {4, 8, 8}})
    for (int d : {64, 128, 40}) {
      if (d % vg != 0) continue;
      const int vbits = bits == 3 ? 4 : bits, n = kg * 5;
      INFO("bits " << bits << " key group " << kg << " value group " << vg << " d " << d);
      std::vector<float> k(static_cast<size_t>(n * d)), v(k.size()), q(static_cast<size_t>(d)),
          p(static_cast<size_t>(n));
      for (auto* x : {&k, &v, &q, &p})
        for (auto& e : *x) e = nd(rng);
      for (int t = 0; t < n; t += 7) p[size_t(t)] = 0.0f;
      QuantizedKeys qk(d, bits, kg);
      QuantizedValues qv(d, vbits, vg);
      qk.append(k.data(), n, size_t(d));
      qv.append(v.data(), n, size_t(d));
      const QuantKeysView kv = qk.view();
      const QuantValuesView vv = qv.view();
      std::vector<float> fast(static_cast<size_t>(n)), ref(fast);
      quant_keys_dot(kv, q.data(), fast.data());
      quant_keys_dot_ref(kv, q.data(), ref.data());
      for (int t = 0; t < n; ++t) REQUIRE(fast[size_t(t)] == Approx(ref[size_t(t)]).epsilon(1e-4).margin(1e-3));
      std::vector<float> af(static_cast<size_t>(d), 0.25f), ar(af);
      quant_values_axpy(vv, p.data(), af.data());
      quant_values_axpy_ref(vv, p.data(), ar.data());
      for (int c = 0; c < d; ++c) REQUIRE(af[size_t(c)] == Approx(ar[size_t(c)]).epsilon(1e-4).margin(1e-3));
      // A GQA group's queries at once: each query's numbers are those it gets alone, bit for bit.
      for (int g : {2, 3, 4, 5, 8}) {
        INFO("group " << g);
        std::vector<float> qg(size_t(g) * d), pg(size_t(g) * n);
        for (auto* x : {&qg, &pg})
          for (auto& e : *x) e = nd(rng);
        for (size_t i = 0; i < pg.size(); i += 4) pg[i] = 0.0f;
        std::vector<float> sg(size_t(g) * n), s1(static_cast<size_t>(n)), ag(size_t(g) * d, 0.5f), a1(ag);
        quant_keys_dot(kv, qg.data(), sg.data(), g);
        quant_values_axpy(vv, pg.data(), ag.data(), g);
        for (int j = 0; j < g; ++j) {
          quant_keys_dot(kv, qg.data() + size_t(j) * d, s1.data());
          for (int t = 0; t < n; ++t) REQUIRE(sg[size_t(j) * n + t] == s1[size_t(t)]);
          quant_values_axpy(vv, pg.data() + size_t(j) * n, a1.data() + size_t(j) * d);
        }
        REQUIRE(ag == a1);
      }
    }
  force_portable_kernels(false);
  cap_kernels_at_avx2(false);
}

TEST_CASE("AVX-512 quantized products equal the AVX2 ones bit for bit", "[segments]") {
  if (!cpu_has_avx512()) {
    WARN("skipped: this processor has no AVX-512 (or KVBENCH_KERNELS holds it back)");
    return;
  }
  std::mt19937 rng(10);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  // Token and channel groups the 16-lane kernels take, and ones they leave to AVX2 (4-bit groups of 8).
  for (auto [bits, kg, vg] : {std::tuple{1, 32, 32},
                              {2, 32, 32},
                              {2, 16, 16},
                              {2, 64, 64},
                              {2, 32, 48},
                              {3, 11, 32},
                              {3, 33, 16},
                              {4, 32, 32},
                              {4, 16, 16},
                              {4, 8, 8}})
    for (int d : {64, 128, 48, 80, 96}) {
      if (d % vg != 0) continue;
      const int vbits = bits == 3 ? 2 : bits, n = kg * 7;
      INFO("bits " << bits << " key group " << kg << " value group " << vg << " d " << d);
      std::vector<float> k(static_cast<size_t>(n * d)), v(k.size());
      for (auto* x : {&k, &v})
        for (auto& e : *x) e = nd(rng);
      QuantizedKeys qk(d, bits, kg);
      QuantizedValues qv(d, vbits, vg);
      qk.append(k.data(), n, size_t(d));
      qv.append(v.data(), n, size_t(d));
      const QuantKeysView kv = qk.view();
      const QuantValuesView vv = qv.view();
      for (int g : {1, 2, 3, 4, 7}) {
        INFO("group " << g);
        std::vector<float> q(size_t(g) * d), p(size_t(g) * n);
        for (auto* x : {&q, &p})
          for (auto& e : *x) e = nd(rng);
        for (size_t i = 0; i < p.size(); i += 5) p[i] = 0.0f;
        std::vector<float> s512(size_t(g) * n), s2(s512), a512(size_t(g) * d, 0.5f), a2(a512);
        quant_keys_dot(kv, q.data(), s512.data(), g);
        quant_values_axpy(vv, p.data(), a512.data(), g);
        cap_kernels_at_avx2(true);
        quant_keys_dot(kv, q.data(), s2.data(), g);
        quant_values_axpy(vv, p.data(), a2.data(), g);
        cap_kernels_at_avx2(false);
        REQUIRE(s512 == s2);
        REQUIRE(a512 == a2);
      }
    }
}

TEST_CASE("a quantized key group's scores are the same read alone or among many", "[segments]") {
  // The vector kernels fold the queries into eight token groups at a time where they can; one group
  // read alone is folded by itself.
  std::mt19937 rng(12);
  std::normal_distribution<float> nd(0.0f, 1.5f);
  const int level = GENERATE(2, 1);  // as far as the processor goes: AVX-512, AVX2
  cap_kernels_at_avx2(level == 1);
  INFO("vector path: " << cpu_kernel_path());
  for (auto [bits, kg] : {std::tuple{2, 32}, {1, 32}, {4, 16}, {3, 11}, {3, 22}})
    for (int d : {64, 128, 40}) {
      const int groups = 19, n = kg * groups, g = 3;
      INFO("bits " << bits << " key group " << kg << " d " << d);
      std::vector<float> k(static_cast<size_t>(n * d)), q(size_t(g) * d);
      for (auto* x : {&k, &q})
        for (auto& e : *x) e = nd(rng);
      QuantizedKeys qk(d, bits, kg);
      qk.append(k.data(), n, size_t(d));
      const QuantKeysView all = qk.view();
      std::vector<float> s(size_t(g) * n), one(size_t(g) * kg);
      quant_keys_dot(all, q.data(), s.data(), g);
      const size_t words = (all.bits == 3 ? size_t(kg / 11) : size_t(kg * bits / 32)) * size_t(d);
      for (int i = 0; i < groups; ++i) {
        QuantKeysView alone = all;
        alone.words += size_t(i) * words;
        alone.scale += size_t(i) * d;
        alone.min += size_t(i) * d;
        alone.tokens = size_t(kg);
        quant_keys_dot(alone, q.data(), one.data(), g);
        for (int j = 0; j < g; ++j)
          for (int t = 0; t < kg; ++t) REQUIRE(one[size_t(j) * kg + t] == s[size_t(j) * n + size_t(i) * kg + t]);
      }
    }
  cap_kernels_at_avx2(false);
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
  // 2-bit with groups of 32 costs 3.0 bits per element (methods/kvmix/README.md §7).
  CHECK(static_cast<double>(s.bytes()) * 8 / (64.0 * d * 2) == 3.0);
  test::require_error([&] { QuantizedSegment(d, 3, 3, 11, 32); }, {"3-bit values"});
  test::require_error([&] { s.append(k.data(), v.data(), 10, pos.data()); }, {"10 tokens", "32-token groups"});
}

TEST_CASE("low-rank segments: PCA basis, nesting, pre-RoPE keys, attention equals reconstruction", "[segments]") {
  std::mt19937 rng(4);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int d = 32, n = 200, r = 6;
  // Data of exact rank r: its rank-r PCA reconstruction is exact.
  std::vector<float> a(size_t(n) * r), bk(size_t(r) * d), bv(size_t(r) * d), k(size_t(n) * d, 0), v(k.size(), 0);
  for (auto* x : {&a, &bk, &bv})
    for (auto& e : *x) e = nd(rng);
  for (int t = 0; t < n; ++t)
    for (int j = 0; j < r; ++j)
      for (int i = 0; i < d; ++i) {
        k[size_t(t) * d + i] += a[size_t(t) * r + j] * bk[size_t(j) * d + i];
        v[size_t(t) * d + i] += a[size_t(t) * r + j] * bv[size_t(j) * d + i];
      }
  auto basis = std::make_shared<LowRankBasis>(pca_basis(k.data(), v.data(), n, d, 8));
  for (int i = 0; i < 8; ++i)
    for (int j = 0; j < 8; ++j) {
      double dot = 0;
      for (int c = 0; c < d; ++c) dot += double(basis->k[size_t(c) * 8 + i]) * basis->k[size_t(c) * 8 + j];
      REQUIRE(dot == Approx(i == j ? 1.0 : 0.0).margin(1e-5));
    }
  LowRankSegment full(basis, r, r, true);
  for (int t = 0; t < n; ++t) full.append(k.data() + size_t(t) * d, v.data() + size_t(t) * d, t);
  std::vector<float> rk, rv;
  full.reconstruct(rk, rv);
  for (size_t i = 0; i < rk.size(); ++i) {
    REQUIRE(rk[i] == Approx(k[i]).margin(1e-3));
    REQUIRE(rv[i] == Approx(v[i]).margin(1e-3));
  }
  // Nested: a rank-2 segment shares the basis and pays only for its coefficients.
  LowRankSegment small(basis, 2, 3, false);
  small.append(k.data(), v.data(), 0);
  CHECK(small.bytes() == (2 + 3) * sizeof(float));
  CHECK(full.bytes() == size_t(n) * (r + r) * sizeof(float) + basis->bytes());

  // Attention over [low-rank post-RoPE | low-rank pre-RoPE | dense] equals the reconstruction's.
  std::vector<float> inv(d / 2);
  for (int i = 0; i < d / 2; ++i) inv[i] = 1.0f / std::pow(10000.0f, static_cast<float>(2 * i) / static_cast<float>(d));
  auto rope = std::make_shared<RopeTable>(inv, RopeStyle::NeoX);
  rope->ensure(4096);
  const int hq = 2, hkv = 1;
  LayerCache cache(hq, hkv, d), ref(hq, hkv, d);
  auto post = std::make_unique<LowRankSegment>(basis, 4, 5, true);
  auto pre = std::make_unique<LowRankSegment>(basis, 8, 8, false, rope);
  for (int t = 0; t < 50; ++t) post->append(k.data() + size_t(t) * d, v.data() + size_t(t) * d, t);
  for (int t = 50; t < 120; ++t) pre->append(k.data() + size_t(t) * d, v.data() + size_t(t) * d, t);
  auto dense = std::make_unique<DenseSegment>(d);
  for (auto* s : {post.get(), pre.get()}) {
    std::vector<float> sk, sv;
    s->reconstruct(sk, sv);
    for (size_t t = 0; t < s->size(); ++t) dense->append(sk.data() + t * d, sv.data() + t * d, s->positions()[t]);
  }
  // Pre-RoPE keys at full basis rank (8 >= data rank 6) come back rotated at their positions.
  std::vector<float> pk, pv;
  pre->reconstruct(pk, pv);
  std::vector<float> rot(k.begin() + 50 * d, k.begin() + 51 * d);
  int32_t p50 = 50;
  rope->apply(rot.data(), 1, 1, d, &p50);
  for (int c = 0; c < d; ++c) CHECK(pk[c] == Approx(rot[c]).margin(1e-3));
  cache.segments(0).push_back(std::move(post));
  cache.segments(0).push_back(std::move(pre));
  ref.segments(0).push_back(std::move(dense));
  std::vector<float> q(size_t(hq) * d), o1(q.size()), o2(q.size());
  for (auto& x : q) x = nd(rng) * 0.2f;
  attend(cache, q.data(), o1.data());
  attend(ref, q.data(), o2.data());
  for (size_t i = 0; i < o1.size(); ++i) REQUIRE(o1[i] == Approx(o2[i]).margin(1e-4));
}

namespace {
// A non-affine estimator, to exercise the generic per-token path.
class SquareEstimator final : public ValueEstimator {
 public:
  explicit SquareEstimator(int d) : d_(d) {}
  std::string name() const override { return "square"; }
  void predict(const float* k, float* v) const override {
    for (int i = 0; i < d_; ++i) v[i] = k[i] * k[i] - 0.5f;
  }
  size_t bytes() const override { return 0; }

 private:
  int d_;
};
}  // namespace

TEST_CASE("approximated-value segments: affine fold and generic estimator equal the reconstruction", "[segments]") {
  std::mt19937 rng(6);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int d = 16;
  std::vector<float> inv(d / 2);
  for (int i = 0; i < d / 2; ++i) inv[i] = 1.0f / std::pow(500.0f, static_cast<float>(2 * i) / static_cast<float>(d));
  auto rope = std::make_shared<RopeTable>(inv, RopeStyle::Interleaved);
  rope->ensure(1000);
  std::vector<float> w(size_t(d) * d), c(d);
  for (auto& x : w) x = nd(rng) * 0.3f;
  for (auto& x : c) x = nd(rng);
  std::vector<std::shared_ptr<const ValueEstimator>> ests = {std::make_shared<AffineValueEstimator>(d, w, c),
                                                             std::make_shared<SquareEstimator>(d)};
  {
    // W x_j as each row's plain dot product sums it, in order, for two vectors at once.
    std::vector<float> x(2 * d), y(2 * d);
    for (auto& e : x) e = nd(rng);
    AffineValueEstimator(d, w, c).multiply(x.data(), 2, y.data());
    for (int v = 0; v < 2; ++v)
      for (int i = 0; i < d; ++i) {
        float s = 0;
        for (int j = 0; j < d; ++j) s += w[size_t(i) * d + j] * x[size_t(v) * d + j];
        CHECK(y[size_t(v) * d + i] == s);
      }
  }
  for (const auto& est : ests) {
    INFO(est->name());
    auto seg = std::make_unique<ApproxValueSegment>(d, est, rope, true);
    std::vector<float> pre(d);
    for (int t = 0; t < 40; ++t) {
      for (auto& x : pre) x = nd(rng);
      const int32_t pos = 100 + 3 * t;
      std::vector<float> post = pre;
      rope->apply(post.data(), 1, 1, d, &pos);
      seg->append(post.data(), pos);
      if (t == 0) {
        // The estimator sees the pre-RoPE key: inverse rotation recovers it.
        std::vector<float> rk, rv, want(d);
        seg->reconstruct(rk, rv);
        est->predict(pre.data(), want.data());
        for (int i = 0; i < d; ++i) CHECK(rv[i] == Approx(want[i]).margin(1e-4));
      }
    }
    CHECK(seg->bytes() == 40 * d * sizeof(float) + est->bytes());
    // A GQA group at once (each key rotated back once for all): each query's numbers are those it gets
    // alone, bit for bit, tokens of weight 0 included.
    const int g = 3;
    std::vector<float> qg(size_t(g) * d), pg(size_t(g) * 40), sg(pg.size()), ag(size_t(g) * d, 0.25f), s1(40), a1(ag);
    for (auto* x : {&qg, &pg})
      for (auto& e : *x) e = nd(rng);
    for (size_t i = 0; i < pg.size(); i += 3) pg[i] = 0.0f;
    seg->logits_group(qg.data(), g, d, sg.data());
    seg->accumulate_group(pg.data(), g, d, ag.data());
    for (int j = 0; j < g; ++j) {
      seg->logits(qg.data() + size_t(j) * d, s1.data());
      CHECK(std::equal(s1.begin(), s1.end(), sg.begin() + j * 40));
      seg->accumulate(pg.data() + size_t(j) * 40, a1.data() + size_t(j) * d);
    }
    CHECK(ag == a1);
    std::vector<float> rk, rv;
    seg->reconstruct(rk, rv);
    auto dense = std::make_unique<DenseSegment>(d);
    for (int t = 0; t < 40; ++t)
      dense->append(rk.data() + size_t(t) * d, rv.data() + size_t(t) * d, seg->positions()[t]);
    LayerCache cache(2, 1, d), ref(2, 1, d);
    cache.segments(0).push_back(std::move(seg));
    ref.segments(0).push_back(std::move(dense));
    std::vector<float> q(2 * d), o1(q.size()), o2(q.size());
    for (auto& x : q) x = nd(rng) * 0.3f;
    attend(cache, q.data(), o1.data());
    attend(ref, q.data(), o2.data());
    for (size_t i = 0; i < o1.size(); ++i) REQUIRE(o1[i] == Approx(o2[i]).margin(1e-4));
  }
}
