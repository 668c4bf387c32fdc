// MixedDimKV and MixedDimKV-H: the unit-test invariants of README.md §10, the scorer against
// its dense double-precision reference, the allocator against brute force, and the kept widths against
// an independent Python reference on real prompts of the default model.
#include <algorithm>
#include <cmath>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "harness/cache/lowrank_segment.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/method.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/hash.hpp"
#include "methods/mixeddimkv/width_allocation.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"
#include "width_fixture.hpp"

using namespace kvb;

// The synthetic layers of the registry tests have 16-dimensional heads (and no HeadKV profile).
const bool test_params_registered = test::register_method_test_params("mixeddimkv", {{"widths", "0,0.5,1"}});
const bool h_test_params_registered =
    test::register_method_test_params("mixeddimkv_h", {{"scores", "uniform"}, {"widths", "0,0.5,1"}});
using kvb::test::SyntheticLayer;

namespace {

// Random loss tables (continuous, so no two items share a breakpoint), optionally non-monotone.
std::vector<HeadLosses> random_losses(int heads, int tokens, int widths, uint32_t seed, bool monotone) {
  std::mt19937 rng(seed);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  std::vector<HeadLosses> out(heads);
  for (auto& h : out) {
    h.tokens = tokens;
    h.widths = widths;
    h.loss.resize(size_t(tokens) * widths);
    for (int t = 0; t < tokens; ++t) {
      double x = 1 + 3 * u(rng);
      for (int j = 0; j < widths; ++j) {
        h.loss[size_t(t) * widths + j] = j + 1 == widths ? 0.0 : x;
        x = monotone ? x * u(rng) : 4 * u(rng);
      }
    }
  }
  return out;
}

std::vector<const HeadLosses*> ptrs(const std::vector<HeadLosses>& v) {
  std::vector<const HeadLosses*> p;
  for (const auto& h : v) p.push_back(&h);
  return p;
}

const std::vector<double> kRho = {0, 0.125, 0.25, 1};

}  // namespace

TEST_CASE("mixeddimkv: width sets parse, snap to multiples of 8 and must hold 0 and 100%", "[mixeddimkv]") {
  const WidthSet ws = parse_widths("0,0.125,0.25,1", 128);
  CHECK(ws.dims == std::vector<int>{0, 16, 32, 128});
  CHECK(ws.r_max == 32);
  CHECK(parse_widths("1, 0.25,0", 64).dims == std::vector<int>{0, 16, 64});
  CHECK(parse_widths("0,0.1,1", 96).dims == std::vector<int>{0, 8, 96});  // 9.6 -> 8 (README.md §2)
  CHECK(parse_widths("0,1", 64).r_max == 0);
  test::require_error([] { parse_widths("0.125,0.25,1", 128); }, {"'widths'", "must include 0", "1"});
  test::require_error([] { parse_widths("0,0.125,0.25", 128); }, {"'widths'", "must include 0"});
  test::require_error([] { parse_widths("0,0.01,1", 128); }, {"'widths'", "0.01", "0 of 128"});
  test::require_error([] { parse_widths("0,abc,1", 128); }, {"'widths'", "'abc'"});
  test::require_error([] { parse_widths("0,0.1,0.12,1", 128); }, {"same width"});
  // Found by an audit: a head size not a multiple of 8 let a width past D - 8 through (16 of 20).
  test::require_error([] { parse_widths("0,0.9,1", 20); }, {"'widths'", "16 of 20", "8 to 12"});
}

TEST_CASE("mixeddimkv: PCA bases are orthonormal, nested and match the Jacobi reference", "[mixeddimkv]") {
  // Data with distinct variances per direction (inv. 6): compare projectors, signs are arbitrary.
  const int n = 400, d = 32;
  std::mt19937 rng(3);
  std::normal_distribution<float> nd(0, 1);
  std::vector<float> k(size_t(n) * d), v(size_t(n) * d);
  for (int t = 0; t < n; ++t)
    for (int c = 0; c < d; ++c) {
      k[size_t(t) * d + c] = nd(rng) * float(d - c);
      v[size_t(t) * d + c] = nd(rng) * (1.0f + 0.5f * float(c));
    }
  const LowRankBasis b = pca_basis(k.data(), v.data(), n, d, 16), r = pca_basis_ref(k.data(), v.data(), n, d, 16);
  for (const auto* P : {&b.k, &b.v}) {
    for (int a = 0; a < 16; ++a)
      for (int c = 0; c < 16; ++c) {
        double dot = 0;
        for (int i = 0; i < d; ++i) dot += double((*P)[size_t(i) * 16 + a]) * (*P)[size_t(i) * 16 + c];
        REQUIRE(dot == Approx(a == c ? 1.0 : 0.0).margin(1e-5));
      }
  }
  // Projectors onto the first r columns agree for every nested rank.
  for (int rank : {4, 8, 16})
    for (auto [P, R] : {std::pair{&b.k, &r.k}, std::pair{&b.v, &r.v}})
      for (int i = 0; i < d; ++i)
        for (int j = 0; j < d; ++j) {
          double x = 0, y = 0;
          for (int c = 0; c < rank; ++c) {
            x += double((*P)[size_t(i) * 16 + c]) * (*P)[size_t(j) * 16 + c];
            y += double((*R)[size_t(i) * 16 + c]) * (*R)[size_t(j) * 16 + c];
          }
          REQUIRE(x == Approx(y).margin(1e-4));
        }
}

TEST_CASE("mixeddimkv: the scorer equals its dense double reference, rho=0 and rho=1 losses (inv. 10)",
          "[mixeddimkv]") {
  SyntheticLayer L(160, 4, 2, 16, 12, 21);
  const WidthSet ws = parse_widths("0,0.5,1", 16);
  for (GqaMode mode : {GqaMode::Native, GqaMode::Repeat}) {
    const auto slices = head_slices(L.view, mode, 12);
    const auto bases = head_bases(L.view, mode, ws.r_max);
    CHECK(slices.size() == (mode == GqaMode::Native ? 2u : 4u));
    for (size_t s = 0; s < slices.size(); ++s) {
      const HeadLosses fast = width_losses(slices[s], 160, 16, 12, bases[s].get(), ws);
      const HeadLosses ref = width_losses_ref(slices[s], 160, 16, 12, bases[s].get(), ws);
      REQUIRE(fast.tokens == 148);
      for (size_t i = 0; i < fast.loss.size(); ++i)
        REQUIRE(fast.loss[i] == Approx(ref.loss[i]).epsilon(1e-4).margin(1e-6));
      // rho = 0: 2 sum_i P[i,t] |V_t|, from the window scorer's attention (sum over the rows).
      const auto P = window_attention_scores_ref(L.view, 12, WindowReduce::Sum);
      const int G = mode == GqaMode::Native ? 2 : 1;
      for (int t = 0; t < 148; ++t) {
        double colsum = 0;
        for (int g = 0; g < G; ++g) colsum += P[mode == GqaMode::Native ? s * 2 + g : s][t];
        double vn = 0;
        const int kv = mode == GqaMode::Native ? int(s) : int(s) / 2;
        for (int c = 0; c < 16; ++c)
          vn += double(L.v[(size_t(t) * 2 + kv) * 16 + c]) * L.v[(size_t(t) * 2 + kv) * 16 + c];
        REQUIRE(fast.loss[size_t(t) * 3] == Approx(2 * colsum * std::sqrt(vn)).epsilon(1e-4));
        REQUIRE(fast.loss[size_t(t) * 3 + 2] == 0.0);
      }
    }
  }
  // A full-rank basis reconstructs exactly: its loss is 0 (inv. 6).
  const auto slices = head_slices(L.view, GqaMode::Native, 12);
  const auto full = head_bases(L.view, GqaMode::Native, 16);
  WidthSet whole;
  whole.rho = {0, 0.99, 1};
  whole.dims = {0, 16, 16};
  whole.r_max = 16;
  const HeadLosses l = width_losses(slices[0], 160, 16, 12, full[0].get(), whole);
  double evict = 0, rebuilt = 0;  // up to float rounding of the rotated logits
  for (int t = 0; t < l.tokens; ++t) {
    evict += l.loss[size_t(t) * 3];
    rebuilt += l.loss[size_t(t) * 3 + 1];
  }
  CHECK(rebuilt < 1e-4 * evict);
}

TEST_CASE("mixeddimkv: allocation stays in budget, within one unit of it, C(lambda) non-increasing (inv. 2-3)",
          "[mixeddimkv]") {
  for (bool monotone : {true, false}) {
    const auto heads = random_losses(3, 200, 4, monotone ? 5 : 6, monotone);
    const auto p = ptrs(heads);
    double prev = 1e300;
    for (double lambda = 0; lambda < 60; lambda += 0.37) {
      const double c = width_cost(p, kRho, lambda);
      REQUIRE(c <= prev);
      prev = c;
    }
    for (double B : {0.0, 7.5, 40.0, 123.25, 300.0, 599.0, 600.0}) {
      const WidthAllocation a = allocate_widths(p, kRho, B, false);
      REQUIRE(a.cost <= B + 1e-12);
      if (B < 600) REQUIRE(B - a.cost < 1.0);  // the largest single jump is rho_m - rho_0 = 1
      const WidthAllocation t = allocate_widths(p, kRho, B, true);
      REQUIRE(t.cost <= B + 1e-9);
      REQUIRE(t.cost >= a.cost);
      REQUIRE(t.primal <= a.primal);
      REQUIRE(a.primal >= a.dual - 1e-9);  // weak duality
    }
  }
}

TEST_CASE("mixeddimkv: the Lagrangian allocation against brute force (inv. 4)", "[mixeddimkv]") {
  int exact = 0, trials = 0;
  for (uint32_t seed = 1; seed <= 60; ++seed) {
    const auto heads = random_losses(1, 6, 4, seed, seed % 2 == 0);
    const auto p = ptrs(heads);
    for (double B : {0.5, 1.25, 2.0, 3.375}) {
      const WidthAllocation a = allocate_widths(p, kRho, B, false);
      double best = 1e300;
      for (int code = 0; code < 4096; ++code) {  // 4^6 assignments
        double cost = 0, loss = 0;
        for (int t = 0, c = code; t < 6; ++t, c /= 4) {
          cost += kRho[c % 4];
          loss += heads[0].loss[size_t(t) * 4 + c % 4];
        }
        if (cost <= B + 1e-12) best = std::min(best, loss);
      }
      REQUIRE(a.primal >= best - 1e-12);
      ++trials;
      if (std::abs(a.cost - B) < 1e-12) {
        REQUIRE(a.primal == Approx(best).epsilon(1e-12));
        ++exact;
      }
    }
  }
  CHECK(trials == 240);
  CHECK(exact > 0);
}

TEST_CASE("mixeddimkv: a power-of-two scale of every loss leaves the allocation unchanged (inv. 5)", "[mixeddimkv]") {
  const auto heads = random_losses(2, 150, 4, 9, false);
  auto scaled = heads;
  for (auto& h : scaled)
    for (auto& x : h.loss) x *= 1024.0;
  for (double B : {10.0, 55.5, 140.0}) {
    const auto a = allocate_widths(ptrs(heads), kRho, B, true), b = allocate_widths(ptrs(scaled), kRho, B, true);
    CHECK(a.width == b.width);
    CHECK(b.lambda == a.lambda * 1024.0);
  }
}

TEST_CASE("mixeddimkv: {0, 100%} is eviction by sum_i P |V|, per layer and per head (inv. 1)", "[mixeddimkv]") {
  SyntheticLayer L(240, 6, 2, 16, 8, 13);
  const WidthSet ws = parse_widths("0,1", 16);
  const auto slices = head_slices(L.view, GqaMode::Native, 8);
  std::vector<HeadLosses> losses;
  for (const auto& s : slices) losses.push_back(width_losses(s, 240, 16, 8, nullptr, ws));
  const int T = 40, prefix = 232;
  // Joint: the Hkv (T - w) items with the largest loss at width 0 are the ones kept.
  std::vector<std::pair<double, int>> items;
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < prefix; ++t) items.push_back({losses[h].loss[size_t(t) * 2], h * prefix + t});
  std::sort(items.begin(), items.end(), std::greater<>());
  std::set<int> want;
  for (int i = 0; i < 2 * (T - 8); ++i) want.insert(items[i].second);
  const auto a = allocate_widths(ptrs(losses), ws.rho, 2.0 * (T - 8), false);
  std::set<int> got;
  for (int h = 0; h < 2; ++h)
    for (int t = 0; t < prefix; ++t)
      if (a.width[h][t] == 1) got.insert(h * prefix + t);
  CHECK(got == want);
  // Per head: the top cap of the same score.
  const auto one = allocate_widths({&losses[1]}, ws.rho, 17, false);
  std::vector<float> sc(prefix);
  for (int t = 0; t < prefix; ++t) sc[t] = float(losses[1].loss[size_t(t) * 2]);
  const auto top = top_k_sorted(sc, 17);
  std::vector<int32_t> kept;
  for (int t = 0; t < prefix; ++t)
    if (one.width[0][t] == 1) kept.push_back(t);
  CHECK(kept == top);
}

TEST_CASE("mixeddimkv: ties at the cut are restored only by the greedy top-up (inv. 1)", "[mixeddimkv]") {
  HeadLosses h{6, 2, {5, 0, 3, 0, 3, 0, 3, 0, 1, 0, 0.5, 0}};  // three items tied at 3
  const std::vector<double> rho = {0, 1};
  const auto plain = allocate_widths({&h}, rho, 3, false), topped = allocate_widths({&h}, rho, 3, true);
  CHECK(plain.cost == 1);  // the tied items all drop
  CHECK(topped.cost == 3);
  CHECK(topped.width[0] == std::vector<int>{1, 1, 1, 0, 0, 0});  // tied items by index
}

TEST_CASE("mixeddimkv: the mixed cache attends like its dense reconstruction, in any order (inv. 7-8)",
          "[mixeddimkv]") {
  SyntheticLayer L(200, 4, 2, 16, 8, 17);
  const WidthSet ws = parse_widths("0,0.5,1", 16);
  const auto bases = head_bases(L.view, GqaMode::Native, 8);
  std::mt19937 rng(2);
  std::vector<std::vector<int>> width(2, std::vector<int>(192));
  for (auto& h : width)
    for (auto& x : h) x = int(rng() % 3);
  const LayerCache c = build_mixed_cache(L.view, GqaMode::Native, 8, ws, bases, width);
  std::vector<float> q(size_t(4) * 16);
  for (auto& x : q) x = float(int(rng() % 200) - 100) / 50.0f;
  std::vector<float> fast(q.size()), ref(q.size());
  attend(c, q.data(), fast.data());
  attend_ref(c, q.data(), ref.data());
  // The dense reference: every kept token reconstructed to width 16, in reverse order.
  LayerCache dense(4, 2, 16);
  for (int s = 0; s < 2; ++s) {
    std::vector<std::tuple<int32_t, std::vector<float>, std::vector<float>>> rows;
    for (const auto& seg : c.segments(s)) {
      std::vector<float> k, v;
      if (auto* lr = dynamic_cast<const LowRankSegment*>(seg.get())) {
        lr->reconstruct(k, v);
      } else {
        auto* ds = dynamic_cast<const DenseSegment*>(seg.get());
        k.assign(ds->k(), ds->k() + ds->size() * 16);
        v.assign(ds->v(), ds->v() + ds->size() * 16);
      }
      for (size_t t = 0; t < seg->size(); ++t)
        rows.emplace_back(seg->positions()[t], std::vector<float>(k.begin() + t * 16, k.begin() + (t + 1) * 16),
                          std::vector<float>(v.begin() + t * 16, v.begin() + (t + 1) * 16));
    }
    std::reverse(rows.begin(), rows.end());
    auto seg = std::make_unique<DenseSegment>(16);
    for (auto& [p, k, v] : rows) seg->append(k.data(), v.data(), p);
    dense.segments(s).push_back(std::move(seg));
  }
  std::vector<float> recon(q.size());
  attend(dense, q.data(), recon.data());
  for (size_t i = 0; i < q.size(); ++i) {
    REQUIRE(fast[i] == Approx(ref[i]).margin(1e-5));
    REQUIRE(fast[i] == Approx(recon[i]).margin(1e-5));
  }
  // Bytes: coefficients at each width, dense rows, one basis per head that uses it.
  size_t tokens8 = 0, full = 0;
  for (const auto& h : width)
    for (int x : h) tokens8 += x == 1, full += x == 2;
  CHECK(c.bytes() == (tokens8 * 2 * 8 + (full + 16) * 2 * 16 + 2 * 2 * 16 * 8) * sizeof(float));
}

TEST_CASE("mixeddimkv and mixeddimkv_h: bytes within budget, widths logged, errors", "[mixeddimkv]") {
  SyntheticLayer L(400, 6, 2, 16, 8, 23);
  L.cfg.n_layers = 3;
  auto& reg = MethodRegistry::get();
  for (const char* name : {"mixeddimkv", "mixeddimkv_h"})
    for (const char* gqa : {"native", "repeat"})
      for (int T : {32, 48, 100}) {
        INFO(name << " " << gqa << " T=" << T);
        std::map<std::string, std::string> params = {{"widths", "0,0.5,1"}, {"gqa", gqa}};
        if (std::string(name) == "mixeddimkv_h") params["scores"] = "uniform";
        auto m = reg.create(name, params, L.cfg);
        MethodRunner r(*m, T);
        for (int l = 0; l < 3; ++l) {
          L.view.layer = l;
          LayerCache c(6, 2, 16);
          r.on_layer(L.view, c);
          if (std::string(name) == "mixeddimkv") REQUIRE(c.bytes() <= r.budget().bytes_per_layer);
        }
        REQUIRE(r.prefill_kv_bytes() <= 3 * r.budget().bytes_per_layer);
        const auto prof = r.cache_profile();
        REQUIRE(prof["layers"].size() == 3);
        const auto& w = prof["layers"][0]["widths"];
        const size_t stored = std::string(gqa) == "native" ? 2 : 6;
        REQUIRE(w["0"].get<size_t>() + w["8"].get<size_t>() + w["16"].get<size_t>() == stored * 392);
        REQUIRE(prof["layers"][0]["gap"].get<double>() >= -1e-9);
      }
  auto m = reg.create("mixeddimkv", {{"widths", "0,0.5,1"}, {"window", "30"}}, L.cfg);
  MethodRunner r(*m, 36);
  LayerCache c(6, 2, 16);
  test::require_error([&] { r.on_layer(L.view, c); }, {"KV size 36", "6 units", "8 units", "widths=0,1"});
  test::require_error([&] { reg.create("mixeddimkv", {{"widths", "0.5,1"}}, L.cfg); }, {"'widths'", "must include 0"});
}

namespace {

// Records the widths the wrapped runner's caches keep at some layers.
}  // namespace

TEST_CASE("mixeddimkv and headkv: kept widths equal the independent Python reference on real prompts",
          "[mixeddimkv][headkv][model]") {
  // methods/mixeddimkv/reference.py recomputed every (head, token) width of MixedDimKV and the
  // kept sets of HeadKV from the tensors kvbench dumped, for NIAH prompts of 1K-8K tokens; the fixture
  // holds hashes of its widths. Here the prompts up to 3K are rerun (the longer ones stay out of CI's
  // time; the script's counts cover all six).
  const auto r = test::width_fixture_agreement(
      "methods/mixeddimkv/fixtures/reference.json", 3000,
      {{"headkv", {{"scores", test::source_path("methods/mixeddimkv/fixtures/headkv_scores.json")}}}});
  if (r.runs == 0) return;
  CHECK(r.runs == 12);
  INFO(r.same << " of " << r.heads << " (prompt, layer, head) width rows equal the reference");
  CHECK(r.same == r.heads);
}
