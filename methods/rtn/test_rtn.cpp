// RTN: codes and read-back values against KIVI's SymQuantizer on the same keys and values
// (methods/rtn/reference.py), the fused attention paths against the read-back ones, and the method as the
// registry builds it.
#include <fstream>
#include <nlohmann/json.hpp>
#include <numeric>

#include "harness/method/method.hpp"
#include "harness/util/base64.hpp"
#include "methods/rtn/rtn_segment.hpp"
#include "test_util.hpp"

using namespace kvb;

TEST_CASE("rtn: codes equal KIVI's SymQuantizer, read-back within its fp16 step", "[rtn]") {
  const auto ref = nlohmann::json::parse(std::ifstream(test::source_path("methods/rtn/fixtures/rtn_reference.json")));
  const int d = ref["head_dim"], T = ref["tokens"];
  const auto k = floats_from_base64(ref["k"].get<std::string>(), "k"),
             v = floats_from_base64(ref["v"].get<std::string>(), "v");
  for (const auto& c : ref["cases"]) {
    const int bits = c["bits"], group = c["group"];
    INFO("bits " << bits << " group " << group);
    RtnSegment seg(d, bits, group);
    for (int t = 0; t < T; ++t) seg.append_token(k.data() + size_t(t) * d, v.data() + size_t(t) * d, t);
    CHECK(seg.format() == fmt::format("rtn(k{},v{},g{})", bits, bits, group));
    // Packed codes and one fp16 step per group, keys and values: a 2-bit head of 64 channels is 18 bytes each.
    CHECK(seg.bytes() == size_t(2 * T) * (size_t(d * bits / 8) + 2 * size_t(d / group)));
    std::vector<float> kr, vr;
    seg.reconstruct(kr, vr);
    for (const auto& [name, got, back] :
         {std::tuple{"k", seg.codes(true), &kr}, std::tuple{"v", seg.codes(false), &vr}}) {
      const auto want = base64_decode(c[std::string(name) + "_codes"].get<std::string>(), "codes");
      const auto deq = floats_from_base64(c[std::string(name) + "_dequant"].get<std::string>(), "dequant");
      REQUIRE(want.size() == got.size());
      int wrong = 0;
      double worst = 0;
      for (size_t i = 0; i < got.size(); ++i) {
        wrong += got[i] != int(int8_t(want[i]));
        worst = std::max(worst, double(std::abs((*back)[i] - deq[i])) / (std::abs(deq[i]) + 1e-6));
      }
      INFO(name);
      CHECK(wrong == 0);
      CHECK(worst < 1e-3);  // the step kept as fp16 (2^-11 relative)
    }
    // The fused paths read what reconstruct reads.
    std::vector<float> q(static_cast<size_t>(d)), p(static_cast<size_t>(T)), scores(static_cast<size_t>(T)),
        acc(static_cast<size_t>(d), 0.0f);
    for (int i = 0; i < d; ++i) q[size_t(i)] = std::sin(0.3f * float(i));
    for (int t = 0; t < T; ++t) p[size_t(t)] = 1.0f / float(T);
    seg.logits(q.data(), scores.data());
    seg.accumulate(p.data(), acc.data());
    for (int t = 0; t < T; ++t) {
      const float want = std::inner_product(q.begin(), q.end(), kr.begin() + std::ptrdiff_t(t) * d, 0.0f);
      CHECK(std::abs(scores[size_t(t)] - want) <= 1e-4f * (1 + std::abs(want)));
    }
    for (int i = 0; i < d; ++i) {
      float want = 0;
      for (int t = 0; t < T; ++t) want += p[size_t(t)] * vr[size_t(t) * d + size_t(i)];
      CHECK(std::abs(acc[size_t(i)] - want) <= 1e-5f * (1 + std::abs(want)));
    }
  }
}

TEST_CASE("rtn: the registry's method, and what it cannot store", "[rtn]") {
  ModelConfig m;
  m.n_layers = 2;
  m.n_heads = 4;
  m.n_kv_heads = 2;
  m.head_dim = 16;
  const auto method = MethodRegistry::get().create("rtn", {{"bits", "2"}}, m);
  CHECK(method->params().get("group") == "0");
  test::require_error([&] { MethodRegistry::get().create("rtn", {{"group", "6"}}, m); }, {"rtn", "6", "head_dim 16"});
  test::require_error([&] { MethodRegistry::get().create("rtn", {{"bits", "3"}}, m); }, {"bits", "3"});
}

TEST_CASE("rtn: attention gives the same numbers however its heads are spread over threads", "[rtn]") {
  // The default model's 3 KV heads of 3 query heads: on 2 threads a head's logits are cut into runs of
  // tokens and its values into runs of 16 channels (Segment::token_cuts, channel_cuts).
  const int d = 64, hq = 9, hkv = 3, n = 700;
  for (auto [bits, group] : {std::pair{2, 64}, std::pair{4, 16}, std::pair{8, 32}}) {
    LayerCache cache(hq, hkv, d);
    for (int h = 0; h < hkv; ++h) {
      const auto k = test::randn(size_t(n) * d, 40 + h), v = test::randn(size_t(n) * d, 50 + h);
      auto seg = std::make_unique<RtnSegment>(d, bits, group);
      for (int t = 0; t < n; ++t) seg->append_token(k.data() + size_t(t) * d, v.data() + size_t(t) * d, t);
      cache.segments(h).push_back(std::move(seg));
    }
    const auto q = test::randn(size_t(hq) * d, 60, 2.0f);
    INFO(bits << " bits, group " << group);
    const auto ref = test::attend_across_threads(cache, q, {2, 4, 5});
    std::vector<float> out(q.size());
    attend_ref(cache, q.data(), out.data());
    CHECK(test::max_abs_diff(ref, out) < 1e-4f);
  }
}
