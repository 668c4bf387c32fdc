#include <fmt/format.h>
#include <cmath>

#include <fstream>
#include <nlohmann/json.hpp>
#include <random>
#include <set>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/engine/rope_freqs.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/model/random_model.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "kernels/cpu/ops.hpp"
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

// The 25 parity prompts with their Hugging Face greedy continuations (tools/reference/hf_logits.py).
nlohmann::json parity_fixture() {
  std::ifstream jf(test::fixture("engine/hf_logits.json"));
  REQUIRE(jf.good());
  return nlohmann::json::parse(jf);
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
  INFO("max |diff| = " << diff << ", max |logit| = " << test::max_abs(full));
  CHECK(diff < 1e-4f * test::max_abs(full));
  CHECK(argmax(full) == argmax(step));
}

TEST_CASE("a prefill continued from a prefix's capture equals the whole prompt's", "[engine]") {
  const test::TempDir dir("continued_prefill");
  for (const char* arch : {"llama", "qwen3"}) {
    INFO(arch);
    auto model = ModelFile::open(test::tiny_random_model(dir, arch));
    Engine e(*model);
    std::mt19937 rng(4);
    std::vector<int32_t> ids(400);
    for (auto& t : ids) t = static_cast<int32_t>(rng() % 300);
    const PrefillNeeds needs{.window = 16, .k_pre_rope = true, .attn_colsum = true};
    const PrefillCapture whole = e.prefill_capture(ids, needs);
    auto check_equal = [&](const PrefillCapture& c) {
      REQUIRE(c.n_tokens == whole.n_tokens);
      CHECK(c.ids == whole.ids);
      CHECK(c.positions == whole.positions);
      CHECK(c.window == whole.window);
      for (size_t l = 0; l < whole.k.size(); ++l) {
        INFO("layer " << l);
        for (auto [got, want] : {std::pair{&c.k, &whole.k},
                                 {&c.v, &whole.v},
                                 {&c.k_pre_rope, &whole.k_pre_rope},
                                 {&c.q_window, &whole.q_window},
                                 {&c.attn_colsum, &whole.attn_colsum}}) {
          REQUIRE((*got)[l].size() == (*want)[l].size());
          CHECK(test::max_abs_diff((*got)[l], (*want)[l]) <= 1e-5f * test::max_abs((*want)[l]));
        }
      }
      CHECK(test::max_abs_diff(c.logits, whole.logits) <= 1e-5f * test::max_abs(whole.logits));
      CHECK(argmax(c.logits) == argmax(whole.logits));
    };
    // One new token, fewer new tokens than the window (its queries partly the prefix's), many.
    for (int split : {1, 200, 390, 399}) {
      INFO("prefix of " << split);
      const PrefillCapture prefix = e.prefill_capture(std::span(ids).first(size_t(split)), needs);
      check_equal(e.prefill_capture(ids, needs, nullptr, &prefix));
    }
    // A chain: 100 tokens, continued to 250, continued to the whole.
    const PrefillCapture a = e.prefill_capture(std::span(ids).first(100), needs);
    const PrefillCapture b = e.prefill_capture(std::span(ids).first(250), needs, nullptr, &a);
    check_equal(e.prefill_capture(ids, needs, nullptr, &b));
    // A method resumed from the continued capture decodes as from the whole one.
    e.resume(whole);
    const auto want = e.decode(17);
    e.resume(e.prefill_capture(ids, needs, nullptr, &b));
    CHECK(test::max_abs_diff(e.decode(17), want) <= 1e-5f * test::max_abs(want));
    // What a capture cannot be continued from.
    auto other = ids;
    other[50] = (other[50] + 1) % 300;
    test::require_error([&] { e.prefill_capture(other, needs, nullptr, &b); }, {"proper prefix"});
    test::require_error([&] { e.prefill_capture(std::span(ids).first(250), needs, nullptr, &b); }, {"proper prefix"});
    const PrefillCapture bare = e.prefill_capture(std::span(ids).first(100), {});
    test::require_error([&] { e.prefill_capture(ids, needs, nullptr, &bare); }, {"cannot continue"});
  }
}

TEST_CASE("end tokens end generation as end-of-generation tokens do, masked before min_new_tokens", "[engine][model]") {
  Loaded* L = default_engine();
  if (!L) return;
  const auto ids = L->tok->encode("The capital of France is Paris. The capital of Italy is");
  GenerateOptions opt;
  opt.max_new_tokens = 4;
  opt.stop_at_eog = false;
  const Generation free = generate(*L->engine, *L->tok, ids, opt);
  REQUIRE(free.tokens.size() == 4);
  // The second token ends it: one token kept (pred.py's samsum newline).
  opt.end_tokens = {free.tokens[1]};
  opt.min_new_tokens = 1;
  const Generation cut = generate(*L->engine, *L->tok, ids, opt);
  CHECK(cut.tokens == std::vector<int32_t>{free.tokens[0]});
  CHECK(cut.stop_reason == "end_token");
  // The first token cannot be an end token before min_new_tokens: the next most likely comes instead.
  opt.end_tokens = {free.tokens[0]};
  const Generation masked = generate(*L->engine, *L->tok, ids, opt);
  REQUIRE_FALSE(masked.tokens.empty());
  CHECK(masked.tokens[0] != free.tokens[0]);
}

TEST_CASE("generation refuses NaN logits instead of choosing an arbitrary token", "[engine][model]") {
  Loaded* L = default_engine();
  if (!L) return;
  // A cache whose first layer holds a NaN key: the prompt's own logits are finite, the first decode
  // step's are NaN (attention passes NaN on).
  struct NanKey final : PrefillObserver {
    MethodRunner& inner;
    explicit NanKey(MethodRunner& r) : inner(r) {}
    PrefillNeeds needs() const override { return inner.needs(); }
    void on_layer(const PrefillView& view, LayerCache& cache) override {
      inner.on_layer(view, cache);
      if (view.layer != 0) return;
      std::vector<float> k(size_t(cache.n_cache_heads()) * cache.head_dim(), std::nanf("")), v(k.size(), 0.0f);
      cache.append(k.data(), v.data(), view.n_tokens);
    }
  };
  auto m = MethodRegistry::get().create("snapkv", {}, L->engine->config());
  MethodRunner runner(*m, 4096);  // keeps the whole prompt
  NanKey nan(runner);
  const auto ids = L->tok->encode("The capital of France is");
  GenerateOptions opt;
  opt.max_new_tokens = 3;
  test::require_error([&] { generate(*L->engine, *L->tok, ids, opt, &nan); }, {"generation step 2", "logits hold NaN"});
}

TEST_CASE("decoding goes on past the context length, rotary positions extrapolated as transformers does", "[engine]") {
  // The same random weights declared with a context of 64 and of 512: past 64 the short one decodes
  // as the long one does, bit for bit (positions enter only through the rotation's angles).
  const test::TempDir dir_short("past_context"), dir_long("past_context");
  std::vector<std::unique_ptr<ModelFile>> models;
  models.push_back(ModelFile::open(test::tiny_random_model(dir_short, "llama", 2, 3, 64)));
  models.push_back(ModelFile::open(test::tiny_random_model(dir_long, "llama", 2, 3, 512)));
  Engine short_ctx(*models[0]), long_ctx(*models[1]);
  REQUIRE(short_ctx.config().context_length == 64);
  std::vector<int32_t> ids(60);
  for (size_t i = 0; i < ids.size(); ++i) ids[i] = static_cast<int32_t>((i * 37 + 5) % 300);
  CHECK(short_ctx.prefill(ids) == long_ctx.prefill(ids));
  for (int step = 0; step < 12; ++step) {
    INFO("position " << short_ctx.position());
    const int32_t t = static_cast<int32_t>((step * 53 + 11) % 300);
    CHECK(short_ctx.decode(t) == long_ctx.decode(t));
  }
  CHECK(short_ctx.position() == 72);
  std::vector<int32_t> too_long(65, 7);  // a prompt still may not exceed it
  test::require_error([&] { short_ctx.prefill(too_long); }, {"65", "context length 64"});
}

TEST_CASE("generation stops at a sliding attention window, which kvbench does not implement", "[engine][model]") {
  // Phi-3's random fixture declares a window of 200 tokens; the default model's tokenizer only decodes.
  Loaded* L = default_engine();
  if (!L) return;
  auto m = ModelFile::open(test::fixture("hf_config/phi3_fused.gguf"));
  REQUIRE(m->config().sliding_window == 200);
  Engine e(*m);
  GenerateOptions opt;
  opt.max_new_tokens = 32;
  opt.stop_at_eog = false;
  const Generation g = generate(e, *L->tok, std::vector<int32_t>(190, 3), opt);
  CHECK(g.stop_reason == "sliding_window");
  CHECK(g.tokens.size() == 11);  // positions 190 to 200; the last is never fed
  CHECK(g.past_context == 0);
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

TEST_CASE("logits and greedy continuations match Hugging Face transformers on the same GGUF",
          "[engine][model][reference]") {
  Loaded* L = default_engine();
  if (!L) return;
  const auto ref = parity_fixture();
  std::ifstream bf(test::fixture("engine/hf_logits.bin"), std::ios::binary);
  REQUIRE(bf.good());
  const auto& prompts = ref["prompts"];
  REQUIRE(prompts.size() >= 20);
  const size_t V = 49152;
  std::vector<float> hf(prompts.size() * V);
  bf.read(reinterpret_cast<char*>(hf.data()), static_cast<std::streamsize>(hf.size() * sizeof(float)));
  REQUIRE(bf.gcount() == static_cast<std::streamsize>(hf.size() * sizeof(float)));

  Engine& e = *L->engine;
  float worst_ratio = 0;
  size_t identical_continuations = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto ids = prompts[p]["ids"].get<std::vector<int32_t>>();
    INFO("prompt " << p << " (" << ids.size() << " tokens)");
    auto logits = e.prefill(ids);
    const float* want = hf.data() + p * V;
    float diff = 0, max_logit = 0;
    for (size_t i = 0; i < V; ++i) {
      diff = std::max(diff, std::abs(logits[i] - want[i]));
      max_logit = std::max(max_logit, std::abs(want[i]));
    }
    worst_ratio = std::max(worst_ratio, diff / max_logit);
    CHECK(diff < 1e-3f * max_logit);

    const auto greedy = prompts[p]["greedy"].get<std::vector<int32_t>>();
    std::vector<int32_t> ours;
    for (size_t t = 0; t < greedy.size(); ++t) {
      ours.push_back(argmax(logits));
      if (t + 1 < greedy.size()) logits = e.decode(ours.back());
    }
    CHECK(ours == greedy);
    identical_continuations += ours == greedy;
  }
  WARN("worst max|diff| / max|logit| = " << worst_ratio << "; identical continuations " << identical_continuations
                                         << "/" << prompts.size());
}

TEST_CASE("bf16 weights: logits near fp32's and the parity prompts' greedy continuations kept",
          "[engine][model][reference]") {
  Loaded* L = default_engine();
  if (!L) return;
  Engine e(*L->model, {.weights = WeightFormat::BF16});
  CHECK(e.weight_format() == WeightFormat::BF16);
  CHECK(L->engine->weight_format() == WeightFormat::F32);
  // Half the bytes per decode step (the norms stay fp32).
  CHECK(100 * e.decode_weight_bytes() < 51 * L->engine->decode_weight_bytes());

  const auto prompts = parity_fixture()["prompts"];
  // The fixture's greedy tokens are fp32 continuations: the Hugging Face test above holds the fp32
  // engine to them.
  float worst_ratio = 0;
  size_t identical = 0;
  std::string diverged;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto ids = prompts[p]["ids"].get<std::vector<int32_t>>();
    const auto greedy = prompts[p]["greedy"].get<std::vector<int32_t>>();
    const auto want = L->engine->prefill(ids);
    auto logits = e.prefill(ids);
    const float err = test::max_abs_diff(logits, want);
    worst_ratio = std::max(worst_ratio, err / test::max_abs(want));
    std::vector<int32_t> ours;
    for (size_t t = 0; t < greedy.size(); ++t) {
      ours.push_back(argmax(logits));
      if (ours.back() != greedy[t]) break;
      if (t + 1 < greedy.size()) logits = e.decode(ours.back());
    }
    if (ours == greedy) {
      ++identical;
      continue;
    }
    // A continuation may part only at a near-tie: where fp32's own margin between its token and
    // bf16's is smaller than bf16's logit error on this prompt.
    const size_t t = ours.size() - 1;
    auto ref = L->engine->prefill(ids);
    for (size_t i = 0; i < t; ++i) ref = L->engine->decode(greedy[i]);
    const float margin = ref[greedy[t]] - ref[ours[t]];
    diverged += fmt::format(" prompt {} at token {} (fp32 margin {:.4f}, logit error {:.4f});", p, t, margin, err);
    CHECK(margin < err);
  }
  WARN("bf16 vs fp32 weights: worst max|diff| / max|logit| = " << worst_ratio << "; identical continuations "
                                                               << identical << "/" << prompts.size()
                                                               << (diverged.empty() ? "" : "; diverged:" + diverged));
  CHECK(worst_ratio < 0.02f);
  // The two continuations of this model that part in bf16 do so at fp32 margins of 0.015 and 0.005.
  CHECK(identical + 2 >= prompts.size());
}

TEST_CASE("gguf weights of a Q4_K_M-type model: K-quant blocks multiplied as they are, logits near fp32's",
          "[engine][model]") {
  ModelShape s;
  s.name = "tiny-q4km";
  s.layers = 2;
  s.hidden = 256;
  s.heads = 4;
  s.kv_heads = 2;
  s.ffn = 512;
  s.vocab = 512;
  s.context = 512;
  const test::TempDir dir("q4km");
  const std::string path = (dir / "tiny-q4km.gguf").string();
  write_random_model(path, s, DType::Q4_K, 5);
  auto m = ModelFile::open(path);
  test::require_error([&] { load_tokenizer(*m); }, {"has no tokenizer", "no_vocab"});
  Engine fp32(*m), gguf(*m, {.weights = WeightFormat::GGUF});
  // Q4_K at 4.5 bits and Q6_K at 6.6 bits per weight against 32: the decode step reads < 1/5.
  CHECK(5 * gguf.decode_weight_bytes() < fp32.decode_weight_bytes());
  std::mt19937 rng(9);
  std::vector<int32_t> ids(48);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 512);
  std::vector<std::pair<std::vector<float>, std::vector<float>>> steps = {{gguf.prefill(ids), fp32.prefill(ids)}};
  for (int32_t t : {7, 300, 42}) steps.emplace_back(gguf.decode(t), fp32.decode(t));
  for (const auto& [got, want] : steps) {
    // Only the activations' 8-bit quantization per block of 256 separates the two.
    CHECK(test::max_abs_diff(got, want) < 0.03f * test::max_abs(want));
  }
  s.hidden = 320;  // rows of 320 values are no whole number of K-quant blocks
  s.heads = s.kv_heads = 5;
  test::require_error([&] { write_random_model((dir / "bad.gguf").string(), s, DType::Q4_K, 5); },
                      {"token_embd.weight", "not whole Q4_K blocks of 256"});
}

TEST_CASE("random Falcon- and Phi-3-shaped models: fused matrices split (K-quant blocks too), decode continues prefill",
          "[engine][model]") {
  for (const char* name : {"falcon-7b", "phi3-mini-4k"}) {
    INFO(name);
    ModelShape s = model_shape(name);  // the architecture, shrunk
    s.layers = 2;
    s.hidden = 256;
    s.heads = 4;
    s.kv_heads = s.arch == "falcon" ? 1 : 4;
    s.ffn = 512;
    s.vocab = 512;
    s.context = 512;
    const test::TempDir dir("fused_random");
    const std::string path = (dir / "m.gguf").string();
    write_random_model(path, s, DType::Q4_K, 5);
    auto m = ModelFile::open(path);
    CHECK(arch_name(m->config().arch) == s.arch);
    CHECK(m->find("blk.0.attn_qkv.weight") == nullptr);
    CHECK(m->tensor("blk.1.attn_k.weight").type == DType::Q4_K);
    Engine fp32(*m), gguf(*m, {.weights = WeightFormat::GGUF});
    std::mt19937 rng(9);
    std::vector<int32_t> ids(40);
    for (auto& t : ids) t = static_cast<int32_t>(rng() % 512);
    const auto whole = fp32.prefill(ids);
    fp32.prefill(std::span(ids).first(30));
    std::vector<float> stepped;
    for (size_t i = 30; i < ids.size(); ++i) stepped = fp32.decode(ids[i]);
    CHECK(test::max_abs_diff(stepped, whole) < 1e-4f * test::max_abs(whole));
    // The split views of the file's Q4_K/Q6_K blocks, multiplied as they are.
    CHECK(test::max_abs_diff(gguf.prefill(ids), whole) < 0.03f * test::max_abs(whole));
  }
}

TEST_CASE("gguf weights: products on the file's blocks, logits near fp32's on the parity prompts",
          "[engine][model][reference]") {
  Loaded* L = default_engine();
  if (!L) return;
  Engine e(*L->model, {.weights = WeightFormat::GGUF});
  CHECK(e.weight_format() == WeightFormat::GGUF);
  // The default model's matrices are Q4_1 (and a Q8_0 embedding): about a sixth of fp32's bytes.
  CHECK(5 * e.decode_weight_bytes() < L->engine->decode_weight_bytes());

  const auto prompts = parity_fixture()["prompts"];
  // Prefill multiplies dequantized blocks (as fp32 does) except for the last token's output head;
  // each decode step quantizes the token's activations to 8 bits per block before every product.
  // Compared: the prompt's last logits and those of the first decode step, over 25 prompts.
  float worst_ratio = 0;
  size_t top1 = 0, steps = 0;
  for (size_t p = 0; p < prompts.size(); ++p) {
    const auto ids = prompts[p]["ids"].get<std::vector<int32_t>>();
    const auto next = prompts[p]["greedy"][0].get<int32_t>();
    const auto want_pre = L->engine->prefill(ids), want_dec = L->engine->decode(next);
    const auto got_pre = e.prefill(ids), got_dec = e.decode(next);
    for (auto [got, want] : {std::pair{&got_pre, &want_pre}, {&got_dec, &want_dec}}) {
      worst_ratio = std::max(worst_ratio, test::max_abs_diff(*got, *want) / test::max_abs(*want));
      top1 += argmax(*got) == argmax(*want);
      ++steps;
    }
  }
  WARN("gguf vs fp32 weights: worst max|diff| / max|logit| = " << worst_ratio << "; top-1 agreement " << top1 << "/"
                                                               << steps);
  CHECK(worst_ratio < 0.05f);
  CHECK(top1 + 4 >= steps);
}

TEST_CASE("RoPE inverse round trip up to 128K positions with Llama 3 scaled frequencies", "[engine]") {
  ModelConfig c;
  c.head_dim = 128;
  c.rope_theta = 500000.0;
  c.rope_scaling.type = RopeScaling::Type::Llama3;
  c.rope_scaling.factor = 8.0;
  c.rope_scaling.original_context = 8192;
  RopeTable rope(rope_inv_freq(c), RopeStyle::NeoX);
  rope.ensure(131072);
  std::mt19937 rng(2);
  std::normal_distribution<float> nd(0.0f, 1.0f);
  double worst = 0;
  for (int32_t pos : {0, 1, 4095, 8192, 65537, 100000, 131071}) {
    std::vector<float> x(128), y;
    for (auto& v : x) v = nd(rng);
    y = x;
    rope.apply(y.data(), 1, 1, 128, &pos);
    rope.apply_inverse(y.data(), 1, 1, 128, &pos);
    for (int i = 0; i < 128; ++i) worst = std::max(worst, double(std::abs(y[i] - x[i])));
  }
  CHECK(worst < 1e-5);
}

namespace {

// Doubles the activations entering one site and halves the weights of the matrices there: every product,
// and so every logit, is unchanged bit for bit (powers of two scale exactly). `weights_at` may name another
// site, to show that a mismatch is seen.
class ScaledSite final : public PrefillObserver, public LinearTransform {
 public:
  ScaledSite(MatrixInput inputs_at, MatrixInput weights_at, std::string key = "scaled", int only_layer = -1)
      : in_(inputs_at), w_(weights_at), key_(std::move(key)), only_(only_layer) {}
  void on_layer(const PrefillView& v, LayerCache& cache) override {
    cache.append_many(v.k, v.v, v.n_tokens, v.positions);
  }
  LinearTransform* linear_transform() override { return this; }
  std::string weights_key() const override { return key_; }
  bool changes_layer(int layer) const override { return only_ < 0 || layer == only_; }
  void weights(int layer, Matrix m, float* w, int rows, int cols) override {
    layers_made.insert(layer);
    if (input_of(m) == w_)
      for (size_t i = 0; i < size_t(rows) * cols; ++i) w[i] *= 0.5f;
  }
  void inputs(int layer, MatrixInput site, float* x, int n, int cols) override {
    rows_seen += layer == 0 && site == in_ ? n : 0;
    if (site == in_ && changes_layer(layer))
      for (size_t i = 0; i < size_t(n) * cols; ++i) x[i] *= 2.0f;
  }
  int rows_seen = 0;
  std::set<int> layers_made;

 private:
  MatrixInput in_, w_;
  std::string key_;
  int only_;
};

}  // namespace

TEST_CASE("a linear transform changes each site's activations and its matrices' weights, prefill and decode",
          "[engine]") {
  const test::TempDir dir("linear_transform");
  auto model = ModelFile::open(test::tiny_random_model(dir, "llama"));
  Engine e(*model);
  std::mt19937 rng(9);
  std::vector<int32_t> ids(40);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 300);
  const auto want = e.prefill(ids);
  const auto want_next = e.decode(5);
  for (MatrixInput site :
       {MatrixInput::Attention, MatrixInput::AttentionOutput, MatrixInput::Mlp, MatrixInput::MlpHidden}) {
    INFO(matrix_input_name(site));
    ScaledSite t(site, site, std::string("scaled ") + matrix_input_name(site));
    CHECK(e.prefill(ids, &t) == want);
    CHECK(e.decode(5) == want_next);
    CHECK(t.rows_seen == 41);
    // The model's own weights are back for a sequence without the transform.
    CHECK(e.prefill(ids) == want);
    ScaledSite wrong(site, site == MatrixInput::Mlp ? MatrixInput::Attention : MatrixInput::Mlp, "mismatched");
    CHECK(e.prefill(ids, &wrong) != want);
  }
  // A transform of one layer: only that layer's weights are made, the others run the model's.
  ScaledSite one(MatrixInput::Mlp, MatrixInput::Mlp, "layer 1", 1);
  CHECK(e.prefill(ids, &one) == want);
  CHECK(one.layers_made == std::set<int>{1});
  ScaledSite one_wrong(MatrixInput::Mlp, MatrixInput::Attention, "layer 1 mismatched", 1);
  CHECK(e.prefill(ids, &one_wrong) != want);
  // A capture cannot stand for a prefill of a changed model, and sequences whose weights differ do not
  // share a decode step.
  ScaledSite t(MatrixInput::Mlp, MatrixInput::Mlp);
  test::require_error([&] { e.resume(e.prefill_capture(ids, {}), &t); }, {"prefill of its own"});
  e.prefill(ids, &t);
  Sequence a = e.detach();
  e.prefill(ids);
  Sequence b = e.detach();
  Sequence* both[] = {&a, &b};
  const int32_t tokens[] = {5, 5};
  test::require_error([&] { e.decode_batch(both, tokens); },
                      {"sequence 1 runs the model's weights unchanged", "cannot share a step"});
}

TEST_CASE("a prefill of some layers from given hidden states gives their views as a whole prefill does", "[engine]") {
  const test::TempDir dir("prefill_layers");
  auto model = ModelFile::open(test::tiny_random_model(dir, "llama"));
  Engine e(*model);
  std::mt19937 rng(10);
  std::vector<int32_t> ids(30);
  for (auto& t : ids) t = static_cast<int32_t>(rng() % 300);
  struct Keys final : PrefillObserver {
    std::vector<std::vector<float>> k;
    void on_layer(const PrefillView& v, LayerCache&) override {
      k.emplace_back(v.k, v.k + size_t(v.n_tokens) * v.n_kv_heads * v.head_dim);
    }
  } whole, first;
  e.prefill(ids, &whole);
  std::vector<float> hidden;
  e.prefill_layers(ids, 0, 2, hidden, &first);
  CHECK(hidden.size() == ids.size() * 128);
  e.prefill_layers(ids, 2, 3, hidden, &first);  // from the states the first two layers left
  REQUIRE(whole.k.size() == 3);
  CHECK(first.k == whole.k);
  test::require_error([&] { e.decode(5); }, {"no sequence"});
  test::require_error([&] { e.prefill_layers(ids, 1, 4, hidden, &first); },
                      {"layers [1, 4) asked of a model with 3 layers"});
  hidden.pop_back();
  test::require_error([&] { e.prefill_layers(ids, 1, 2, hidden, &first); },
                      {"3839 hidden-state numbers for 30 tokens"});
}

TEST_CASE("a generation cut inside a character reads it as U+FFFD, stop strings included", "[engine][model]") {
  // Found by an independent check: the text a task scores held the bytes of a character cut short at
  // max_new_tokens, which PCRE2 (told the text was valid UTF-8) may read past.
  Loaded* L = default_engine();
  if (!L) return;
  const auto ids = L->tok->encode("请用中文回答：中国的首都是哪里？答：", true);
  int cut_inside = 0;
  for (int n = 1; n <= 8; ++n)
    for (const bool stop : {false, true}) {
      GenerateOptions opt;
      opt.max_new_tokens = n;
      opt.stop_at_eog = false;
      if (stop) opt.stop = {"\x01never"};
      const Generation g = generate(*L->engine, *L->tok, ids, opt);
      const std::string raw = L->tok->decode(g.tokens, true);
      cut_inside += raw != utf8_lossy(raw);
      INFO(n << " tokens");
      CHECK(g.text == utf8_lossy(raw));
    }
  CHECK(cut_inside > 0);  // else the prompt no longer tests a cut character
}
