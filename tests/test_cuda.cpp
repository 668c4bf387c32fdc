// The CUDA backend against the CPU backend, op by op over many shapes (in the spirit of llama.cpp's
// test-backend-ops), decode attention over every segment format, and whole models. Without a GPU the
// tests skip with a warning; KVBENCH_REQUIRE_GPU=1 turns the skip into a failure (GPU machines).
#include <cmath>
#include <cstdlib>
#include <filesystem>
#include <memory>
#include <random>

#include "harness/cache/layer_cache.hpp"
#include "harness/cache/lowrank_segment.hpp"
#include "harness/cache/quantized_segment.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/model/model_file.hpp"
#include "harness/model/random_model.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "kernels/cpu/fp16.hpp"
#include "methods/vector/approx_value_segment.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;

namespace {

bool have_gpu() {
  if (cuda_available()) return true;
  const char* req = std::getenv("KVBENCH_REQUIRE_GPU");
  if (req && std::string(req) == "1") FAIL("KVBENCH_REQUIRE_GPU=1 but no CUDA GPU is visible");
  WARN("skipped: no CUDA GPU visible");
  return false;
}

std::vector<float> uniform(size_t n, std::mt19937& rng, float scale = 1.0f) {
  std::uniform_real_distribution<float> u(-scale, scale);
  std::vector<float> v(n);
  for (auto& x : v) x = u(rng);
  return v;
}

std::vector<float> round_bf16(std::vector<float> v) {
  for (auto& x : v) x = bf16_to_float(float_to_bf16(x));
  return v;
}

// |gpu - cpu| <= tol * max|cpu| over the whole output.
void check_close(const std::vector<float>& gpu, const std::vector<float>& cpu, float tol) {
  const float err = max_abs_diff(gpu, cpu), scale = std::max(max_abs(cpu), 1e-30f);
  INFO("max abs error " << err << " relative to max |ref| " << scale << " (tolerance " << tol << ")");
  CHECK(err <= tol * scale);
}

struct Pair {
  std::unique_ptr<Backend> cpu = make_cpu_backend(), gpu = make_cuda_backend();
};

}  // namespace

TEST_CASE("CUDA ops equal the CPU backend", "[cuda]") {
  if (!have_gpu()) return;
  Pair p;
  std::mt19937 rng(1);

  SECTION("linear: bf16 weights; the CPU reference uses the same rounded weights") {
    for (auto [n, in, out, bias] : {std::tuple{1, 576, 1536, false},
                                    {3, 64, 40, true},
                                    {4, 1536, 576, false},
                                    {1, 4096, 1024, true},
                                    {17, 128, 96, true},
                                    {300, 576, 1536, false},
                                    {513, 4096, 1024, false}}) {
      INFO("n " << n << " in " << in << " out " << out << " bias " << bias);
      const auto w = uniform(size_t(out) * in, rng, 0.1f);
      const auto b = uniform(out, rng);
      // Above 4 rows the GPU also rounds the activations to bf16 for cuBLAS.
      const auto x = uniform(size_t(n) * in, rng);
      const auto x_ref = n > 4 ? round_bf16(x) : x;
      Weight wc(*p.cpu, round_bf16(w), out, in), wg(*p.gpu, w, out, in);
      Buffer xc = to_buffer(*p.cpu, x_ref), xg = to_buffer(*p.gpu, x), bc = to_buffer(*p.cpu, b),
             bg = to_buffer(*p.gpu, b), yc(*p.cpu, size_t(n) * out), yg(*p.gpu, size_t(n) * out);
      p.cpu->linear(xc, wc, bias ? &bc : nullptr, n, in, out, yc);
      p.gpu->linear(xg, wg, bias ? &bg : nullptr, n, in, out, yg);
      check_close(from_buffer(*p.gpu, yg), from_buffer(*p.cpu, yc), 1e-4f);
      CHECK(wg.bytes() == size_t(out) * in * 2);
    }
  }

  SECTION("layernorm, gelu") {
    const int n = 5;
    for (int dim : {4544, 64, 100}) {
      auto x = uniform(size_t(n) * dim, rng, 3.0f);
      for (auto& v : x) v += 50.0f;  // a mean far from zero, as residual streams have
      const auto w = uniform(dim, rng), bias = uniform(dim, rng);
      Buffer xc = to_buffer(*p.cpu, x), xg = to_buffer(*p.gpu, x), wc = to_buffer(*p.cpu, w), wg = to_buffer(*p.gpu, w),
             bc = to_buffer(*p.cpu, bias), bg = to_buffer(*p.gpu, bias), yc(*p.cpu, x.size()), yg(*p.gpu, x.size());
      p.cpu->layernorm(xc, wc, bc, n - 1, dim, 1e-5f, yc, dim);  // with a row offset
      p.gpu->layernorm(xg, wg, bg, n - 1, dim, 1e-5f, yg, dim);
      auto a = from_buffer(*p.gpu, yg), b = from_buffer(*p.cpu, yc);
      a.resize(size_t(n - 1) * dim);
      b.resize(a.size());
      check_close(a, b, 1e-4f);
    }
    const size_t m = 100003;
    const auto g = uniform(m, rng, 8.0f);
    Buffer gc = to_buffer(*p.cpu, g), gg = to_buffer(*p.gpu, g), oc(*p.cpu, m), og(*p.gpu, m);
    p.cpu->gelu(gc, m, oc);
    p.gpu->gelu(gg, m, og);
    check_close(from_buffer(*p.gpu, og), from_buffer(*p.cpu, oc), 1e-6f);
  }

  SECTION("embed, rmsnorm, swiglu, add") {
    const int V = 1000, H = 576, n = 7;
    const auto table = uniform(size_t(V) * H, rng);
    Weight tc(*p.cpu, round_bf16(table), V, H), tg(*p.gpu, table, V, H);
    const std::vector<int32_t> ids = {0, 999, 5, 5, 123, 1, 998};
    Buffer ec(*p.cpu, size_t(n) * H), eg(*p.gpu, size_t(n) * H);
    p.cpu->embed(tc, ids, H, ec);
    p.gpu->embed(tg, ids, H, eg);
    CHECK(from_buffer(*p.gpu, eg) == from_buffer(*p.cpu, ec));

    for (int dim : {576, 4096, 100}) {
      const auto x = uniform(size_t(n) * dim, rng, 3.0f), w = uniform(dim, rng);
      Buffer xc = to_buffer(*p.cpu, x), xg = to_buffer(*p.gpu, x), wc = to_buffer(*p.cpu, w), wg = to_buffer(*p.gpu, w),
             yc(*p.cpu, x.size()), yg(*p.gpu, x.size());
      p.cpu->rmsnorm(xc, wc, n - 1, dim, 1e-5f, yc, dim);  // with a row offset
      p.gpu->rmsnorm(xg, wg, n - 1, dim, 1e-5f, yg, dim);
      auto a = from_buffer(*p.gpu, yg), b = from_buffer(*p.cpu, yc);
      a.resize(size_t(n - 1) * dim);
      b.resize(a.size());
      check_close(a, b, 1e-5f);  // fp32 sums on the GPU, double on the CPU
    }

    const size_t m = 100003;
    const auto g = uniform(m, rng, 8.0f), u = uniform(m, rng, 2.0f);
    Buffer gc = to_buffer(*p.cpu, g), gg = to_buffer(*p.gpu, g), uc = to_buffer(*p.cpu, u), ug = to_buffer(*p.gpu, u),
           oc(*p.cpu, m), og(*p.gpu, m);
    p.cpu->swiglu(gc, uc, m, oc);
    p.gpu->swiglu(gg, ug, m, og);
    check_close(from_buffer(*p.gpu, og), from_buffer(*p.cpu, oc), 1e-6f);
    p.cpu->add(gc, uc, m - 10, 0);
    p.gpu->add(gg, ug, m - 10, 0);
    CHECK(from_buffer(*p.gpu, gg) == from_buffer(*p.cpu, gc));
  }

  SECTION("rope, both layouts, positions up to 128K") {
    for (bool interleaved : {true, false}) {
      for (int d : {64, 128}) {
        std::vector<float> inv(d / 2);
        for (int i = 0; i < d / 2; ++i) inv[i] = static_cast<float>(std::pow(500000.0, -2.0 * i / d));
        p.cpu->set_rope(inv, interleaved);
        p.gpu->set_rope(inv, interleaved);
        const int n = 9, heads = 4;
        std::vector<int32_t> pos = {0, 1, 2, 100, 4095, 8191, 32767, 100000, 131071};
        const auto x = uniform(size_t(n) * heads * d, rng);
        Buffer xc = to_buffer(*p.cpu, x), xg = to_buffer(*p.gpu, x);
        p.cpu->rope(xc, n, heads, d, pos);
        p.gpu->rope(xg, n, heads, d, pos);
        check_close(from_buffer(*p.gpu, xg), from_buffer(*p.cpu, xc), 1e-6f);
      }
    }
  }

  SECTION("prefill attention and accumulated attention (bf16 tensor cores)") {
    // Lengths around the 128-query and 64-key tiles, GQA groups 1 to 8, both head dims.
    for (auto [n, hq, hkv, d] : {std::tuple{1, 4, 2, 64},
                                 {63, 4, 4, 64},
                                 {64, 9, 3, 64},
                                 {65, 8, 2, 128},
                                 {127, 2, 1, 128},
                                 {128, 4, 4, 64},
                                 {129, 8, 8, 128},
                                 {257, 12, 4, 64},
                                 {300, 4, 1, 128},
                                 {1000, 2, 2, 64},
                                 {2100, 32, 8, 128},
                                 {4097, 8, 1, 64}}) {
      INFO("n " << n << " hq " << hq << " hkv " << hkv << " d " << d);
      const auto q = uniform(size_t(n) * hq * d, rng, 2.0f), k = uniform(size_t(n) * hkv * d, rng),
                 v = uniform(size_t(n) * hkv * d, rng);
      auto run = [&](Backend& b, std::vector<float>& colsum) {
        // The output starts as NaN: a row the kernel fails to write fails the comparison.
        Buffer qb = to_buffer(b, q), kb = to_buffer(b, k), vb = to_buffer(b, v),
               ob = to_buffer(b, std::vector<float>(q.size(), NAN));
        b.attention_prefill(qb, kb, vb, n, hq, hkv, d, ob, &colsum);
        return from_buffer(b, ob);
      };
      std::vector<float> cs_cpu, cs_gpu;
      const auto oc = run(*p.cpu, cs_cpu), og = run(*p.gpu, cs_gpu);
      // bf16 inputs to both products: about 3 significant digits.
      check_close(og, oc, 1e-2f);
      check_close(cs_gpu, cs_cpu, 1e-2f);
    }
  }

  SECTION("prefill attention continued after a prefix (keys of the past rows first)") {
    // Pasts and new rows around the tiles: a past inside one key tile, on its edge, one new query,
    // fewer new queries than a tile, a long past with a short continuation.
    for (auto [past, n, hq, hkv, d] : {std::tuple{1, 1, 4, 2, 64},
                                       {5, 60, 4, 4, 64},
                                       {63, 65, 9, 3, 64},
                                       {64, 64, 8, 2, 128},
                                       {100, 1, 2, 1, 128},
                                       {130, 129, 8, 8, 128},
                                       {1000, 300, 12, 4, 64},
                                       {2047, 129, 32, 8, 128},
                                       {4097, 7, 8, 1, 64}}) {
      INFO("past " << past << " n " << n << " hq " << hq << " hkv " << hkv << " d " << d);
      const auto q = uniform(size_t(n) * hq * d, rng, 2.0f), k = uniform(size_t(n) * hkv * d, rng),
                 v = uniform(size_t(n) * hkv * d, rng), pk = uniform(size_t(past) * hkv * d, rng),
                 pv = uniform(size_t(past) * hkv * d, rng);
      auto run = [&](Backend& b, std::vector<float>& colsum) {
        Buffer qb = to_buffer(b, q), kb = to_buffer(b, k), vb = to_buffer(b, v),
               ob = to_buffer(b, std::vector<float>(q.size(), NAN));
        b.attention_prefill_continued(qb, kb, vb, {pk.data(), pv.data(), past}, n, hq, hkv, d, ob, &colsum);
        return from_buffer(b, ob);
      };
      std::vector<float> cs_cpu, cs_gpu;
      const auto oc = run(*p.cpu, cs_cpu), og = run(*p.gpu, cs_gpu);
      REQUIRE(cs_gpu.size() == size_t(hq) * (past + n));
      check_close(og, oc, 1e-2f);
      check_close(cs_gpu, cs_cpu, 1e-2f);
    }
  }
}

namespace {

// A cache mixing every segment format in each head, and the same cache for the CPU reference.
struct MixedCache {
  int hq, hc, d;
  std::shared_ptr<RopeTable> rope;
  LayerCache cache;

  MixedCache(int hq_, int hc_, int d_, bool interleaved, std::mt19937& rng)
      : hq(hq_), hc(hc_), d(d_), cache(hq_, hc_, d_) {
    std::vector<float> inv(d / 2);
    for (int i = 0; i < d / 2; ++i) inv[i] = static_cast<float>(std::pow(10000.0, -2.0 * i / d));
    rope = std::make_shared<RopeTable>(inv, interleaved ? RopeStyle::Interleaved : RopeStyle::NeoX);
    rope->ensure(4096);
    int32_t next = 0;
    auto positions = [&](int n) {
      std::vector<int32_t> p(n);
      for (auto& x : p) x = next++;
      return p;
    };
    for (int h = 0; h < hc; ++h) {
      next = 0;
      auto& segs = cache.segments(h);
      for (auto [kb, vb, kg] : {std::tuple{2, 4, 32}, {3, 2, 33}, {1, 1, 32}}) {
        const int n = kg * 2;
        auto k = uniform(size_t(n) * d, rng), v = uniform(size_t(n) * d, rng);
        auto s = std::make_unique<QuantizedSegment>(d, kb, vb, kg, 32);
        s->append(k.data(), v.data(), n, positions(n).data());
        segs.push_back(std::move(s));
      }
      const int nb = 200;
      const auto bk = uniform(size_t(nb) * d, rng), bv = uniform(size_t(nb) * d, rng);
      auto basis = std::make_shared<const LowRankBasis>(pca_basis(bk.data(), bv.data(), nb, d, d / 2));
      for (bool pre : {false, true}) {
        auto s = std::make_unique<LowRankSegment>(basis, d / 4, d / 2 - 3, !pre, pre ? rope : nullptr);
        const int n = pre ? 30 : 41;
        const auto pos = positions(n);
        for (int t = 0; t < n; ++t) s->append(bk.data() + size_t(t) * d, bv.data() + size_t(t) * d, pos[t]);
        segs.push_back(std::move(s));
      }
      auto est = std::make_shared<AffineValueEstimator>(d, uniform(size_t(d) * d, rng, 0.2f), uniform(d, rng));
      auto av = std::make_unique<ApproxValueSegment>(d, est, rope, h == 0);
      const auto pos = positions(23);
      const auto ak = uniform(size_t(23) * d, rng);
      for (int t = 0; t < 23; ++t) av->append(ak.data() + size_t(t) * d, pos[t]);
      segs.push_back(std::move(av));
      // A long dense tail (several kernel chunks), different per head.
      auto dense = std::make_unique<DenseSegment>(d);
      const int nd = 600 + 37 * h;
      const auto dk = uniform(size_t(nd) * d, rng), dv = uniform(size_t(nd) * d, rng);
      const auto dpos = positions(nd);
      for (int t = 0; t < nd; ++t) dense->append(dk.data() + size_t(t) * d, dv.data() + size_t(t) * d, dpos[t]);
      segs.push_back(std::move(dense));
    }
  }
};

void check_decode(Backend& gpu, const LayerCache& cache, std::mt19937& rng) {
  const int hq = cache.n_query_heads(), d = cache.head_dim();
  const auto q = uniform(size_t(hq) * d, rng, 2.0f);
  std::vector<float> ref(q.size());
  attend_ref(cache, q.data(), ref.data());
  Buffer qb = to_buffer(gpu, q), ob(gpu, q.size());
  gpu.attention_decode(cache, qb, ob);
  check_close(from_buffer(gpu, ob), ref, 2e-5f);
}

}  // namespace

TEST_CASE("CUDA decode attention over every segment format equals the CPU reference", "[cuda]") {
  if (!have_gpu()) return;
  auto gpu = make_cuda_backend();
  std::mt19937 rng(7);
  for (auto [hq, hc, d, interleaved] :
       {std::tuple{8, 2, 64, true}, {9, 3, 64, false}, {32, 8, 128, false}, {4, 4, 128, true}}) {
    INFO("hq " << hq << " cache heads " << hc << " d " << d << " interleaved " << interleaved);
    MixedCache m(hq, hc, d, interleaved, rng);
    std::vector<float> inv(m.rope->inv_freq().begin(), m.rope->inv_freq().end());
    gpu->set_rope(inv, interleaved);
    check_decode(*gpu, m.cache, rng);
    // Tokens appended to the dense tails travel as increments.
    for (int step = 0; step < 40; ++step) {
      const auto k = uniform(size_t(hc) * d, rng), v = uniform(size_t(hc) * d, rng);
      m.cache.append(k.data(), v.data(), 5000 + step);
      if (step % 13 == 0) check_decode(*gpu, m.cache, rng);
    }
    check_decode(*gpu, m.cache, rng);
    // A restructured cache (a token evicted, a segment dropped) is sent again.
    static_cast<DenseSegment&>(*m.cache.segments(0).back()).erase(3);
    m.cache.segments(hc - 1).erase(m.cache.segments(hc - 1).begin());
    check_decode(*gpu, m.cache, rng);
  }
}

namespace {

// Logits of a prompt and a few greedy steps on one backend.
struct Run {
  std::vector<std::vector<float>> logits;
  std::vector<int32_t> tokens;
};

Run run_model(const ModelFile& m, const std::string& backend, const std::vector<int32_t>& prompt, int steps) {
  Engine e(m, {backend});
  Run r;
  auto lg = e.prefill(prompt);
  for (int s = 0; s < steps; ++s) {
    const auto next = static_cast<int32_t>(std::max_element(lg.begin(), lg.end()) - lg.begin());
    r.logits.push_back(lg);
    r.tokens.push_back(next);
    lg = e.decode(next);
  }
  return r;
}

// Two layers of a random-weight model of a known shape (bf16 weights, a 4,096-token vocabulary).
std::unique_ptr<ModelFile> two_layer_model(const TempDir& dir, const std::string& shape, uint64_t seed) {
  ModelShape s = model_shape(shape);
  s.layers = 2;
  s.vocab = 4096;
  const std::string path = (dir / ("kvbench_random_" + shape + "_2l.gguf")).string();
  write_random_model(path, s, DType::BF16, seed);
  return ModelFile::open(path);
}

// Two layers of a random-weight model of a known shape (bf16 weights), a 700-token prompt and four
// greedy steps on both backends: bf16 activations into the GEMMs and bf16 attention in prefill keep the
// GPU's logits within 2% of the largest.
void check_random_model(const std::string& shape, uint64_t seed) {
  const TempDir dir("random_" + shape);
  auto m = two_layer_model(dir, shape, seed);
  std::mt19937 rng(static_cast<uint32_t>(seed));
  std::vector<int32_t> prompt(700);
  for (auto& t : prompt) t = static_cast<int32_t>(rng() % 4096);
  const Run cpu = run_model(*m, "cpu", prompt, 4), gpu = run_model(*m, "cuda", prompt, 4);
  for (size_t i = 0; i < cpu.logits.size(); ++i) {
    INFO("step " << i);
    check_close(gpu.logits[i], cpu.logits[i], 2e-2f);
  }
}

}  // namespace

TEST_CASE("CUDA engine: random-weight Llama-3-8B-shaped layers match the CPU", "[cuda]") {
  if (have_gpu()) check_random_model("llama3-8b", 11);
}

TEST_CASE("CUDA engine: random-weight Falcon-7B-shaped layers (LayerNorm, GELU, parallel block, MQA) match the CPU",
          "[cuda]") {
  if (have_gpu()) check_random_model("falcon-7b", 13);
}

TEST_CASE("CUDA engine: a prefill continued from a prefix's capture equals the whole prompt's", "[cuda]") {
  if (!have_gpu()) return;
  const TempDir dir("continued_llama3-8b");
  auto m = two_layer_model(dir, "llama3-8b", 21);
  Engine e(*m, {"cuda"});
  REQUIRE(e.continues_prefill());
  std::mt19937 rng(21);
  std::vector<int32_t> ids(700);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 4096);
  const PrefillNeeds needs{.window = 16, .k_pre_rope = true, .attn_colsum = true};
  const PrefillCapture whole = e.prefill_capture(ids, needs);
  // bf16 attention as the whole prompt's, tile by tile; but the projections take other paths (cuBLAS on
  // bf16 activations for many rows, the fp32-activation GEMV for up to four), so roundings differ: within
  // 2% of the largest value, as CPU against GPU (an indexing mistake is far larger).
  auto check_same = [&](const PrefillCapture& c) {
    REQUIRE(c.n_tokens == whole.n_tokens);
    for (size_t l = 0; l < whole.k.size(); ++l) {
      INFO("layer " << l);
      check_close(c.k[l], whole.k[l], 2e-2f);
      check_close(c.v[l], whole.v[l], 2e-2f);
      check_close(c.k_pre_rope[l], whole.k_pre_rope[l], 2e-2f);
      check_close(c.q_window[l], whole.q_window[l], 2e-2f);
      check_close(c.attn_colsum[l], whole.attn_colsum[l], 2e-2f);
    }
    check_close(c.logits, whole.logits, 2e-2f);
  };
  for (int split : {1, 130, 690, 699}) {
    INFO("prefix of " << split);
    const PrefillCapture prefix = e.prefill_capture(std::span(ids).first(size_t(split)), needs);
    check_same(e.prefill_capture(ids, needs, nullptr, &prefix));
  }
  const PrefillCapture a = e.prefill_capture(std::span(ids).first(200), needs);
  const PrefillCapture b = e.prefill_capture(std::span(ids).first(450), needs, nullptr, &a);
  check_same(e.prefill_capture(ids, needs, nullptr, &b));
}

TEST_CASE("CUDA engine: the default model's greedy continuations equal the CPU's", "[cuda]") {
  if (!have_gpu()) return;
  const auto path = model_file(kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  auto tok = load_tokenizer(*m);
  const std::vector<std::string> prompts = {"The capital of France is",
                                            "def fibonacci(n):", "Once upon a time, in a small village,",
                                            "The three primary colors are", "Water boils at a temperature of"};
  double worst = 0;
  for (const auto& text : prompts) {
    INFO(text);
    const auto ids = tok->encode(text, true);
    const Run cpu = run_model(*m, "cpu", ids, 12), gpu = run_model(*m, "cuda", ids, 12);
    CHECK(gpu.tokens == cpu.tokens);
    for (size_t i = 0; i < cpu.logits.size(); ++i)
      worst = std::max(worst, double(max_abs_diff(gpu.logits[i], cpu.logits[i]) / max_abs(cpu.logits[i])));
  }
  WARN("worst logit difference CPU vs CUDA: " << worst << " of max |logit|");
  CHECK(worst < 2e-2);
}
