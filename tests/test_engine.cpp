#include <cmath>
#include <fstream>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

struct Loaded {
  std::unique_ptr<ModelFile> model;
  std::unique_ptr<Tokenizer> tok;
  std::unique_ptr<Engine> engine;
};

// One engine per test binary: loading dequantizes 135M weights.
Loaded* default_engine() {
  static std::unique_ptr<Loaded> loaded;
  if (loaded) return loaded.get();
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return nullptr;
  loaded = std::make_unique<Loaded>();
  loaded->model = ModelFile::open(*path);
  loaded->tok = load_tokenizer(*loaded->model);
  loaded->engine = std::make_unique<Engine>(*loaded->model);
  return loaded.get();
}

float max_abs(const std::vector<float>& v) {
  float m = 0;
  for (float x : v) m = std::max(m, std::abs(x));
  return m;
}

}  // namespace

TEST_CASE("decoding token by token gives the logits of a full prefill", "[engine][model]") {
  Loaded* L = default_engine();
  if (!L) return;
  const auto ids = L->tok->encode(
      "The quick brown fox jumps over the lazy dog. In 1969, Apollo 11 landed on the Moon, and "
      "Neil Armstrong said: \"That's one small step for man.\" def f(x): return x * 2");
  REQUIRE(ids.size() > 40);
  Engine& e = *L->engine;
  const auto full = e.prefill(ids);
  const size_t full_bytes = e.kv_bytes();
  CHECK(full_bytes == e.full_kv_bytes(ids.size()));
  const size_t m = 12;
  e.prefill(std::span(ids).first(m));
  std::vector<float> step;
  for (size_t i = m; i < ids.size(); ++i) step = e.decode(ids[i]);
  CHECK(e.position() == static_cast<int>(ids.size()));
  CHECK(e.kv_bytes() == full_bytes);
  float diff = 0;
  for (size_t i = 0; i < full.size(); ++i) diff = std::max(diff, std::abs(full[i] - step[i]));
  INFO("max |diff| = " << diff << ", max |logit| = " << max_abs(full));
  CHECK(diff < 1e-4f * max_abs(full));
  CHECK(argmax(full) == argmax(step));
}

TEST_CASE("engine input errors", "[engine][model]") {
  Loaded* L = default_engine();
  if (!L) return;
  Engine& e = *L->engine;
  test::require_error([&] { e.prefill(std::vector<int32_t>{}); }, {"empty prompt"});
  test::require_error([&] { e.prefill(std::vector<int32_t>{1, 49152}); }, {"49152", "vocabulary"});
  std::vector<int32_t> too_long(8193, 42);
  test::require_error([&] { e.prefill(too_long); }, {"8193", "context length 8192"});
}
