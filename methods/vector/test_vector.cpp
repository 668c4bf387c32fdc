// VECTOR (README.md §8): least-squares maps against their references, the RoPE round trip at
// long positions, the tier accounting, p_a = 0 as the base, the approximated set as the best-predicted
// pool tokens, and an exact map recovering the base at the pool budget.

#include <cmath>
#include <filesystem>
#include <fstream>
#include <random>
#include <set>

#include "harness/engine/engine.hpp"
#include "harness/engine/rope_freqs.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/compose.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/base64.hpp"
#include "kernels/cpu/ops.hpp"
#include "methods/vector/approx_value_segment.hpp"
#include "methods/vector/value_map_fit.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"

using namespace kvb;

// The registry tests run VECTOR without a calibration: maps fitted on each prompt.
const bool test_params_registered = test::register_method_test_params("vector", {{"maps", "prompt"}});
using kvb::test::kept_positions;
using kvb::test::SyntheticLayer;

namespace {

// A synthetic layer whose keys are the RoPE rotation of known pre-RoPE keys and whose values are an
// exact linear map M of them, except the `noisy` tokens, whose values get noise.
struct ExactLayer {
  SyntheticLayer L;
  std::vector<float> pre, m;
  ExactLayer(int S, const std::set<int>& noisy, uint32_t seed) : L(S, 6, 2, 16, 32, seed) {
    const int d = 16, hkv = 2;
    std::mt19937 rng(seed + 1);
    std::normal_distribution<float> nd(0.0f, 1.0f);
    pre = L.k;
    m.resize(size_t(hkv) * d * d);
    for (auto& x : m) x = nd(rng) * 0.25f;
    RopeTable rope(rope_inv_freq(L.cfg),
                   L.cfg.rope_layout == RopeLayout::Interleaved ? RopeStyle::Interleaved : RopeStyle::NeoX);
    rope.ensure(S + 1);
    L.k = pre;
    rope.apply(L.k.data(), S, hkv, d, L.pos.data());
    for (int t = 0; t < S; ++t)
      for (int g = 0; g < hkv; ++g)
        for (int i = 0; i < d; ++i) {
          float s = 0;
          for (int j = 0; j < d; ++j) s += m[(size_t(g) * d + i) * d + j] * pre[(size_t(t) * hkv + g) * d + j];
          L.v[(size_t(t) * hkv + g) * d + i] = s + (noisy.count(t) ? nd(rng) * 3.0f : 0.0f);
        }
    L.view.k = L.k.data();
    L.view.v = L.v.data();
    L.view.k_pre_rope = pre.data();
    L.refresh_colsum();
  }
};

}  // namespace

TEST_CASE("least squares: BLAS sums equal the loops, an exact map is recovered, R2", "[vector]") {
  std::mt19937 rng(1);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  const int dx = 12, dy = 9, n = 500;
  std::vector<float> x(size_t(n) * dx), y(size_t(n) * dy), m(size_t(dy) * dx);
  for (auto& v : x) v = nd(rng);
  for (auto& v : m) v = nd(rng);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < dy; ++i) {
      float s = 0;
      for (int j = 0; j < dx; ++j) s += m[size_t(i) * dx + j] * x[size_t(t) * dx + j];
      y[size_t(t) * dy + i] = s;
    }
  OlsFit fast(dx, dy), ref(dx, dy);
  fast.add(x.data(), dx, y.data(), dy, 200);
  fast.add(x.data() + 200 * dx, dx, y.data() + 200 * dy, dy, n - 200);
  ref.add_ref(x.data(), dx, y.data(), dy, n);
  for (int i = 0; i < dx; ++i)
    for (int j = i; j < dx; ++j)
      CHECK(fast.gxx()[size_t(i) * dx + j] == Approx(ref.gxx()[size_t(i) * dx + j]).epsilon(1e-12));
  for (size_t i = 0; i < fast.gxy().size(); ++i)
    CHECK(fast.gxy()[i] == Approx(ref.gxy()[i]).epsilon(1e-12).margin(1e-9));
  const auto w = fast.solve(1e-9);
  double err = 0, norm = 0;
  for (size_t i = 0; i < w.size(); ++i) {
    err += (w[i] - m[i]) * (w[i] - m[i]);
    norm += double(m[i]) * m[i];
  }
  CHECK(std::sqrt(err / norm) < 1e-4);
  R2Score exact(dy), mean_only(dy);
  std::vector<double> pred(size_t(n) * dy), zeros(size_t(n) * dy, 0.0);
  for (int t = 0; t < n; ++t)
    for (int i = 0; i < dy; ++i) {
      double s = 0;
      for (int j = 0; j < dx; ++j) s += w[size_t(i) * dx + j] * x[size_t(t) * dx + j];
      pred[size_t(t) * dy + i] = s;
    }
  exact.add(pred.data(), y.data(), dy, n);
  mean_only.add(zeros.data(), y.data(), dy, n);
  CHECK(exact.r2() > 0.999999);
  CHECK(mean_only.r2() < 0.01);  // zero is about the mean of these values
  test::require_error([] { OlsFit(3, 3).solve(1e-6); }, {"no rows"});
  OlsFit singular(3, 1);
  std::vector<float> zx(9, 0.0f), zy(3, 1.0f);
  singular.add(zx.data(), 3, zy.data(), 1, 3);
  test::require_error([&] { singular.solve(0.0); }, {"not positive definite"});
}

TEST_CASE("vector: tier accounting, p_a = 0 is the base, the best-predicted pool tokens lose their value", "[vector]") {
  const std::set<int> noisy = {5, 40, 77, 130, 200, 260};
  for (const char* gqa : {"native", "repeat"}) {
    ExactLayer E(300, noisy, 3);
    INFO(gqa);
    const int T = 64;
    // p_c 0.75 -> p_a = (0.25 - 1e-3) / 2, a = round(p_a / 0.25 x 64) = 32: pool P = 96, A = 64, R = 32.
    auto m = MethodRegistry::get().create(
        "vector", {{"maps", "prompt"}, {"p_c", "0.75"}, {"gqa", gqa}, {"base.window", "8"}}, E.L.cfg);
    MethodRunner runner(*m, T);
    LayerCache c(6, 2, 16);
    runner.on_layer(E.L.view, c);
    const auto pool = kept_positions(c);
    const auto base_pool = [&] {
      auto b = MethodRegistry::get().create("snapkv", {{"gqa", gqa}, {"window", "8"}}, E.L.cfg);
      MethodRunner r(*b, T + 32);
      LayerCache bc(6, 2, 16);
      r.on_layer(E.L.view, bc);
      return kept_positions(bc);
    }();
    for (int s = 0; s < c.n_cache_heads(); ++s) {
      std::vector<int32_t> sorted = pool[s];
      std::sort(sorted.begin(), sorted.end());
      CHECK(sorted == base_pool[s]);  // the pool is the base at n + a
      size_t approx = 0, dense = 0;
      for (const auto& seg : c.segments(s)) (seg->format() == "dense" ? dense : approx) += seg->size();
      CHECK(approx == 64);                         // A = 2a
      CHECK(dense == 32);                          // R = n - a
      CHECK(approx + 2 * dense == size_t(2 * T));  // P keys + R values = 2n
      // The noisy tokens in the pool predict worst: they keep their values.
      for (const auto& seg : c.segments(s))
        if (seg->format() != "dense")
          for (int32_t p : seg->positions()) CHECK_FALSE(noisy.count(p));
    }
    CHECK(runner.prefill_kv_bytes() <= runner.budget().bytes_per_layer);

    auto zero = MethodRegistry::get().create(
        "vector", {{"maps", "prompt"}, {"p_a", "0"}, {"gqa", gqa}, {"base.window", "8"}}, E.L.cfg);
    auto base = MethodRegistry::get().create("snapkv", {{"gqa", gqa}, {"window", "8"}}, E.L.cfg);
    MethodRunner rz(*zero, T), rb(*base, T);
    LayerCache cz(6, 2, 16), cb(6, 2, 16);
    rz.on_layer(E.L.view, cz);
    rb.on_layer(E.L.view, cb);
    CHECK(kept_positions(cz) == kept_positions(cb));
    CHECK(rz.prefill_kv_bytes() == rb.prefill_kv_bytes());
  }
}

TEST_CASE("vector: with the exact map, decoding equals the base at the pool budget", "[vector]") {
  ExactLayer E(300, {}, 4);
  auto m = MethodRegistry::get().create("vector", {{"maps", "prompt"}, {"p_c", "0.9"}, {"base.window", "8"}}, E.L.cfg);
  auto pool = MethodRegistry::get().create("snapkv", {{"window", "8"}}, E.L.cfg);
  // p_c 0.9 -> p_a = 0.05, a = round(0.5 x 64) = 32: the pool is SnapKV at 96.
  MethodRunner rv(*m, 64), rp(*pool, 96);
  LayerCache cv(6, 2, 16), cp(6, 2, 16);
  rv.on_layer(E.L.view, cv);
  rp.on_layer(E.L.view, cp);
  std::mt19937 rng(5);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> q(6 * 16), o1(q.size()), o2(q.size());
  for (auto& x : q) x = nd(rng);
  attend(cv, q.data(), o1.data());
  attend(cp, q.data(), o2.data());
  for (size_t i = 0; i < o1.size(); ++i) CHECK(o1[i] == Approx(o2[i]).margin(2e-3));
}

TEST_CASE("vector: materialized, factored and per-token values decode alike at the same bytes", "[vector]") {
  ExactLayer E(300, {3, 50, 120, 250}, 6);
  std::mt19937 rng(7);
  std::normal_distribution<float> nd(0.0f, 0.5f);
  std::vector<float> q(6 * 16);
  for (auto& x : q) x = nd(rng);
  auto run = [&](std::map<std::string, std::string> p, std::vector<float>& out, const ExactLayer& X) {
    p.insert({{"maps", "prompt"}, {"p_c", "0.75"}, {"base.window", "8"}});
    auto m = MethodRegistry::get().create("vector", p, X.L.cfg);
    MethodRunner r(*m, 64);
    LayerCache c(6, 2, 16);
    r.on_layer(X.L.view, c);
    out.assign(q.size(), 0.0f);
    attend(c, q.data(), out.data());
    return std::pair{kept_positions(c), r.prefill_kv_bytes()};
  };
  std::vector<float> factored, materialized, full;
  const auto [kept_f, bytes_f] = run({}, factored, E);
  const auto [kept_m, bytes_m] = run({{"materialize", "true"}}, materialized, E);
  CHECK(kept_f == kept_m);
  CHECK(bytes_f == bytes_m);  // charged as keys only, whatever the buffer holds
  for (size_t i = 0; i < q.size(); ++i) CHECK(factored[i] == Approx(materialized[i]).margin(1e-4));

  // Per token: each approximated value rebuilt from its inverse-rotated key, as dense rows.
  auto m = MethodRegistry::get().create("vector", {{"maps", "prompt"}, {"p_c", "0.75"}, {"base.window", "8"}}, E.L.cfg);
  MethodRunner r(*m, 64);
  LayerCache c(6, 2, 16), dense(6, 2, 16);
  r.on_layer(E.L.view, c);
  for (int s = 0; s < c.n_cache_heads(); ++s)
    for (const auto& seg : c.segments(s)) {
      auto d = std::make_unique<DenseSegment>(16);
      std::vector<float> k, v;
      if (const auto* a = dynamic_cast<const ApproxValueSegment*>(seg.get())) {
        a->reconstruct(k, v);
      } else {
        const auto* ds = dynamic_cast<const DenseSegment*>(seg.get());
        REQUIRE(ds);
        k.assign(ds->k(), ds->k() + ds->size() * 16);
        v.assign(ds->v(), ds->v() + ds->size() * 16);
      }
      for (size_t t = 0; t < seg->size(); ++t) d->append(k.data() + t * 16, v.data() + t * 16, seg->positions()[t]);
      dense.segments(s).push_back(std::move(d));
    }
  std::vector<float> per_token(q.size(), 0.0f);
  attend(dense, q.data(), per_token.data());
  for (size_t i = 0; i < q.size(); ++i) CHECK(factored[i] == Approx(per_token[i]).margin(1e-4));

  // The full-layer map contains the per-head one (block diagonal): on a noise-free exact layer both
  // recover every value, so decoding is the same whichever tokens they approximate.
  const ExactLayer clean(300, {}, 6);
  std::vector<float> per_head;
  const auto [kept_h, bytes_h] = run({}, per_head, clean);
  const auto [kept_l, bytes_l] = run({{"materialize", "true"}, {"full_layer_map", "true"}}, full, clean);
  CHECK(bytes_l == bytes_h);
  for (size_t i = 0; i < q.size(); ++i) CHECK(full[i] == Approx(per_head[i]).margin(2e-3));
  test::require_error(
      [&] {
        MethodRegistry::get().create("vector", {{"maps", "prompt"}, {"full_layer_map", "true"}}, E.L.cfg);
      },
      {"full_layer_map=true needs materialize=true"});
}

TEST_CASE("vector: a compression-ratio run takes n = floor(S (1 - p_c)) and a = round(p_a S)", "[vector]") {
  ExactLayer E(300, {}, 8);
  // p_c 0.5: p_a = 0.2495 (Eq. 1), n = 150, a = round(74.85) = 75; P = 225, A = 150, R = 75.
  auto m = MethodRegistry::get().create("vector", {{"maps", "prompt"}, {"base.window", "8"}}, E.L.cfg);
  MethodRunner r(*m, KvBudget::compression_ratio(0.5));
  LayerCache c(6, 2, 16);
  r.on_layer(E.L.view, c);
  CHECK(r.budget().tokens == 150);
  for (int s = 0; s < c.n_cache_heads(); ++s) {
    size_t approx = 0, dense = 0;
    for (const auto& seg : c.segments(s)) (seg->format() == "dense" ? dense : approx) += seg->size();
    CHECK(approx == 150);
    CHECK(dense == 75);
  }
  // p_c set to another ratio than the run's is a contradiction.
  auto bad =
      MethodRegistry::get().create("vector", {{"maps", "prompt"}, {"p_c", "0.9"}, {"base.window", "8"}}, E.L.cfg);
  MethodRunner rb(*bad, KvBudget::compression_ratio(0.5));
  LayerCache cb(6, 2, 16);
  test::require_error([&] { rb.on_layer(E.L.view, cb); }, {"p_c=0.9", "compression ratio 0.5"});
}

TEST_CASE("vector over PyramidKV: each layer's pool grows with its own budget, never past 2n", "[vector]") {
  // At p_c 0.5 the pool of a relaxed PyramidKV run would hit its clamp and reshape the pyramid (top
  // layers would get a > n); a_l = round(a n_l / T) keeps every layer within its own bytes.
  ExactLayer E(300, {}, 9);
  for (const KvBudget budget : {KvBudget::compression_ratio(0.5), KvBudget(64)}) {
    auto m = MethodRegistry::get().create("vector", {{"maps", "prompt"}, {"base", "pyramidkv"}, {"base.window", "8"}},
                                          E.L.cfg);
    auto base = MethodRegistry::get().create("pyramidkv", {{"window", "8"}}, E.L.cfg);
    MethodRunner rv(*m, budget), rb(*base, budget);
    size_t bytes_v = 0, bytes_b = 0;
    for (int l = 0; l < E.L.cfg.n_layers; ++l) {
      E.L.view.layer = l;
      LayerCache cv(6, 2, 16), cb(6, 2, 16);
      REQUIRE_NOTHROW(rv.on_layer(E.L.view, cv));
      rb.on_layer(E.L.view, cb);
      bytes_v += cv.bytes();
      bytes_b += cb.bytes();
      auto kv = kept_positions(cv), kb = kept_positions(cb);
      for (int s = 0; s < cv.n_cache_heads(); ++s) {
        std::sort(kv[s].begin(), kv[s].end());
        std::sort(kb[s].begin(), kb[s].end());
        // The pool contains the base's own choice; keys + values = 2 n_l per head.
        CHECK(std::includes(kv[s].begin(), kv[s].end(), kb[s].begin(), kb[s].end()));
        size_t approx = 0, dense = 0;
        for (const auto& seg : cv.segments(s)) (seg->format() == "dense" ? dense : approx) += seg->size();
        CHECK(approx + 2 * dense == 2 * kb[s].size());
      }
    }
    CHECK(bytes_v == bytes_b);
    E.L.view.layer = 0;
  }
}

TEST_CASE("vector: bad maps and parameters are clear errors", "[vector]") {
  SyntheticLayer L(100, 6, 2, 16, 32, 1);
  L.cfg.fingerprint = "123-abc";
  const test::TempDir dir("vector_maps");
  auto write = [&](const std::string& name, const nlohmann::json& body) {
    const auto p = (dir / name).string();
    write_artifact(p, body);
    return p;
  };
  nlohmann::json body = {{"header", artifact_header("vector", L.cfg, "m.gguf")}};
  body["maps"] = nlohmann::json::array();
  for (int l = 0; l < 4; ++l)
    body["maps"].push_back(
        {floats_to_base64(std::vector<float>(256, 0.1f)), floats_to_base64(std::vector<float>(256, 0.1f))});
  CHECK_NOTHROW(MethodRegistry::get().create("vector", {{"maps", write("kvb_vec_ok.json", body)}}, L.cfg));
  auto bad = body;
  bad["maps"][2][1] = floats_to_base64(std::vector<float>(100, 0.1f));
  test::require_error(
      [&] {
        MethodRegistry::get().create("vector", {{"maps", write("kvb_vec_bad.json", bad)}}, L.cfg);
      },
      {"kvb_vec_bad.json", "maps[2][1]", "100 values", "16 x 16"});
  bad = body;
  bad["maps"].erase(3);
  test::require_error(
      [&] {
        MethodRegistry::get().create("vector", {{"maps", write("kvb_vec_l.json", bad)}}, L.cfg);
      },
      {"kvb_vec_l.json", "4 layers"});
  bad = body;
  bad["header"]["model"]["fingerprint"] = "999-fff";
  test::require_error(
      [&] {
        MethodRegistry::get().create("vector", {{"maps", write("kvb_vec_fp.json", bad)}}, L.cfg);
      },
      {"kvb_vec_fp.json", "999-fff", "kvbench calibrate vector"});
  test::require_error(
      [&] {
        MethodRegistry::get().create("vector", {{"maps", "prompt"}, {"p_c", "0.5"}, {"p_a", "0.6"}}, L.cfg);
      },
      {"p_a 0.6", "1 - p_c"});
  test::require_error(
      [&] {
        MethodRegistry::get().create("vector", {{"maps", "prompt"}, {"base", "mixeddimkv"}}, L.cfg);
      },
      {"'mixeddimkv' cannot be wrapped"});
}

TEST_CASE("vector approximate=keys: the pool tokens whose keys the values predict best lose their keys", "[vector]") {
  // ExactLayer's values are an invertible map of the pre-RoPE keys, so the keys are a map of the
  // values too: without noise the rebuilt keys are the keys. With noisy values (the regressors now) the
  // fit is off, but the noisy tokens still predict worst and keep their keys.
  const std::set<int> noisy = {5, 40, 77, 130, 200, 260};
  for (const bool with_noise : {false, true}) {
    INFO("noisy values: " << with_noise);
    ExactLayer E(300, with_noise ? noisy : std::set<int>{}, 3);
    auto m = MethodRegistry::get().create(
        "vector", {{"maps", "prompt"}, {"p_c", "0.75"}, {"approximate", "keys"}, {"base.window", "8"}}, E.L.cfg);
    MethodRunner runner(*m, 64);
    LayerCache c(6, 2, 16);
    runner.on_layer(E.L.view, c);
    for (int s = 0; s < c.n_cache_heads(); ++s) {
      size_t approx = 0, dense = 0;
      for (const auto& seg : c.segments(s)) {
        if (seg->format() == "dense") {
          dense += seg->size();
          continue;
        }
        CHECK(seg->format() == "approx_key(affine, materialized)");
        approx += seg->size();
        CHECK(seg->bytes() == seg->size() * 16 * sizeof(float));  // the values only
        const auto& keys = dynamic_cast<const MaterializedValueSegment&>(*seg).keys();
        const auto& values = dynamic_cast<const MaterializedValueSegment&>(*seg).values();
        // The expected key: this head's values-to-keys fit on the prompt (OlsFit as tested above), applied
        // to the token's value and rotated to its position.
        OlsFit fit(16, 16);
        fit.add(E.L.v.data() + s * 16, 32, E.pre.data() + s * 16, 32, 300);
        const auto w = fit.solve(1e-6);
        RopeTable rope(rope_inv_freq(E.L.cfg),
                       E.L.cfg.rope_layout == RopeLayout::Interleaved ? RopeStyle::Interleaved : RopeStyle::NeoX);
        rope.ensure(301);
        for (size_t t = 0; t < seg->size(); ++t) {
          const int32_t p = seg->positions()[t];
          if (with_noise) CHECK_FALSE(noisy.count(p));
          const size_t off = (size_t(p) * 2 + size_t(s)) * 16;
          std::vector<float> want(16);
          for (int i = 0; i < 16; ++i)
            for (int j = 0; j < 16; ++j)
              want[size_t(i)] += float(w[size_t(i) * 16 + size_t(j)]) * E.L.v[off + size_t(j)];
          rope.apply(want.data(), 1, 1, 16, &p);
          for (int i = 0; i < 16; ++i) {
            CHECK(keys[t * 16 + size_t(i)] == Approx(want[size_t(i)]).margin(1e-4));  // rebuilt and rotated
            CHECK(values[t * 16 + size_t(i)] == E.L.v[off + size_t(i)]);              // kept
            // Without noise the fitted map nearly inverts the values' map (its ridge biases it slightly).
            if (!with_noise) CHECK(keys[t * 16 + size_t(i)] == Approx(E.L.k[off + size_t(i)]).margin(0.2));
          }
        }
      }
      CHECK(approx == 64);
      CHECK(dense == 32);
    }
    CHECK(runner.prefill_kv_bytes() <= runner.budget().bytes_per_layer);
  }
  const ExactLayer E(300, {}, 3);
  test::require_error(
      [&] {
        MethodRegistry::get().create(
            "vector",
            {{"maps", "prompt"}, {"approximate", "keys"}, {"full_layer_map", "true"}, {"materialize", "true"}},
            E.L.cfg);
      },
      {"approximate=keys", "per-head"});
}

TEST_CASE("vector calibration on the default model: maps, held-out R2, an artifact vector loads", "[vector][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine engine(*model);
  const test::TempDir dir("vector_cal");
  for (int i = 0; i < 4; ++i) {
    std::ofstream out(dir / fmt::format("doc{}.txt", i));
    for (int r = 0; r < 40; ++r)
      out << "Document " << i << " line " << r << ": the quick brown fox jumps over the lazy dog. ";
  }
  const OfflineStep step = MethodRegistry::get().offline_step("calibrate", "vector");
  Params options(step.options,
                 {{"text", dir.path().string()},
                  {"tokens", "600"},
                  {"heldout_tokens", "200"},
                  {"heldout_every", "4"},
                  {"seq_len", "300"}},
                 "test");
  const std::string out = (dir / "maps.json").string();
  CalibrationContext ctx{*model, *tok, engine, options, out, default_data_dir(), false};
  step.run(ctx);
  const auto body = nlohmann::json::parse(std::ifstream(out));
  const auto& c = body["header"]["calibration"];
  CHECK(c["documents"]["fitting"] == 3);
  CHECK(c["documents"]["held_out"] == 1);
  CHECK(c["fitting_tokens"].get<int>() >= 600);
  const auto &head = c["r2_per_head_maps"], full = c["r2_full_layer_map"];
  CHECK(head["per_layer"].size() == size_t(model->config().n_layers));
  CHECK(head["mean"].get<double>() <= 1.0);
  CHECK(full["mean"].get<double>() <= 1.0);
  auto m = MethodRegistry::get().create("vector", {{"maps", out}}, engine.config());
  CHECK(m->artifacts()["vector_maps"]["digest"].get<std::string>().size() == 16);
  // The reverse maps of the K-only ablation come with every calibration.
  CHECK(body["key_maps"].size() == size_t(model->config().n_layers));
  CHECK(c["r2_key_maps"]["mean"].get<double>() <= 1.0);
  MethodRegistry::get().create("vector", {{"maps", out}, {"approximate", "keys"}}, engine.config());
  auto without = body;
  without.erase("key_maps");
  std::ofstream(dir / "old.json") << without.dump();
  test::require_error(
      [&] {
        MethodRegistry::get().create("vector", {{"maps", (dir / "old.json").string()}, {"approximate", "keys"}},
                                     engine.config());
      },
      {"old.json", "'key_maps'", "recalibrate"});
  // Held-out and fitting text must both exist.
  Params one(step.options, {{"text", (dir / "doc0.txt").string()}}, "test");
  CalibrationContext bad{*model, *tok, engine, one, out, default_data_dir(), false};
  test::require_error([&] { step.run(bad); }, {"cannot be split", "heldout_every"});
  // An empty file says so (it was "cannot be split").
  std::ofstream((dir / "empty.txt").string()) << "\n \n";
  Params empty(step.options, {{"text", (dir / "empty.txt").string()}}, "test");
  CalibrationContext none{*model, *tok, engine, empty, out, default_data_dir(), false};
  test::require_error([&] { step.run(none); }, {"the calibration text is empty"});
}

TEST_CASE("vector: approximated segments give the same numbers however their heads are spread over threads",
          "[vector]") {
  // The default model's 3 KV heads of 3 query heads: on 2 threads the third head's approximated keys'
  // logits are cut at blocks of 16 (Segment::token_cuts) and its dense rows at 64; a retained segment,
  // the approximated one (a length off the blocks) and a tail, at fp16 and fp32.
  const int d = 64, hq = 9, hkv = 3;
  std::vector<float> inv(d / 2);
  for (int i = 0; i < d / 2; ++i) inv[size_t(i)] = 1.0f / std::pow(10000.0f, float(2 * i) / float(d));
  auto rope = std::make_shared<RopeTable>(inv, RopeStyle::NeoX);
  rope->ensure(1000);
  auto est = std::make_shared<AffineValueEstimator>(d, test::randn(size_t(d) * d, 3, 0.2f), std::vector<float>{});
  for (auto dtype : {KvDtype::F16, KvDtype::F32}) {
    LayerCache cache(hq, hkv, d, dtype);
    for (int t = 0; t < 130; ++t) {
      const auto k = test::randn(size_t(hkv) * d, uint32_t(t)), v = test::randn(size_t(hkv) * d, uint32_t(t + 500));
      cache.append(k.data(), v.data(), 2 * t);
    }
    for (int h = 0; h < hkv; ++h) {
      auto approx = std::make_unique<ApproxValueSegment>(d, est, rope, false);
      approx->store_as(dtype);
      for (int t = 0; t < 201; ++t)
        approx->append(test::randn(size_t(d), uint32_t(1000 + 300 * h + t)).data(), 2 * t + 1);
      cache.segments(h).push_back(std::move(approx));
      cache.segments(h).push_back(std::make_unique<DenseSegment>(d, dtype));
    }
    for (int t = 0; t < 5; ++t) {
      const auto k = test::randn(size_t(hkv) * d, uint32_t(t + 2000)),
                 v = test::randn(size_t(hkv) * d, uint32_t(t + 3000));
      cache.append(k.data(), v.data(), 600 + t);
    }
    const auto q = test::randn(size_t(hq) * d, 7, 0.5f);
    INFO(kv_dtype_name(dtype));
    test::attend_across_threads(cache, q, {2, 3, 4, 5, 16});
  }
  // Rounding the keys after they are stored gives the segment that stored them rounded: the same logits
  // and the same fold (its keys rotated back again from the rounded ones).
  ApproxValueSegment before(d, est, rope, false), after(d, est, rope, false);
  before.store_as(KvDtype::F16);
  for (int t = 0; t < 37; ++t) {
    const auto k = test::randn(size_t(d), uint32_t(4000 + t));
    before.append(k.data(), 3 * t);
    after.append(k.data(), 3 * t);
  }
  after.store_as(KvDtype::F16);
  const auto q = test::randn(size_t(3) * d, 8), p = test::randn(size_t(3) * 37, 9);
  std::vector<float> s1(3 * 37), s2(s1.size()), a1(3 * size_t(d), 0.5f), a2(a1);
  before.logits_group(q.data(), 3, d, s1.data());
  after.logits_group(q.data(), 3, d, s2.data());
  CHECK(s1 == s2);
  before.accumulate_group(p.data(), 3, d, a1.data());
  after.accumulate_group(p.data(), 3, d, a2.data());
  CHECK(a1 == a2);
  CHECK(before.bytes() == after.bytes());
}
