// Page-level eviction (harness/method/paging.hpp) and the paged H2O built on it.
#include <algorithm>
#include <random>

#include "harness/engine/engine.hpp"
#include "harness/method/method.hpp"
#include "harness/method/paging.hpp"
#include "harness/model/model_file.hpp"
#include "harness/model/random_model.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"

using namespace kvb;
using test::SyntheticLayer;

TEST_CASE("paging: the pages to evict against the reference, and OpenVINO's limits", "[paging]") {
  std::mt19937 rng(5);
  std::uniform_real_distribution<double> u(0.0, 1.0);
  for (bool norm : {false, true})
    for (int P : {1, 4, 32}) {
      const PagingConfig c{.page = P, .start = P, .recent = 2 * P, .middle = 3 * P, .norm_sum = norm};
      const size_t limit = size_t(c.start + c.middle + c.recent + P - 1);
      for (size_t L = 1; L < limit + 5 * size_t(P); L += size_t(std::max(1, P / 3))) {
        INFO("P " << P << " L " << L << " norm " << norm);
        PageScores s;
        for (size_t t = 0; t < L; ++t) {
          // Coarse values, so that pages tie and the tie rule (the lower page goes first) is exercised.
          s.score.push_back(std::floor(u(rng) * 3));
          s.rows.push_back(double(L - t));
        }
        const auto gone = s.to_evict(c);
        CHECK(gone == pages_to_evict_ref(s, c));
        CHECK(gone.empty() == (L <= limit));
        // What is left: at most the limit, never the start or the recent full pages or the last one.
        PageScores left = s;
        left.erase_pages(gone, P);
        if (!gone.empty()) CHECK(left.score.size() <= limit);
        for (int p : gone) {
          CHECK(p * P >= c.start);
          CHECK(size_t(p + 1) * P + c.recent <= L - L % size_t(P));
        }
      }
    }
  test::require_error([] { PagingConfig{.page = 32, .start = 32, .recent = 100, .middle = 512}.check("h2o"); },
                      {"h2o", "recent (window) = 100", "multiple of the page size 32"});
}

TEST_CASE("paged H2O keeps the top pages by attention summed over the layer's heads", "[paging][methods]") {
  // S = 64 tokens, pages of 8: start 8, recent 16, middle 16 -> the prompt keeps 8 + 16 + 16 and the
  // two best of the five evictable pages [1, 6).
  SyntheticLayer L(64, 4, 2, 8, 64, 3, 0.0f);
  std::vector<float> col(size_t(4) * 64, 0.01f);
  // Head 0 favours page 2, head 3 page 4; page 5 gets a little from every head.
  for (int t = 16; t < 24; ++t) col[size_t(0) * 64 + t] = 1.0f;
  for (int t = 32; t < 40; ++t) col[size_t(3) * 64 + t] = 0.9f;
  for (int h = 0; h < 4; ++h)
    for (int t = 40; t < 48; ++t) col[size_t(h) * 64 + t] = 0.2f;
  L.view.attn_colsum = col.data();
  auto m = MethodRegistry::get().create("h2o", {{"window", "16"}, {"paging", "8"}, {"start", "8"}}, L.cfg);
  MethodRunner r(*m, 16);
  LayerCache c(4, 2, 8);
  r.on_layer(L.view, c);
  std::vector<int32_t> expect;
  for (int t = 0; t < 8; ++t) expect.push_back(t);
  for (int t = 16; t < 24; ++t) expect.push_back(t);
  for (int t = 32; t < 40; ++t) expect.push_back(t);
  for (int t = 48; t < 64; ++t) expect.push_back(t);
  for (int h = 0; h < 2; ++h) {
    const auto pos = c.segments(h)[0]->positions();
    CHECK(std::vector<int32_t>(pos.begin(), pos.end()) == expect);
  }
  test::require_error(
      [&] {
        MethodRegistry::get().create("h2o", {{"paging", "8"}, {"decode_eviction", "true"}}, L.cfg);
      },
      {"drop decode_eviction"});
  test::require_error(
      [&] {
        auto k = MethodRegistry::get().create("kvcrush", {{"base", "h2o"}, {"base.paging", "8"}}, L.cfg);
        MethodRunner rk(*k, 16);
        LayerCache ck(4, 2, 8);
        rk.on_layer(L.view, ck);
      },
      {"also evicts during decoding"});
}

TEST_CASE("paged H2O during decoding: whole pages, layer-wide, within start + T + recent + P - 1", "[paging][model]") {
  const test::TempDir dir("paging");
  auto model = ModelFile::open(test::tiny_random_model(dir, "llama", 2));
  Engine e(*model);
  std::vector<int32_t> ids(150);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((7 * i + 3) % 300);
  const int P = 8, start = 8, recent = 16, T = 32;
  for (const char* gqa : {"native", "repeat"})
    for (const char* mode : {"sum", "norm_sum"}) {
      INFO(gqa << " " << mode);
      auto m = MethodRegistry::get().create("h2o",
                                            {{"window", std::to_string(recent)},
                                             {"paging", std::to_string(P)},
                                             {"start", std::to_string(start)},
                                             {"page_scores", mode},
                                             {"gqa", gqa}},
                                            e.config());
      MethodRunner runner(*m, T);
      e.prefill(ids, &runner);
      int32_t next = 150;
      for (int step = 0; step < 40; ++step) {
        e.decode((step * 11) % 300);
        ++next;
        for (const auto& c : e.caches()) {
          const auto first = c.segments(0)[0]->positions();
          const std::vector<int32_t> pos(first.begin(), first.end());
          REQUIRE(pos.size() <= size_t(start + T + recent + P - 1));
          for (int h = 1; h < c.n_cache_heads(); ++h) {  // layer-wide: every head the same tokens
            const auto p = c.segments(h)[0]->positions();
            REQUIRE(std::vector<int32_t>(p.begin(), p.end()) == pos);
          }
          for (int32_t t = 0; t < start; ++t) CHECK(pos[size_t(t)] == t);
          CHECK(pos.back() == next - 1);
          // Every full page holds P consecutive positions: pages go whole.
          for (size_t b = 0; b + P <= pos.size(); b += P) CHECK(pos[b + P - 1] - pos[b] == P - 1);
        }
      }
    }
}

TEST_CASE("paged KVCrush: H2O's share by page score, representative pages among the rest", "[paging][kvcrush]") {
  SyntheticLayer L(64, 4, 2, 8, 64, 3, 0.0f);
  std::vector<float> col(size_t(4) * 64, 0.01f);
  for (int t = 16; t < 24; ++t) col[size_t(0) * 64 + t] = 1.0f;  // page 2: H2O's best
  for (int t = 32; t < 40; ++t) col[size_t(3) * 64 + t] = 0.9f;  // page 4: second
  L.view.attn_colsum = col.data();
  auto kept = [&](const char* ratio) {
    auto m = MethodRegistry::get().create(
        "kvcrush",
        {{"base", "h2o"}, {"base.window", "16"}, {"paging", "8"}, {"start", "8"}, {"ratio", ratio}, {"anchor", "mean"}},
        L.cfg);
    MethodRunner r(*m, 16);
    LayerCache c(4, 2, 8);
    r.on_layer(L.view, c);
    const auto p0 = c.segments(0)[0]->positions(), p1 = c.segments(1)[0]->positions();
    CHECK(std::vector<int32_t>(p0.begin(), p0.end()) == std::vector<int32_t>(p1.begin(), p1.end()));
    return std::vector<int32_t>(p0.begin(), p0.end());
  };
  // ratio 0: paged H2O's pages 2 and 4; ratio 0.5: page 2 by score and one representative of pages
  // {1, 3, 4, 5}.
  const auto h2o = kept("0");
  CHECK(h2o.size() == 8 + 16 + 16);
  CHECK(std::count(h2o.begin(), h2o.end(), 16) == 1);
  CHECK(std::count(h2o.begin(), h2o.end(), 32) == 1);
  const auto crush = kept("0.5");
  CHECK(crush.size() == 8 + 16 + 16);
  CHECK(std::count(crush.begin(), crush.end(), 16) == 1);
  int reps = 0;
  for (int pg : {1, 3, 4, 5}) reps += static_cast<int>(std::count(crush.begin(), crush.end(), pg * 8));
  CHECK(reps == 1);
  test::require_error(
      [&] {
        MethodRegistry::get().create("kvcrush", {{"base", "snapkv"}, {"paging", "8"}}, L.cfg);
      },
      {"kvcrush paging", "base=h2o", "snapkv"});
}

TEST_CASE("paged KVCrush during decoding: ratio 0 is paged H2O, whole pages within the limit", "[paging][kvcrush]") {
  const test::TempDir dir("paging_kvcrush");
  auto model = ModelFile::open(test::tiny_random_model(dir, "llama", 2));
  Engine e(*model);
  std::vector<int32_t> ids(150);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = int32_t((7 * i + 3) % 300);
  const int P = 8, T = 32;
  auto run = [&](const std::string& method, std::map<std::string, std::string> params) {
    auto m = MethodRegistry::get().create(method, params, e.config());
    MethodRunner runner(*m, T);
    e.prefill(ids, &runner);
    std::vector<std::vector<int32_t>> trace;
    for (int step = 0; step < 30; ++step) {
      e.decode((step * 11) % 300);
      for (const auto& c : e.caches()) {
        const auto p = c.segments(0)[0]->positions();
        trace.emplace_back(p.begin(), p.end());
        REQUIRE(p.size() <= size_t(8 + T + 16 + P - 1));
        for (int h = 1; h < c.n_cache_heads(); ++h) {
          const auto q = c.segments(h)[0]->positions();
          REQUIRE(std::vector<int32_t>(q.begin(), q.end()) == trace.back());
        }
        for (size_t b = 0; b + P <= p.size(); b += P) CHECK(p[b + P - 1] - p[b] == P - 1);
      }
    }
    return trace;
  };
  // A prompt within the KV size still starts the scores: decoding then evicts by them.
  for (const char* method : {"h2o", "kvcrush"}) {
    INFO(method);
    std::map<std::string, std::string> p = {{"paging", "8"}, {"start", "8"}};
    if (std::string(method) == "h2o")
      p["window"] = "16";
    else
      p.insert({{"base", "h2o"}, {"base.window", "16"}, {"ratio", "0.5"}});
    auto m = MethodRegistry::get().create(method, p, e.config());
    MethodRunner runner(*m, T);
    e.prefill(std::span<const int32_t>(ids.data(), 20), &runner);
    for (int step = 0; step < 60; ++step) e.decode(step % 300);
    for (const auto& c : e.caches()) CHECK(c.segments(0)[0]->size() <= size_t(8 + T + 16 + P - 1));
  }
  const auto h2o = run("h2o", {{"window", "16"}, {"paging", "8"}, {"start", "8"}});
  const auto zero =
      run("kvcrush", {{"base", "h2o"}, {"base.window", "16"}, {"paging", "8"}, {"start", "8"}, {"ratio", "0"}});
  CHECK(zero == h2o);
  const auto crush =
      run("kvcrush", {{"base", "h2o"}, {"base.window", "16"}, {"paging", "8"}, {"start", "8"}, {"ratio", "0.75"}});
  CHECK(crush != h2o);
}
