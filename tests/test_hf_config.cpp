// Models saved by transformers 5 (tools/reference/hf_config_parity.py): their logits against
// transformers', from the config.json transformers 5 writes (rope_parameters) and from the same
// settings in the older layout (rope_theta, rope_scaling at the top).
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>

#include "harness/engine/engine.hpp"
#include "harness/engine/gradients.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/chat_template.hpp"
#include "test_util.hpp"

using namespace kvb;
namespace fs = std::filesystem;
using nlohmann::json;

namespace {

struct Reference {
  std::vector<int32_t> ids;
  size_t vocab = 0;
  std::vector<float> logits;  // [positions, vocab]
};

Reference load_reference(const fs::path& dir) {
  const json j = json::parse(std::ifstream(dir / "reference.json"));
  Reference r;
  r.ids = j["ids"].get<std::vector<int32_t>>();
  r.vocab = j["shape"][1].get<size_t>();
  r.logits.resize(r.ids.size() * r.vocab);
  std::ifstream in(dir / j["logits"].get<std::string>(), std::ios::binary);
  in.read(reinterpret_cast<char*>(r.logits.data()), std::streamsize(r.logits.size() * sizeof(float)));
  REQUIRE(in.gcount() == std::streamsize(r.logits.size() * sizeof(float)));
  return r;
}

// The model directory with `config` as its config.json (a copy in `tmp`).
fs::path with_config(const fs::path& dir, const json& config, const test::TempDir& tmp) {
  for (const auto& e : fs::directory_iterator(dir))
    fs::copy_file(e.path(), tmp / e.path().filename(), fs::copy_options::overwrite_existing);
  std::ofstream(tmp / "config.json") << config.dump();
  return tmp.path();
}

// Largest |kvbench - transformers| over every position, relative to the largest |logit|: the first
// half of the ids through prefill, the rest one decode step at a time.
double relative_error(const fs::path& model_dir, const Reference& ref) {
  auto m = ModelFile::open(model_dir.string());
  Engine e(*m);
  const size_t n = ref.ids.size(), half = n / 2;
  double worst = 0, scale = 0;
  for (float x : ref.logits) scale = std::max(scale, double(std::fabs(x)));
  auto compare = [&](const std::vector<float>& got, size_t pos) {
    REQUIRE(got.size() == ref.vocab);
    for (size_t v = 0; v < ref.vocab; ++v)
      worst = std::max(worst, double(std::fabs(got[v] - ref.logits[pos * ref.vocab + v])));
  };
  compare(e.prefill(std::span(ref.ids).first(half)), half - 1);
  for (size_t p = half; p < n; ++p) compare(e.decode(ref.ids[p]), p);
  return worst / scale;
}

// The loss and every weight's gradient against torch autograd's (grads.json): loss within 1e-6,
// each tensor's norm within 1e-4, sampled entries within 1e-4 of the tensor's largest. Returns the
// largest sampled difference relative to the tensor's largest entry.
double gradient_error(const fs::path& dir) {
  const Reference ref = load_reference(dir);
  const json g = json::parse(std::ifstream(dir / "grads.json"));
  auto m = ModelFile::open(dir.string());
  ModelGradients mg(*m);
  std::set<std::string> want;
  for (const auto& [name, t] : g["tensors"].items()) want.insert(name);
  const LossGradients got = mg.compute(ref.ids, want);
  CHECK(got.loss == Approx(g["loss"].get<double>()).epsilon(1e-6));
  double worst = 0;
  for (const auto& [name, t] : g["tensors"].items()) {
    INFO(name);
    REQUIRE(got.grads.count(name));
    const auto& v = got.grads.at(name);
    double ss = 0;
    for (float x : v) ss += double(x) * x;
    CHECK(std::sqrt(ss) == Approx(t["norm"].get<double>()).epsilon(1e-4));
    const double scale = t["max_abs"].get<double>();
    for (const auto& s : t["samples"]) {
      const double diff = std::fabs(v.at(s[0].get<size_t>()) - s[1].get<double>()) / scale;
      worst = std::max(worst, diff);
      CHECK(diff < 1e-4);
    }
  }
  return worst;
}

}  // namespace

TEST_CASE("models saved by transformers 5 give transformers' logits in both config layouts", "[hf_config]") {
  for (const char* name : {"qwen2_theta1e6", "llama31_scaling", "qwen3_qknorm"}) {
    INFO(name);
    const fs::path dir = test::fixture(std::string("hf_config/") + name);
    const Reference ref = load_reference(dir);
    const json modern = json::parse(std::ifstream(dir / "config.json"));
    const json legacy = json::parse(std::ifstream(dir / "config_legacy.json"));
    REQUIRE(modern.contains("rope_parameters"));
    REQUIRE_FALSE(legacy.contains("rope_parameters"));

    const test::TempDir a("hf_modern"), b("hf_legacy"), c("hf_default_rope");
    const double e_modern = relative_error(with_config(dir, modern, a), ref);
    const double e_legacy = relative_error(with_config(dir, legacy, b), ref);
    CHECK(e_modern < 1e-5);
    CHECK(e_legacy < 1e-5);
    // What ignoring rope_parameters did (theta 10000, no scaling): far outside the tolerance, so the
    // comparison above tells the settings apart.
    json plain = modern;
    plain.erase("rope_parameters");
    const double e_plain = relative_error(with_config(dir, plain, c), ref);
    CHECK(e_plain > 1e-3);
    WARN(name << ": relative error " << e_modern << " (rope_parameters), " << e_legacy << " (older layout), " << e_plain
              << " (RoPE settings dropped)");
  }
}

TEST_CASE("a model directory's chat template is read from chat_template.jinja first, as transformers 5 saves it",
          "[hf_config][tokenizer]") {
  const test::TempDir tmp("hf_chat");
  for (const auto& e : fs::directory_iterator(test::fixture("hf_config/llama31_scaling")))
    fs::copy_file(e.path(), tmp / e.path().filename());
  const std::string dir = tmp.path().string();
  auto format_of = [&] { return ChatTemplate::for_model(*ModelFile::open(dir)).name(); };
  test::require_error(format_of, {"tokenizer_config.json", "chat_template.jinja", "no chat template"});

  const std::string chatml = "{% for m in messages %}<|im_start|>{{ m.role }}\n{{ m.content }}<|im_end|>\n{% endfor %}";
  std::ofstream(tmp / "tokenizer_config.json") << json{{"chat_template", chatml}}.dump();
  CHECK(format_of() == "chatml");
  // The older form for several templates: a list of named ones, "default" used.
  std::ofstream(tmp / "tokenizer_config.json") << json{
      {"chat_template",
       {{{"name", "tool_use"}, {"template", "[INST]"}},
        {{"name", "default"}, {"template", chatml}}}}}.dump();
  CHECK(format_of() == "chatml");
  // A name of another type is no "default" (it threw the JSON library's exception), a number no template.
  std::ofstream(tmp / "tokenizer_config.json") << json{{"chat_template", {{{"name", 1}, {"template", "x"}}}}}.dump();
  test::require_error(format_of, {"tokenizer_config.json", "without one named \"default\""});
  std::ofstream(tmp / "tokenizer_config.json") << json{{"chat_template", 5}}.dump();
  test::require_error(format_of, {"tokenizer_config.json", "expected a string or a list of named templates"});
  std::ofstream(tmp / "tokenizer_config.json") << json{
      {"chat_template",
       {{{"name", "tool_use"}, {"template", "[INST]"}},
        {{"name", "default"}, {"template", chatml}}}}}.dump();
  std::ofstream(tmp / "chat_template.jinja")
      << "{{ bos_token }}{% for m in messages %}<|start_header_id|>{{ m['role'] }}<|end_header_id|>\n\n"
         "{{ m['content'] | trim }}<|eot_id|>{% endfor %}";
  CHECK(format_of() == "llama3");  // the file wins over tokenizer_config.json
  std::ofstream(tmp / "chat_template.jinja") << "{{ messages[0]['content'] }}";
  test::require_error(format_of, {"chat_template.jinja", "not recognised"});
}

TEST_CASE("Qwen3: q/k norms before RoPE, from safetensors and GGUF, its chat template with thinking off",
          "[hf_config][qwen3]") {
  const fs::path dir = test::fixture("hf_config/qwen3_qknorm");
  const Reference ref = load_reference(dir);
  const std::string gguf = test::fixture("hf_config/qwen3_qknorm.gguf");
  {
    auto m = ModelFile::open(gguf);
    const ModelConfig& c = m->config();
    CHECK(c.arch == Arch::Qwen3);
    CHECK(c.qk_norm);
    CHECK_FALSE(c.qkv_bias);
    CHECK(c.head_dim == 32);
    CHECK(c.n_heads * c.head_dim == 2 * c.hidden);  // q_proj wider than the model, as Qwen3-0.6B's
    CHECK(c.tied_embeddings);
    CHECK(c.rope_theta == 1e6);
  }
  const double e_gguf = relative_error(gguf, ref);
  CHECK(e_gguf < 1e-5);
  WARN("qwen3 GGUF: relative error " << e_gguf);

  // The chat template as transformers renders it with enable_thinking=False.
  const json chat = json::parse(std::ifstream(dir / "chat.json"));
  const ChatTemplate t = ChatTemplate::for_model(*ModelFile::open(gguf));
  CHECK(t.name() == "chatml (thinking off)");
  CHECK(t.render({{"user", "What is 2+2?"}}, true) == chat["rendered"]["user"].get<std::string>());
  CHECK(t.render({{"system", "Be brief."}, {"user", "Name a colour."}}, true) ==
        chat["rendered"]["system_user"].get<std::string>());
  CHECK(ChatTemplate::for_model(*ModelFile::open(dir.string())).name() == "chatml (thinking off)");

  // A Qwen3 file without its norms is an error naming the file and the tensor: the Qwen2 model's
  // weights under a config that says qwen3.
  const test::TempDir tmp("qwen3_missing");
  auto cfg = json::parse(std::ifstream(test::fixture("hf_config/qwen2_theta1e6/config.json")));
  cfg["model_type"] = "qwen3";
  // Qwen3's head_dim defaults to 128; the Qwen2 file's heads are hidden / heads wide.
  cfg["head_dim"] = cfg["hidden_size"].get<int>() / cfg["num_attention_heads"].get<int>();
  std::ofstream(tmp / "config.json") << cfg.dump();
  fs::copy_file(test::fixture("hf_config/qwen2_theta1e6/model.safetensors"), tmp / "model.safetensors");
  test::require_error([&] { Engine e(*ModelFile::open(tmp.path().string())); },
                      {tmp.path().string(), "blk.0.attn_q_norm.weight", "missing"});
}

TEST_CASE("Qwen3: the backward pass through the q/k norms equals torch autograd", "[hf_config][qwen3][backward]") {
  const double worst = gradient_error(test::fixture("hf_config/qwen3_qknorm"));
  WARN("qwen3 gradients: largest sampled difference " << worst << " of the tensor's largest entry");
}

TEST_CASE("Falcon: LayerNorm, GELU, parallel blocks and fused query_key_value give transformers' logits",
          "[hf_config][falcon]") {
  // tools/reference/fused_arch_parity.py: Falcon-7B's layout (multi-query, one norm), Falcon-40B's
  // (grouped rows, ln_attn and ln_mlp) and the sequential block (per-head rows), each from the
  // safetensors transformers saved and, for the first two, from the GGUF llama.cpp's converter writes.
  struct Variant {
    const char* name;
    int kv_heads;
    bool parallel, mlp_norm, gguf;
  };
  for (const Variant& v :
       {Variant{"falcon_7b_like", 1, true, false, true}, Variant{"falcon_40b_like", 2, true, true, true},
        Variant{"falcon_sequential", 4, false, true, false}}) {
    INFO(v.name);
    const fs::path dir = test::fixture(std::string("hf_config/") + v.name);
    const Reference ref = load_reference(dir);
    std::vector<std::string> files = {dir.string()};
    if (v.gguf) files.push_back(test::fixture(std::string("hf_config/") + v.name + ".gguf"));
    for (const auto& file : files) {
      INFO(file);
      {
        auto m = ModelFile::open(file);
        const ModelConfig& c = m->config();
        CHECK(c.arch == Arch::Falcon);
        CHECK(c.layer_norm);
        CHECK_FALSE(c.gated_mlp);
        CHECK(c.n_kv_heads == v.kv_heads);
        CHECK(c.parallel_block == v.parallel);
        CHECK(c.mlp_norm == v.mlp_norm);
        CHECK(m->find("blk.0.attn_qkv.weight") == nullptr);  // split into attn_q/k/v
      }
      const double err = relative_error(file, ref);
      CHECK(err < 1e-5);
      WARN(v.name << (fs::is_directory(file) ? " (safetensors)" : " (GGUF)") << ": relative error " << err);
    }
  }

  // Read as Falcon-7B's layout, Falcon-40B's grouped rows do not fit one KV head: an error naming the
  // tensor and the shape expected, not a model computed from misplaced rows.
  const fs::path dir = test::fixture("hf_config/falcon_40b_like");
  const test::TempDir a("falcon_layout"), b("falcon_alibi");
  json cfg = json::parse(std::ifstream(dir / "config.json"));
  cfg["new_decoder_architecture"] = false;
  const fs::path wrong = with_config(dir, cfg, a);
  test::require_error([&] { ModelFile::open(wrong.string()); }, {"blk.0.attn_qkv.weight", "expected [64, 80]"});
  cfg = json::parse(std::ifstream(dir / "config.json"));
  cfg["alibi"] = true;
  const fs::path alibi = with_config(dir, cfg, b);
  test::require_error([&] { ModelFile::open(alibi.string()); }, {"config.json", "alibi = true is not supported"});
}

TEST_CASE("Falcon: the backward pass through LayerNorm, GELU and the parallel block equals torch autograd",
          "[hf_config][falcon][backward]") {
  // The shared norm (Falcon-7B), two norms on the layer input (Falcon-40B) and the sequential block;
  // the fused query_key_value's gradient compared part by part.
  for (const char* name : {"falcon_7b_like", "falcon_40b_like", "falcon_sequential"}) {
    INFO(name);
    const double worst = gradient_error(test::fixture(std::string("hf_config/") + name));
    WARN(name << " gradients: largest sampled difference " << worst << " of the tensor's largest entry");
  }
}

TEST_CASE("Phi-3: fused qkv_proj and gate_up_proj split as transformers reads them, from safetensors and GGUF",
          "[hf_config][phi3]") {
  const fs::path dir = test::fixture("hf_config/phi3_fused");
  const Reference ref = load_reference(dir);
  for (const std::string& file : {dir.string(), test::fixture("hf_config/phi3_fused.gguf")}) {
    INFO(file);
    {
      auto m = ModelFile::open(file);
      const ModelConfig& c = m->config();
      CHECK(c.arch == Arch::Phi3);
      CHECK(c.n_kv_heads == 2);
      CHECK(c.sliding_window == 200);
      CHECK(m->tensor("blk.1.ffn_gate.weight").ne == std::vector<uint64_t>{64, 96});
      CHECK(m->find("blk.0.attn_qkv.weight") == nullptr);
    }
    const double err = relative_error(file, ref);
    CHECK(err < 1e-5);
    WARN("phi3" << (fs::is_directory(file) ? " (safetensors)" : " (GGUF)") << ": relative error " << err);
    // Past the sliding window the model's attention would differ from a full one: refused.
    Engine e(*ModelFile::open(file));
    test::require_error([&] { e.prefill(std::vector<int32_t>(201, 3)); }, {"sliding attention window (200 tokens)"});
  }
  const double worst = gradient_error(dir);
  WARN("phi3 gradients: largest sampled difference " << worst << " of the tensor's largest entry");
}
