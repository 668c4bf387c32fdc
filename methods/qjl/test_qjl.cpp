// QJL: the key cache against the authors' QJLKeyQuantizer on the same keys and projection
// (methods/qjl/reference.py), the sketch kvbench draws, the estimator's expectation, and the method as the
// registry builds it.
#include <cstring>
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>
#include <random>

#include "harness/method/method.hpp"
#include "harness/util/base64.hpp"
#include "kernels/cpu/fp16.hpp"
#include "methods/qjl/qjl_segment.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

// The registry-wide tests run heads of 16 channels: 2-bit value groups of 16 (a whole 32-bit word).
const bool test_params_registered =
    test::register_method_test_params("qjl", {{"group", "16"}, {"buffer", "32"}, {"outliers", "4"}});

std::vector<float> halves_from_base64(const std::string& text) {
  const auto bytes = base64_decode(text, "fp16");
  std::vector<float> out(bytes.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) {
    uint16_t h;
    std::memcpy(&h, bytes.data() + 2 * i, 2);
    out[i] = half_to_float(h);
  }
  return out;
}

}  // namespace

TEST_CASE("qjl: codes, outlier channels, norms and scores equal the authors' key cache", "[qjl]") {
  const auto ref = nlohmann::json::parse(std::ifstream(test::source_path("methods/qjl/fixtures/qjl_reference.json")));
  const int d = ref["head_dim"];
  const QjlLayout layout{.outliers = ref["outliers"], .group = ref["group"], .buffer = ref["buffer"], .value_bits = 2};
  const auto keys = halves_from_base64(ref["keys"]);
  for (const auto& c : ref["cases"]) {
    const int m = c["sketch"], mo = c["outlier_sketch"], n0 = c["prompt"], steps = c["steps"];
    INFO("sketch " << m << " outlier sketch " << mo);
    auto sketch = std::make_shared<QjlSketch>(d, m, mo, halves_from_base64(c["projection"]));
    QjlSegment seg(d, sketch, layout);
    std::vector<int32_t> pos(static_cast<size_t>(n0));
    std::iota(pos.begin(), pos.end(), 0);
    seg.append(keys.data(), keys.data(), n0, pos.data(), size_t(d));
    size_t check = 0;
    for (int step = 1; step <= steps; ++step) {
      const float* k = keys.data() + size_t(n0 + step - 1) * size_t(d);
      seg.append_token(k, k, n0 + step - 1);
      if (check == c["checks"].size() || c["checks"][check]["step"] != step) continue;
      const auto& ch = c["checks"][check++];
      const auto q = floats_from_base64(ch["query"].get<std::string>(), "query");
      const auto want = floats_from_base64(ch["scores"].get<std::string>(), "scores");
      REQUIRE(want.size() == seg.size());
      std::vector<float> got(seg.size());
      seg.logits(q.data(), got.data());
      // Float sums in another order than the reference's float64: within 2e-6 of |q| max |k|.
      const float qn = std::sqrt(std::inner_product(q.begin(), q.end(), q.begin(), 0.0f));
      float kmax = 0;
      for (size_t t = 0; t < seg.keys().size(); ++t) kmax = std::max(kmax, seg.keys().norm(t));
      double worst = 0;
      for (size_t t = 0; t < got.size(); ++t) worst = std::max(worst, double(std::abs(got[t] - want[t])));
      INFO("step " << step);
      CHECK(worst <= 2e-6 * qn * kmax);
    }
    CHECK(check == c["checks"].size());

    const auto& kq = seg.keys();
    REQUIRE(kq.size() == size_t(c["sketched"]));
    CHECK(seg.k_buffer() == size_t(n0 + steps) - kq.size());
    const auto codes = base64_decode(c["codes"].get<std::string>(), "codes"),
               outlier_codes = base64_decode(c["outlier_codes"].get<std::string>(), "outlier_codes"),
               channels = base64_decode(c["outlier_channels"].get<std::string>(), "outlier_channels");
    const auto norms = floats_from_base64(c["norms"].get<std::string>(), "norms"),
               outlier_norms = floats_from_base64(c["outlier_norms"].get<std::string>(), "outlier_norms");
    int wrong_channels = 0;
    for (size_t g = 0; g < kq.size() / size_t(layout.group); ++g)
      for (int i = 0; i < layout.outliers; ++i)
        wrong_channels += kq.outliers(g)[size_t(i)] != channels[g * size_t(layout.outliers) + size_t(i)];
    CHECK(wrong_channels == 0);
    // A code bit may differ only where the projection is zero to float rounding (kvbench sums in float, the
    // reference in float64): each such bit is checked against the projection computed here.
    int differ = 0, differ_far_from_zero = 0;
    for (size_t t = 0; t < kq.size(); ++t) {
      const auto outl = kq.outliers(t / size_t(layout.group));
      for (const bool outlier_part : {false, true}) {
        const auto got = outlier_part ? kq.outlier_codes(t) : kq.codes(t);
        const size_t bytes = got.size();
        for (size_t j = 0; j < bytes * 8; ++j) {
          const auto& want = outlier_part ? outlier_codes : codes;
          const bool a = (got[j / 8] >> (j % 8)) & 1, b = (want[t * bytes + j / 8] >> (j % 8)) & 1;
          if (a == b) continue;
          ++differ;
          double proj = 0, scale = 0;
          for (int ch = 0; ch < d; ++ch) {
            const bool is_out = std::find(outl.begin(), outl.end(), uint8_t(ch)) != outl.end();
            if (is_out != outlier_part) continue;
            const double term = double(sketch->s[size_t(ch) * size_t(m) + j]) * keys[t * size_t(d) + size_t(ch)];
            proj += term;
            scale += std::abs(term);
          }
          differ_far_from_zero += std::abs(proj) > 1e-5 * scale;
        }
      }
    }
    CHECK(differ_far_from_zero == 0);
    CHECK(differ <= 2);
    double worst_norm = 0;
    for (size_t t = 0; t < kq.size(); ++t) {
      worst_norm = std::max(worst_norm, double(std::abs(kq.norm(t) - norms[t])) / norms[t]);
      worst_norm = std::max(worst_norm, double(std::abs(kq.outlier_norm(t) - outlier_norms[t])) / outlier_norms[t]);
    }
    CHECK(worst_norm <= 1e-3);  // one fp16 rounding
  }
}

TEST_CASE("qjl: the drawn sketch is orthogonal per block and the estimate is unbiased", "[qjl]") {
  const int d = 16, m = 40;  // a last block narrower than the head
  const auto s = QjlSketch::random(d, m, 24, 3);
  for (int b0 = 0; b0 < m; b0 += d)
    for (int i = b0; i < std::min(m, b0 + d); ++i)
      for (int j = b0; j < std::min(m, b0 + d); ++j) {
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += double(s.s[size_t(c * m + i)]) * s.s[size_t(c * m + j)];
        CHECK(std::abs(dot - (i == j ? d : 0)) < 1e-4 * d);
      }
  CHECK(QjlSketch::random(d, m, 24, 3).s == s.s);
  CHECK(QjlSketch::random(d, m, 24, 4).s != s.s);

  // The estimator's constants: over independent Gaussian sketches (QJLSketch with rot=False) the mean
  // estimate is q . k, inliers and outliers alike; 400 draws, within 4 standard errors. (The rotated blocks
  // trade a bias of about 1/(4 d) relative, E|s.k| over a sphere against a Gaussian, for less variance.)
  const int group = 4, outliers = 2;
  std::vector<float> k(size_t(group * d)), q(static_cast<size_t>(d));
  for (int i = 0; i < group * d; ++i) k[size_t(i)] = std::sin(0.37f * float(i)) * (i % d == 3 ? 5.0f : 1.0f);
  for (int c = 0; c < d; ++c) q[size_t(c)] = std::cos(0.23f * float(c)) + 0.2f;
  std::vector<double> sum(group, 0), sq(group, 0);
  const int draws = 400;
  std::mt19937 rng(5);
  std::normal_distribution<float> normal;
  for (int r = 0; r < draws; ++r) {
    std::vector<float> g(size_t(d) * 64);
    for (auto& x : g) x = normal(rng);
    QjlKeys keys(std::make_shared<QjlSketch>(d, 64, 64, std::move(g)), outliers, group);
    keys.append(k.data(), group, size_t(d));
    std::vector<float> est(static_cast<size_t>(group));
    keys.logits(q.data(), 1, 0, keys.size(), est.data(), est.size());
    for (int t = 0; t < group; ++t) {
      sum[size_t(t)] += est[size_t(t)];
      sq[size_t(t)] += double(est[size_t(t)]) * est[size_t(t)];
    }
  }
  for (int t = 0; t < group; ++t) {
    const double exact = std::inner_product(q.begin(), q.end(), k.begin() + t * d, 0.0);
    const double mean = sum[size_t(t)] / draws, se = std::sqrt((sq[size_t(t)] / draws - mean * mean) / draws);
    INFO("token " << t << " exact " << exact << " mean " << mean << " se " << se);
    CHECK(std::abs(mean - exact) < 4 * se + 1e-3 * std::abs(exact));
  }
}

TEST_CASE("qjl: buffers, bytes and the registry's method", "[qjl]") {
  const int d = 32;
  auto sketch = std::make_shared<QjlSketch>(QjlSketch::random(d, 64, 32, 1));
  const QjlLayout layout{.outliers = 4, .group = 16, .buffer = 32, .value_bits = 2};
  QjlSegment seg(d, sketch, layout);
  std::vector<float> kv(size_t(64 * d));
  for (size_t i = 0; i < kv.size(); ++i) kv[i] = std::sin(0.1f * float(i));
  std::vector<int32_t> pos(64);
  std::iota(pos.begin(), pos.end(), 0);
  seg.append(kv.data(), kv.data(), 37, pos.data(), size_t(d));
  // 37 = 32 + 5: 32 keys sketched, 5 in the buffer; values: 5 quantized, the newest 32 kept.
  CHECK(seg.keys().size() == 32);
  CHECK(seg.k_buffer() == 5);
  CHECK(seg.v_buffer() == 32);
  for (int t = 37; t < 64; ++t) seg.append_token(kv.data() + size_t(t) * d, kv.data() + size_t(t) * d, t);
  // The buffer filled at the 64th token and was sketched before that step's attention; the values keep 33
  // until the next token arrives.
  CHECK(seg.keys().size() == 64);
  CHECK(seg.k_buffer() == 0);
  CHECK(seg.v_buffer() == 33);
  CHECK(seg.format() == "qjl(m64,o32,v2)");
  // Per key 64/8 + 32/8 code bytes and two fp16 norms, 4 channel bytes per group of 16; values 2-bit (8 bytes)
  // with an fp16 scale and minimum per 16 channels (8 bytes); the value buffer in fp32.
  CHECK(seg.bytes() == 64 * (8 + 4 + 4) + 4 * 4 + 31 * (8 + 8) + 33 * d * 4);

  ModelConfig mc;
  mc.n_layers = 4;
  mc.n_heads = 4;
  mc.n_kv_heads = 2;
  mc.head_dim = d;
  const auto method = MethodRegistry::get().create("qjl", {{"initial_layers", "2"}, {"buffer", "32"}}, mc);
  const int n = 70;
  std::vector<float> k(size_t(n) * 2 * d), v(k.size());
  for (size_t i = 0; i < k.size(); ++i) k[i] = std::cos(0.01f * float(i * i % 997)), v[i] = std::sin(0.3f * float(i));
  std::vector<int32_t> p(static_cast<size_t>(n));
  std::iota(p.begin(), p.end(), 0);
  for (const auto& [layer, format] : {std::pair{1, "qjl(m512,o128,v2)"}, std::pair{2, "qjl(m256,o256,v2)"}}) {
    PrefillView view{.layer = layer,
                     .n_tokens = n,
                     .n_heads = 4,
                     .n_kv_heads = 2,
                     .head_dim = d,
                     .positions = p.data(),
                     .k = k.data(),
                     .v = v.data()};
    const auto cache = method->compress(view, Budget{});
    REQUIRE(cache.segments(1).size() == 1);
    const auto& s = dynamic_cast<const QjlSegment&>(*cache.segments(1)[0]);
    CHECK(s.format() == format);
    CHECK(s.keys().size() == 64);
    CHECK(s.size() == size_t(n));
  }
  test::require_error([&] { MethodRegistry::get().create("qjl", {{"buffer", "100"}}, mc); }, {"buffer of 100", "32"});
  test::require_error([&] { MethodRegistry::get().create("qjl", {{"outliers", "32"}}, mc); }, {"32 outlier", "32"});
  test::require_error([&] { MethodRegistry::get().create("qjl", {{"sketch", "100"}}, mc); }, {"multiples of 8", "100"});
}

TEST_CASE("qjl: attention gives the same numbers however its heads are spread over threads", "[qjl]") {
  // The default model's 3 KV heads of 3 query heads: on 2 threads a head's logits are cut at key groups
  // (the buffer with the last run) and its values at value groups (Segment::token_cuts, channel_cuts).
  const int d = 64, hq = 9, hkv = 3, n = 700;
  const auto sketch = std::make_shared<QjlSketch>(QjlSketch::random(d, 256, 128, 7));
  for (auto dtype : {KvDtype::F16, KvDtype::F32}) {
    LayerCache cache(hq, hkv, d, dtype);
    std::vector<int32_t> pos(n);
    std::iota(pos.begin(), pos.end(), 0);
    for (int h = 0; h < hkv; ++h) {
      const auto k = test::randn(size_t(n) * d, 40 + h), v = test::randn(size_t(n) * d, 50 + h);
      auto seg = std::make_unique<QjlSegment>(d, sketch, QjlLayout{}, dtype);
      seg->append(k.data(), v.data(), n, pos.data(), size_t(d));
      cache.segments(h).push_back(std::move(seg));
    }
    const auto q = test::randn(size_t(hq) * d, 60, 2.0f);
    INFO(kv_dtype_name(dtype));
    const auto ref = test::attend_across_threads(cache, q, {2, 4, 5});
    std::vector<float> out(q.size());
    attend_ref(cache, q.data(), out.data());
    CHECK(test::max_abs_diff(ref, out) < 1e-4f);
  }
}
