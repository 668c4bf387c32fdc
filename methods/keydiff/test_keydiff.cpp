// KeyDiff: the planted rule on a synthetic layer, and kept sets and greedy tokens on the default
// model against kvpress's KeyDiffPress itself (methods/keydiff/reference.py).
#include <algorithm>
#include <cmath>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "kept_sets.hpp"
#include "synthetic_layer.hpp"
#include "test_util.hpp"

using namespace kvb;

TEST_CASE("keydiff keeps the keys that point away from the head's mean direction", "[keydiff]") {
  // 64 tokens, 4 query heads over 2 KV heads, head dim 8. KV head 0: every key near +e0 except
  // positions 10 and 20 (-e0) and 30 (+e1, orthogonal); KV head 1 stays random.
  test::SyntheticLayer L(64, 4, 2, 8, 0, 1);
  for (int j = 0; j < 64; ++j) {
    float* k = &L.k[(size_t(j) * 2 + 0) * 8];
    for (int c = 0; c < 8; ++c) k[c] *= 0.05f;
    k[0] = j == 10 || j == 20 ? -3.0f : 3.0f;
    if (j == 30) k[0] = 0, k[1] = 5.0f;
  }
  auto m = MethodRegistry::get().create("keydiff", {}, L.cfg);
  MethodRunner runner(*m, 3);
  LayerCache cache(4, 2, 8);
  runner.on_layer(L.view, cache);
  const auto kept = test::kept_positions(cache);
  REQUIRE(kept.size() == 2);  // one decision per KV head
  CHECK(kept[0] == std::vector<int32_t>{10, 20, 30});
  CHECK(kept[1].size() == 3);

  // A window keeps the last tokens on top of the scored ones; the anchor still reads every key.
  auto w = MethodRegistry::get().create("keydiff", {{"window", "4"}}, L.cfg);
  MethodRunner wr(*w, 6);
  LayerCache wc(4, 2, 8);
  wr.on_layer(L.view, wc);
  CHECK(test::kept_positions(wc)[0] == std::vector<int32_t>{10, 20, 60, 61, 62, 63});
}

TEST_CASE("keydiff keeps what kvpress's KeyDiffPress keeps and decodes the same tokens",
          "[keydiff][model][reference]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  std::ifstream in(test::source_path("methods/keydiff/fixtures/kvpress_keydiff.json"));
  REQUIRE(in.good());
  const auto ref = nlohmann::json::parse(in);
  auto model = ModelFile::open(*path);
  auto tok = load_tokenizer(*model);
  Engine engine(*model);
  size_t same = 0, total = 0, greedy_same = 0, runs = 0;
  for (const auto& p : ref["prompts"]) {
    const auto ids = p["ids"].get<std::vector<int32_t>>();
    for (const auto& r : p["runs"]) {
      const double ratio = r["compression_ratio"].get<double>();
      INFO("prompt of " << ids.size() << " tokens, compression ratio " << ratio);
      auto m = MethodRegistry::get().create("keydiff", {}, engine.config());
      MethodRunner runner(*m, KvBudget::compression_ratio(ratio));
      test::KeptSets sets(runner);
      GenerateOptions opt;
      opt.max_new_tokens = static_cast<int>(r["greedy"].size());
      opt.stop_at_eog = false;
      const Generation g = generate(engine, *tok, ids, opt, &sets);
      const auto& hashes = r["hash"];
      REQUIRE(sets.kept.size() == hashes.size());
      for (size_t l = 0; l < hashes.size(); ++l)
        for (size_t h = 0; h < hashes[l].size(); ++h) {
          ++total;
          same += test::positions_hash(sets.kept[l][h]) == hashes[l][h].get<std::string>();
        }
      ++runs;
      greedy_same += g.tokens == r["greedy"].get<std::vector<int32_t>>();
    }
  }
  WARN("keydiff against kvpress: identical kept sets on " << same << "/" << total << " (layer, KV head) pairs; "
                                                          << "identical greedy tokens on " << greedy_same << "/" << runs
                                                          << " (prompt, ratio) runs");
  CHECK(runs >= 18);
  CHECK(static_cast<double>(same) >= 0.99 * static_cast<double>(total));
  CHECK(greedy_same == runs);
}
