// KIVI: its residual rule and quantizer against KIVI's own code on the same keys and values
// (methods/kivi/reference.py: quant/new_pack.py and the cache logic of models/llama_kivi.py), and the
// method as the registry builds it.
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/method/method.hpp"
#include "harness/util/base64.hpp"
#include "kernels/cpu/fp16.hpp"
#include "methods/kvmix/kvmix_segment.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"

using namespace kvb;

// The registry-driven tests' layers have head_dim 16.
const bool test_params_registered = test::register_method_test_params("kivi", {{"group", "16"}, {"residual", "32"}});

TEST_CASE("kivi: codes, scales and full-precision buffers equal KIVI's after prefill and decode", "[kivi]") {
  const auto ref = nlohmann::json::parse(std::ifstream(test::source_path("methods/kivi/fixtures/kivi_reference.json")));
  const int d = ref["head_dim"], group = ref["group"];
  const auto k = floats_from_base64(ref["k"].get<std::string>(), "k"),
             v = floats_from_base64(ref["v"].get<std::string>(), "v");
  for (const auto& c : ref["cases"]) {
    const int bits = c["bits"], R = c["residual"], n = c["prefill"], steps = c["steps"];
    INFO("bits " << bits << " residual " << R << " prefill " << n << " steps " << steps);
    KvmixLayout L;
    L.k_bits = L.v_bits = bits;
    L.k_group = L.v_group = group;
    L.residual = R;
    KvmixSegment seg(d, L);
    std::vector<int32_t> pos(size_t(n + steps));
    std::iota(pos.begin(), pos.end(), 0);
    seg.append(k.data(), v.data(), n, pos.data(), size_t(d));
    for (int t = n; t < n + steps; ++t) seg.append_token(k.data() + size_t(t) * d, v.data() + size_t(t) * d, t);
    seg.settle();  // the last step's quantization, which KIVI does after that step's attention
    CHECK(seg.format() == fmt::format("kivi(k{},v{},r{})", bits, bits, R));
    CHECK(seg.k_buffer() == c["k_full"].get<size_t>());
    CHECK(seg.v_buffer() == c["v_full"].get<size_t>());
    std::vector<float> kr, vr;
    seg.reconstruct(kr, vr);
    // KIVI's codes times its scale plus its minimum, the scale and minimum kept as fp16 (KIVI's runs keep
    // them in the model's fp16); equal only if every code is KIVI's.
    const auto kc = base64_decode(c["k_codes"].get<std::string>(), "k_codes");
    const auto vc = base64_decode(c["v_codes"].get<std::string>(), "v_codes");
    const auto ks = floats_from_base64(c["k_scale"].get<std::string>(), "k_scale");
    const auto km = floats_from_base64(c["k_min"].get<std::string>(), "k_min");
    const auto vs = floats_from_base64(c["v_scale"].get<std::string>(), "v_scale");
    const auto vm = floats_from_base64(c["v_min"].get<std::string>(), "v_min");
    const size_t kq = kc.size() / size_t(d), vq = vc.size() / size_t(d);
    REQUIRE(kq + seg.k_buffer() == size_t(n + steps));
    REQUIRE(vq + seg.v_buffer() == size_t(n + steps));
    const auto h = [](float x) { return half_to_float(float_to_half(x)); };
    int k_wrong = 0, v_wrong = 0;
    for (size_t t = 0; t < size_t(n + steps); ++t)
      for (int i = 0; i < d; ++i) {
        const size_t at = t * size_t(d) + size_t(i);
        const float want_k = t < kq ? float(kc[at]) * h(ks[t / size_t(group) * size_t(d) + size_t(i)]) +
                                          h(km[t / size_t(group) * size_t(d) + size_t(i)])
                                    : k[at];
        const size_t vg = t * size_t(d / group) + size_t(i / group);
        const float want_v = t < vq ? float(vc[at]) * h(vs[vg]) + h(vm[vg]) : v[at];
        k_wrong += kr[at] != want_k;
        v_wrong += vr[at] != want_v;
      }
    CHECK(k_wrong == 0);
    CHECK(v_wrong == 0);
  }
}

TEST_CASE("kivi: the registry's method stores KIVI's cache, and a residual off the group is an error", "[kivi]") {
  test::SyntheticLayer layer(150, 4, 2, 32, 32, 11);
  auto m = MethodRegistry::get().create("kivi", {}, layer.cfg);
  CHECK_FALSE(m->budgeted());
  MethodRunner runner(*m, KvBudget{});
  LayerCache cache(4, 2, 32);
  runner.on_layer(layer.view, cache);
  for (int s = 0; s < cache.n_cache_heads(); ++s) {
    REQUIRE(cache.segments(s).size() == 1);
    const auto& seg = dynamic_cast<const KvmixSegment&>(*cache.segments(s)[0]);
    CHECK(seg.format() == "kivi(k2,v2,r64)");
    CHECK(seg.k_buffer() == 150 % 64);  // keys in whole blocks of 64
    CHECK(seg.v_buffer() == 64);        // the 64 most recent values
    // 2-bit codes and an fp16 scale and minimum per group of 32, the buffers at fp32.
    const size_t kq = 128, vq = 86;
    CHECK(seg.bytes() ==
          kq * 32 * 2 / 8 + kq / 32 * 32 * 4 + vq * 32 * 2 / 8 + vq * 4 + (150 - kq + 150 - vq) * 32 * 4);
  }
  test::require_error(
      [&] {
        MethodRegistry::get().create("kivi", {{"residual", "48"}}, layer.cfg);
      },
      {"residual length 48", "multiple of the key group 32"});
  test::require_error([&] { MethodRegistry::get().create("kivi", {{"bits", "3"}}, layer.cfg); }, {"bits", "3"});
  // The error names the method the user asked for, not the store it is built on.
  test::require_error(
      [&] {
        MethodRegistry::get().create("kivi", {{"group", "7"}, {"residual", "14"}}, layer.cfg);
      },
      {"method kivi: group=7 does not divide the head dimension 32"});
}
