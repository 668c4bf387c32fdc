#include <bit>
#include <cmath>

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
