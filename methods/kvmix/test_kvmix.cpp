// KVmix (README.md §8): the recent-pivotal-context rule against the simulated buffer sequences of
// README.md §4, independent key/value boundaries through decoding, attention over the mixed store
// against its reconstruction, nominal bits of the layer map, the full-precision limit, the profile end
// to end, and bad input. Packing, group error bounds and the fused quantized products are tested with
// the quantized segment (test_segments.cpp).

#include <filesystem>
#include <fstream>
#include <random>

#include "harness/engine/engine.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "kernels/cpu/kv_rows.hpp"
#include "methods/kvmix/kvmix_segment.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"

using namespace kvb;

// The registry tests run KVmix without a profile (all layers low) on 16-dimensional synthetic heads.
const bool test_params_registered = test::register_method_test_params("kvmix", {{"layers", "low"}, {"group", "16"}});

using test::randn;

TEST_CASE("KVmix recent context: the spec's simulated buffer sizes and cycles", "[kvmix]") {
  struct Case {
    double r;
    int group;
    std::vector<size_t> first;
    size_t lo, hi;
  };
  for (const Case& c : {Case{0.2, 32, {800, 161, 34}, 7, 38}, Case{0.1, 32, {416, 65, 34}, 3, 34},
                        Case{0.2, 11, {810, 162, 42}, 2, 12}, Case{0.3, 32, {}, 13, 44}, Case{0.0, 32, {}, 0, 31}}) {
    INFO("r " << c.r << " group " << c.group);
    const auto f = kvmix_buffer_sizes(4000, 400, c.r, c.group);
    // After the prefill: N - floor((N - floor(r N)) / G) G.
    const size_t n = 4000, keep = static_cast<size_t>(std::floor(c.r * n));
    CHECK(f[0] == n - (n - keep) / c.group * c.group);
    for (size_t i = 0; i < c.first.size(); ++i) CHECK(f[i] == c.first[i]);
    size_t lo = SIZE_MAX, hi = 0;
    for (size_t i = 100; i < f.size(); ++i) {
      lo = std::min(lo, f[i]);
      hi = std::max(hi, f[i]);
    }
    CHECK(lo == c.lo);
    CHECK(hi == c.hi);
  }
}

TEST_CASE("KVmix segment: keys and values leave their buffers apart, attention equals its reconstruction", "[kvmix]") {
  const int d = 64, N = 700, steps = 90;
  KvmixLayout L;
  L.k_bits = 3;
  L.k_group = 11;
  L.v_bits = 4;
  L.k_rpc = 0.2;
  L.v_rpc = 0.1;
  KvmixSegment seg(d, L);
  const auto k = randn(size_t(N + steps) * d, 1), v = randn(size_t(N + steps) * d, 2);
  std::vector<int32_t> pos(N + steps);
  std::iota(pos.begin(), pos.end(), 0);
  seg.append(k.data(), v.data(), N, pos.data(), size_t(d));
  const auto kf = kvmix_buffer_sizes(N, steps, L.k_rpc, L.k_group), vf = kvmix_buffer_sizes(N, steps, L.v_rpc, 32);
  CHECK(seg.k_buffer() == kf[0]);
  CHECK(seg.v_buffer() == vf[0]);
  CHECK(seg.k_buffer() != seg.v_buffer());
  // Decoded tokens go through the engine's path: LayerCache::append into the segment.
  LayerCache cache(2, 1, d);
  cache.segments(0).push_back(std::make_unique<KvmixSegment>(seg));
  for (int s = 1; s <= steps; ++s) {
    cache.append(k.data() + size_t(N + s - 1) * d, v.data() + size_t(N + s - 1) * d, N + s - 1);
    const auto& kv = static_cast<const KvmixSegment&>(*cache.segments(0).front());
    REQUIRE(cache.segments(0).size() == 1);  // no dense tail: the store takes the tokens
    CHECK(kv.size() == size_t(N + s));
    CHECK(kv.k_buffer() == kf[size_t(s)]);
    CHECK(kv.v_buffer() == vf[size_t(s)]);
  }
  const auto& kv = static_cast<const KvmixSegment&>(*cache.segments(0).front());
  std::vector<float> rk, rv;
  kv.reconstruct(rk, rv);
  // The buffers hold the exact rows; the quantized part is within its group's step.
  for (size_t t = kv.size() - kv.k_buffer(); t < kv.size(); ++t)
    for (int c = 0; c < d; ++c) CHECK(rk[t * d + c] == k[t * d + c]);
  LayerCache dense(2, 1, d);
  auto ds = std::make_unique<DenseSegment>(d);
  for (size_t t = 0; t < kv.size(); ++t) ds->append(rk.data() + t * d, rv.data() + t * d, int32_t(t));
  dense.segments(0).push_back(std::move(ds));
  const auto q = randn(2 * d, 3);
  std::vector<float> o1(2 * d), o2(2 * d);
  attend(cache, q.data(), o1.data());
  attend(dense, q.data(), o2.data());
  for (int i = 0; i < 2 * d; ++i) CHECK(o1[i] == Approx(o2[i]).margin(1e-4));
  // The unfused path (dequantize, then multiply) gives the same outputs.
  KvmixLayout U = L;
  U.fused = false;
  LayerCache unfused(2, 1, d);
  auto us = std::make_unique<KvmixSegment>(d, U);
  us->append(k.data(), v.data(), N, pos.data(), size_t(d));
  for (int t = N; t < N + steps; ++t) us->append_token(k.data() + size_t(t) * d, v.data() + size_t(t) * d, t);
  unfused.segments(0).push_back(std::move(us));
  std::vector<float> o3(2 * d);
  attend(unfused, q.data(), o3.data());
  for (int i = 0; i < 2 * d; ++i) CHECK(o3[i] == Approx(o1[i]).margin(1e-4));
  // Bytes: codes, fp16 scales and minimums, fp32 buffers.
  CHECK(kv.bytes() > kv.k_buffer() * d * 4 + kv.v_buffer() * d * 4);
  CHECK(kv.bytes() < kv.size() * d * 2 * 4 / 3);
}

TEST_CASE("KVmix method: the layer map's nominal bits, variants and bad input", "[kvmix]") {
  test::SyntheticLayer S(300, 6, 2, 16, 32, 4);
  S.cfg.n_layers = 32;
  auto bits = [&](const std::map<std::string, std::string>& p) {
    auto m = MethodRegistry::get().create("kvmix", p, S.cfg);
    MethodRunner r(*m, KvBudget{});
    double k = 0, v = 0;
    for (int l = 0; l < 32; ++l) {
      S.view.layer = l;
      LayerCache c(6, 2, 16);
      r.on_layer(S.view, c);
      k += m->layer_stats()["k_bits"].get<int>() / 32.0;
      v += m->layer_stats()["v_bits"].get<int>() / 32.0;
    }
    S.view.layer = 0;
    CHECK(r.compressed());
    return std::pair{k, v};
  };
  // 6 of 32 layers high (floor(0.2 x 32)): keys 2.1875 ("2.19"), values 2.375 ("2.38") bits.
  const auto [k, v] = bits({{"layers", "random"}, {"group", "16"}, {"seed", "3"}});
  CHECK(k == 2.1875);
  CHECK(v == 2.375);
  const auto [k2, v2] = bits({{"layers", "low"}, {"group", "16"}});
  CHECK(k2 == 2.0);
  CHECK(v2 == 2.0);
  test::require_error(
      [&] {
        MethodRegistry::get().create("kvmix", {{"layers", "low"}, {"group", "12"}}, S.cfg);
      },
      {"group=12", "head dimension 16"});
  test::require_error(
      [&] {
        MethodRegistry::get().create("kvmix", {{"layers", "low"}, {"k_low", "5"}}, S.cfg);
      },
      {"k_low"});
  test::require_error(
      [&] {
        MethodRegistry::get().create("kvmix", {{"layers", "low"}, {"group", "16"}, {"v_high", "3"}}, S.cfg);
      },
      {"v_high=3", "3-bit values"});
  auto m = MethodRegistry::get().create("kvmix", {{"layers", "low"}, {"group", "16"}}, S.cfg);
  test::require_error([&] { MethodRunner(*m, 64); }, {"kvmix takes no KV size"});
  S.cfg.fingerprint = "1-abc";
  test::require_error(
      [&] {
        MethodRegistry::get().create("kvmix", {{"profile", "/nonexistent/kvmix.json"}, {"group", "16"}}, S.cfg);
      },
      {"kvbench calibrate kvmix"});
}

TEST_CASE("KVmix on the default model: r = 1 keeps decoding exact, the profile end to end", "[kvmix][model]") {
  const auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine e(*model);
  std::vector<int32_t> ids(80);
  for (int i = 0; i < 80; ++i) ids[i] = 100 + 37 * i;
  e.prefill(ids);
  std::vector<std::vector<float>> full;
  for (int32_t t : {500, 501, 502}) full.push_back(e.decode(t));
  // Nothing leaves the buffers: the logits are those of the full cache (up to summation order).
  auto exact = MethodRegistry::get().create("kvmix", {{"layers", "low"}, {"rpc_low", "1"}}, e.config());
  MethodRunner r1(*exact, KvBudget{});
  e.prefill(ids, &r1);
  for (size_t s = 0; s < 3; ++s) {
    const auto got = e.decode(500 + int32_t(s));
    for (size_t i = 0; i < got.size(); ++i) REQUIRE(got[i] == Approx(full[s][i]).margin(2e-3));
  }

  // Profile on the two qasper records of the LongBench fixture, 64 tokens each.
  const test::TempDir dir("kvmix_profile");
  const auto out = (dir / "kvb_kvmix_profile.json").string();
  const OfflineStep step = MethodRegistry::get().offline_step("calibrate", "kvmix");
  Params options(step.options,
                 {{"longbench", test::fixture("longbench/data/longbench")}, {"prompts", "3"}, {"max_tokens", "64"}},
                 "test");
  CalibrationContext ctx{*model, *tok, e, options, out, default_data_dir(), false};
  step.run(ctx);
  const auto body = nlohmann::json::parse(std::ifstream(out));
  const int L = model->config().n_layers;
  REQUIRE(body["s_k"].size() == size_t(L));
  REQUIRE(body["per_prompt"]["s_v"].size() == 3);
  CHECK(body["high_k"].size() == size_t(L / 5));  // floor(0.2 x 30) = 6
  CHECK(body["header"]["profile"]["prompts"][0] == "qasper/q1");
  CHECK(body["header"]["profile"]["prompts"][1] == "trec/t1");  // round robin over the datasets
  for (const auto& x : body["s_k"]) CHECK(x.get<double>() > 0);
  auto prof = MethodRegistry::get().create("kvmix", {{"profile", out}}, e.config());
  CHECK(prof->artifacts()["kvmix_profile"]["digest"].get<std::string>().size() == 16);
  MethodRunner r2(*prof, KvBudget{});
  e.prefill(ids, &r2);
  CHECK(r2.prefill_kv_bytes() < e.full_kv_bytes(ids.size()));
  Params many(step.options, {{"longbench", test::fixture("longbench/data/longbench")}, {"prompts", "50"}}, "test");
  CalibrationContext bad{*model, *tok, e, many, out, default_data_dir(), false};
  test::require_error([&] { step.run(bad); }, {"50 prompts asked"});
}

TEST_CASE("KVmix buffers at 16 bits: moved tokens are quantized from the stored rows", "[kvmix][kv_dtype]") {
  const int d = 64, n = 200;
  const auto k = randn(size_t(n) * d, 31), v = randn(size_t(n) * d, 32);
  std::vector<int32_t> pos(n);
  for (int i = 0; i < n; ++i) pos[i] = i;
  KvmixLayout L;
  L.k_rpc = L.v_rpc = 0.2;
  std::vector<float> kr(k.size()), vr(v.size());
  for (size_t i = 0; i < k.size(); ++i) {
    kr[i] = kv_round(KvDtype::F16, k[i]);
    vr[i] = kv_round(KvDtype::F16, v[i]);
  }
  KvmixSegment s32(d, L), s16(d, L, KvDtype::F16), rounded(d, L);
  s32.append(k.data(), v.data(), n, pos.data(), size_t(d));
  s16.append(k.data(), v.data(), n, pos.data(), size_t(d));
  rounded.append(kr.data(), vr.data(), n, pos.data(), size_t(d));
  REQUIRE(s16.k_buffer() == s32.k_buffer());
  const size_t buffers32 = (s32.k_buffer() + s32.v_buffer()) * d * 4;
  CHECK(s32.bytes() - s16.bytes() == buffers32 / 2);
  std::vector<float> k16, v16, kr2, vr2;
  s16.reconstruct(k16, v16);
  rounded.reconstruct(kr2, vr2);
  CHECK(k16 == kr2);  // codes from the fp16 rows, buffers holding them
  CHECK(v16 == vr2);
}

TEST_CASE("KVmix attention gives the same numbers however its heads are spread over threads", "[kvmix]") {
  // The default model's 3 KV heads of 3 query heads: on 2 threads each head's logits are cut at key
  // groups and its values at value groups (Segment::token_cuts, channel_cuts); 2- and 3-bit keys, fp16
  // and fp32 buffers (fp32 rows are not cut in channels), a dense tail behind the store.
  const int d = 64, hq = 9, hkv = 3, n = 900;
  for (auto dtype : {KvDtype::F16, KvDtype::F32})
    for (int k_bits : {2, 3}) {
      KvmixLayout L;
      L.k_bits = k_bits;
      L.k_group = k_bits == 3 ? 11 : 32;
      L.v_bits = k_bits == 3 ? 4 : 2;
      L.k_rpc = L.v_rpc = 0.2;
      LayerCache cache(hq, hkv, d, dtype);
      std::vector<int32_t> pos(n);
      std::iota(pos.begin(), pos.end(), 0);
      for (int h = 0; h < hkv; ++h) {
        const auto k = randn(size_t(n) * d, 40 + h), v = randn(size_t(n) * d, 50 + h);
        auto seg = std::make_unique<KvmixSegment>(d, L, dtype);
        seg->append(k.data(), v.data(), n, pos.data(), size_t(d));
        cache.segments(h).push_back(std::move(seg));
        auto tail = std::make_unique<DenseSegment>(d, dtype);
        for (int t = 0; t < 70; ++t) tail->append(k.data() + size_t(t) * d, v.data() + size_t(t) * d, n + t);
        cache.segments(h).push_back(std::move(tail));
      }
      const auto q = randn(size_t(hq) * d, 60, 2.0f);
      INFO(kv_dtype_name(dtype) << ", " << k_bits << "-bit keys");
      const auto ref = test::attend_across_threads(cache, q, {2, 4, 5});
      std::vector<float> out(q.size());
      attend_ref(cache, q.data(), out.data());
      CHECK(test::max_abs_diff(ref, out) < 1e-4f);
    }
}
