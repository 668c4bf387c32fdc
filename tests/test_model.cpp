#include <bit>
#include <cmath>
#include <functional>
#include <limits>

#include "harness/model/config.hpp"
#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
#include "test_util.hpp"

using namespace kvb;

TEST_CASE("default model config is read from the GGUF file", "[model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  const ModelConfig& c = m->config();
  CHECK(c.arch == Arch::Llama);
  CHECK(c.n_layers == 30);
  CHECK(c.n_heads == 9);
  CHECK(c.n_kv_heads == 3);
  CHECK(c.head_dim == 64);
  CHECK(c.hidden == 576);
  CHECK(c.intermediate == 1536);
  CHECK(c.vocab_size == 49152);
  CHECK(c.context_length == 8192);
  CHECK(c.rope_theta == 100000.0);
  CHECK(c.norm_eps == Approx(1e-5).epsilon(1e-6));
  CHECK(c.tied_embeddings);
  CHECK_FALSE(c.qkv_bias);
  CHECK(c.rope_layout == RopeLayout::Interleaved);
  m->validate_tensors();
}

TEST_CASE("hyperparameters that would run into NaN logits are errors naming the source", "[model]") {
  // Found by an audit: rope scaling factor 0, an infinite epsilon or theta ran with every logit NaN or 0.
  ModelConfig ok;
  ok.n_layers = ok.n_heads = ok.n_kv_heads = 1;
  ok.head_dim = 4;
  ok.hidden = ok.intermediate = ok.vocab_size = ok.context_length = 8;
  ok.validate("m.gguf");
  const double inf = std::numeric_limits<double>::infinity();
  const std::vector<std::pair<std::function<void(ModelConfig&)>, std::string>> cases = {
      {[&](ModelConfig& c) { c.rope_theta = inf; }, "rope theta must be a positive finite number, found inf"},
      {[&](ModelConfig& c) { c.norm_eps = std::nan(""); }, "the norm epsilon must be a positive finite number"},
      {[](ModelConfig& c) { c.rope_scaling.type = RopeScaling::Type::Linear, c.rope_scaling.factor = 0; },
       "the rope scaling factor must be a positive finite number, found 0"},
      {[](ModelConfig& c) { c.rope_scaling.type = RopeScaling::Type::Linear, c.rope_scaling.factor = -2; },
       "the rope scaling factor"},
      {[](ModelConfig& c) {
         c.rope_scaling = {RopeScaling::Type::Llama3, 8, 4, 4, 8192};
       },
       "high_freq_factor 4 must exceed its low_freq_factor 4"},
      {[](ModelConfig& c) {
         c.rope_scaling = {RopeScaling::Type::Llama3, 8, 1, 4, 0};
       },
       "original context length must be positive"},
      {[](ModelConfig& c) {
         c.rope_freq_factors = {1.0f, 0.0f};
       },
       "every rope_freqs entry"}};
  for (const auto& [change, message] : cases) {
    ModelConfig c = ok;
    change(c);
    test::require_error([&] { c.validate("m.gguf"); }, {"m.gguf: ", message});
  }
}

TEST_CASE("every tensor of the default model dequantizes exactly like the gguf package", "[model][dequant]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  auto m = ModelFile::open(*path);
  const auto digests = test::read_jsonl(test::fixture("gguf/smollm2_dequant_digest.jsonl"));
  REQUIRE(digests.size() == m->tensors().size());
  for (const auto& d : digests) {
    const std::string name = d["name"];
    INFO("tensor " << name);
    const TensorRef& t = m->tensor(name);
    CHECK(dtype_name(t.type) == d["type"].get<std::string>());
    CHECK(t.ne == d["shape"].get<std::vector<uint64_t>>());
    const auto v = m->load_f32(name);
    REQUIRE(v.size() == d["n"].get<size_t>());
    for (const auto& s : d["samples"]) {
      const size_t i = s[0];
      REQUIRE(std::bit_cast<uint32_t>(v[i]) == s[1].get<uint32_t>());
    }
    double sum = 0, sumsq = 0;
    for (float x : v) {
      sum += x;
      sumsq += static_cast<double>(x) * x;
    }
    const double ref_sum = d["sum"], ref_sumsq = d["sumsq"];
    CHECK(std::abs(sum - ref_sum) <= 1e-9 * ref_sumsq + 1e-12);
    CHECK(sumsq == Approx(ref_sumsq).epsilon(1e-9));
  }
}

TEST_CASE("missing model path is a clear error", "[model]") {
  test::require_error([] { ModelFile::open("/nonexistent/model.gguf"); },
                      {"/nonexistent/model.gguf", "no such file or directory"});
  // Set-up fetches the default model only: the hint names it for that file alone.
  test::require_error([] { ModelFile::open("/nonexistent/SmolLM2-135M-Instruct.Q4_1.gguf"); },
                      {"the default model: scripts/setup.sh fetches it"});
  try {
    ModelFile::open("/nonexistent/model.gguf");
  } catch (const Error& e) {
    CHECK(std::string(e.what()).find("setup.sh") == std::string::npos);
  }
}
