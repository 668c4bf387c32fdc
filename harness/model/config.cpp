#include "harness/model/config.hpp"

#include <fmt/ranges.h>
#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>
#include <optional>
#include <set>

#include "harness/model/gguf.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {
namespace {

using nlohmann::json;

int to_int(uint64_t v, const std::string& file, std::string_view key) {
  if (v > static_cast<uint64_t>(std::numeric_limits<int>::max())) fail("{}: '{}' = {} is out of range", file, key, v);
  return static_cast<int>(v);
}

void set_falcon_block(ModelConfig& c) {
  c.fused_attn_qkv = true;
  c.layer_norm = true;
  c.gated_mlp = false;
  c.parallel_block = true;
  c.mlp_norm = false;
}

}  // namespace

std::string arch_name(Arch a) {
  switch (a) {
    case Arch::Llama:
      return "llama";
    case Arch::Qwen2:
      return "qwen2";
    case Arch::Qwen3:
      return "qwen3";
    case Arch::Falcon:
      return "falcon";
    case Arch::Phi3:
      return "phi3";
  }
  return "?";
}
const std::vector<std::string>& supported_architectures() {
  static const std::vector<std::string> names{"llama", "mistral", "qwen2", "qwen3", "falcon", "phi3"};
  return names;
}
std::string rope_layout_name(RopeLayout l) { return l == RopeLayout::Interleaved ? "interleaved" : "neox"; }
std::string rope_scaling_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::None:
      return "none";
    case RopeScaling::Type::Linear:
      return "linear";
    case RopeScaling::Type::Llama3:
      return "llama3";
  }
  return "?";
}

void ModelConfig::validate(const std::string& source) const {
  auto positive = [&](int v, std::string_view what) {
    if (v <= 0) fail("{}: {} must be positive, found {}", source, what, v);
  };
  positive(n_layers, "the layer count");
  positive(n_heads, "the head count");
  positive(n_kv_heads, "the KV head count");
  positive(head_dim, "the head dimension");
  positive(hidden, "the hidden size");
  positive(intermediate, "the intermediate size");
  positive(vocab_size, "the vocabulary size");
  positive(context_length, "the context length");
  if (n_heads % n_kv_heads != 0)
    fail("{}: head count {} is not a multiple of the KV head count {}", source, n_heads, n_kv_heads);
  if (head_dim % 2 != 0) fail("{}: head dimension {} must be even for RoPE", source, head_dim);
  // A zero, negative, infinite or NaN value here runs, and gives NaN logits or a broken RoPE.
  auto positive_finite = [&](double v, std::string_view what) {
    if (!(v > 0) || !std::isfinite(v)) fail("{}: {} must be a positive finite number, found {}", source, what, v);
  };
  positive_finite(rope_theta, "rope theta");
  positive_finite(norm_eps, "the norm epsilon");
  if (rope_scaling.type != RopeScaling::Type::None) {
    positive_finite(rope_scaling.factor, "the rope scaling factor");
    if (rope_scaling.type == RopeScaling::Type::Llama3) {
      positive_finite(rope_scaling.low_freq_factor, "llama3 rope scaling's low_freq_factor");
      positive_finite(rope_scaling.high_freq_factor, "llama3 rope scaling's high_freq_factor");
      if (rope_scaling.high_freq_factor <= rope_scaling.low_freq_factor)
        fail("{}: llama3 rope scaling's high_freq_factor {} must exceed its low_freq_factor {}", source,
             rope_scaling.high_freq_factor, rope_scaling.low_freq_factor);
      if (rope_scaling.original_context <= 0)
        fail("{}: llama3 rope scaling's original context length must be positive, found {}", source,
             rope_scaling.original_context);
    }
  }
  for (float f : rope_freq_factors) positive_finite(f, "every rope_freqs entry");
  if (!rope_freq_factors.empty() && rope_freq_factors.size() != static_cast<size_t>(head_dim / 2))
    fail("{}: rope_freqs has {} entries, expected head_dim/2 = {}", source, rope_freq_factors.size(), head_dim / 2);
}

ModelConfig config_from_gguf(const GGUFFile& f) {
  ModelConfig c;
  const std::string& file = f.path();
  c.arch_name = f.get_string("general.architecture");
  if (c.arch_name == "llama") {
    c.arch = Arch::Llama;
    c.rope_layout = RopeLayout::Interleaved;
  } else if (c.arch_name == "qwen2") {
    c.arch = Arch::Qwen2;
    c.rope_layout = RopeLayout::NeoX;
    c.qkv_bias = true;
  } else if (c.arch_name == "qwen3") {
    c.arch = Arch::Qwen3;
    c.rope_layout = RopeLayout::NeoX;
    c.qk_norm = true;
  } else if (c.arch_name == "falcon") {
    c.arch = Arch::Falcon;
    c.rope_layout = RopeLayout::NeoX;
    set_falcon_block(c);
    // llama.cpp's converter stores Falcon-40B's second norm as attn_norm_2 and every fused
    // query_key_value as [Q; K; V].
    c.mlp_norm = f.find_tensor("blk.0.attn_norm_2.weight") != nullptr;
  } else if (c.arch_name == "phi3") {
    c.arch = Arch::Phi3;
    c.rope_layout = RopeLayout::NeoX;
    c.fused_attn_qkv = c.fused_gate_up = true;
  } else {
    fail("{}: general.architecture = '{}' is not supported (expected 'llama', 'qwen2', 'qwen3', 'falcon' or 'phi3')",
         file, c.arch_name);
  }
  c.name = f.get_string_opt("general.name").value_or("");
  const std::string a = c.arch_name + ".";
  auto u = [&](const std::string& k) { return to_int(f.get_uint(a + k), file, a + k); };
  c.n_layers = u("block_count");
  c.context_length = u("context_length");
  c.hidden = u("embedding_length");
  c.intermediate = u("feed_forward_length");
  c.n_heads = u("attention.head_count");
  c.n_kv_heads = f.has(a + "attention.head_count_kv") ? u("attention.head_count_kv") : c.n_heads;
  c.head_dim =
      f.has(a + "attention.key_length") ? u("attention.key_length") : (c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  if (f.has(a + "attention.value_length") && u("attention.value_length") != c.head_dim)
    fail("{}: attention.value_length differs from key_length; not a Llama-family model", file);
  if (f.has(a + "rope.dimension_count") && u("rope.dimension_count") != c.head_dim)
    fail(
        "{}: {}rope.dimension_count = {} but the head dimension is {}: partial rotary embeddings "
        "are not supported",
        file, a, u("rope.dimension_count"), c.head_dim);
  c.rope_theta = f.get_float_opt(a + "rope.freq_base").value_or(10000.0);
  if (f.has(a + "attention.sliding_window")) c.sliding_window = u("attention.sliding_window");
  c.norm_eps = f.get_float(a + (c.layer_norm ? "attention.layer_norm_epsilon" : "attention.layer_norm_rms_epsilon"));
  if (f.has(a + "vocab_size")) {
    c.vocab_size = u("vocab_size");
  } else {
    const GGUFValue* toks = f.find("tokenizer.ggml.tokens");
    if (!toks) fail("{}: neither {}vocab_size nor tokenizer.ggml.tokens is present", file, a);
    c.vocab_size = static_cast<int>(toks->arr.size());
  }
  if (auto st = f.get_string_opt(a + "rope.scaling.type")) {
    if (*st == "linear") {
      c.rope_scaling.factor = f.get_float(a + "rope.scaling.factor");
      // llama.cpp reads a factor of 0 as no scaling (rope_freq_scale_train = 1).
      if (c.rope_scaling.factor != 0) c.rope_scaling.type = RopeScaling::Type::Linear;
    } else if (*st != "none") {
      fail("{}: {}rope.scaling.type = '{}' is not supported (expected 'none' or 'linear')", file, a, *st);
    }
  }
  if (const GGUFTensor* rf = f.find_tensor("rope_freqs.weight")) {
    if (rf->type != DType::F32) fail("{}: tensor 'rope_freqs.weight' must be F32", file);
    c.rope_freq_factors.resize(rf->n_elems);
    std::memcpy(c.rope_freq_factors.data(), rf->data.data(), rf->n_bytes);
  }
  c.tied_embeddings = f.find_tensor("output.weight") == nullptr;
  c.validate(file);
  return c;
}

namespace {

const json& need(const json& j, const char* key, const std::string& file) {
  if (!j.contains(key) || j[key].is_null()) fail("{}: required field '{}' is missing", file, key);
  return j[key];
}

int json_int(const json& j, const char* key, const std::string& file) {
  const json& v = need(j, key, file);
  if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() > std::numeric_limits<int>::max())
    fail("{}: field '{}' must be a non-negative integer, found {}", file, key, v.dump());
  return v.get<int>();
}

double json_num(const json& j, const char* key, const std::string& file) {
  const json& v = need(j, key, file);
  if (!v.is_number()) fail("{}: field '{}' must be a number, found {}", file, key, v.dump());
  return v.get<double>();
}

bool present(const json& j, const char* key) { return j.contains(key) && !j[key].is_null(); }

bool json_flag(const json& j, const char* key, const std::string& file) {
  const json& v = need(j, key, file);
  if (!v.is_boolean()) fail("{}: field '{}' must be true or false, found {}", file, key, v.dump());
  return v.get<bool>();
}

// The RoPE parameters of one dict (transformers 5's `rope_parameters`, or the older `rope_scaling`),
// every key understood or an error: a key kvbench ignored would change the model silently.
struct RopeDict {
  std::string type;             // "default", "linear", "llama3"
  std::optional<double> theta;  // rope_theta, when the dict holds it
  RopeScaling scaling;
};

RopeDict parse_rope_dict(const json& r, const std::string& where, const std::string& file, int64_t max_positions) {
  if (!r.is_object()) fail("{}: '{}' must be an object, found {}", file, where, r.dump());
  RopeDict d;
  if (present(r, "rope_type") && present(r, "type") && r["rope_type"] != r["type"])
    fail("{}: {}.rope_type = {} but {}.type = {}", file, where, r["rope_type"].dump(), where, r["type"].dump());
  const char* type_key = present(r, "rope_type") ? "rope_type" : "type";
  d.type = present(r, type_key) ? r[type_key].get<std::string>() : "default";
  std::set<std::string> known = {"rope_type", "type", "rope_theta", "partial_rotary_factor"};
  if (d.type == "linear") {
    d.scaling.type = RopeScaling::Type::Linear;
    known.insert("factor");
    d.scaling.factor = json_num(r, "factor", file);
  } else if (d.type == "llama3") {
    d.scaling.type = RopeScaling::Type::Llama3;
    known.insert({"factor", "low_freq_factor", "high_freq_factor", "original_max_position_embeddings"});
    d.scaling.factor = json_num(r, "factor", file);
    d.scaling.low_freq_factor = json_num(r, "low_freq_factor", file);
    d.scaling.high_freq_factor = json_num(r, "high_freq_factor", file);
    // transformers fills it in from max_position_embeddings when absent.
    d.scaling.original_context = present(r, "original_max_position_embeddings")
                                     ? json_int(r, "original_max_position_embeddings", file)
                                     : max_positions;
  } else if (d.type != "default") {
    fail("{}: {}.rope_type '{}' is not supported (expected default, linear or llama3)", file, where, d.type);
  }
  for (const auto& [key, value] : r.items())
    if (!known.count(key))
      fail("{}: {}.{} is not understood for rope_type '{}' (known: {})", file, where, key, d.type,
           fmt::format("{}", fmt::join(known, ", ")));
  if (present(r, "rope_theta")) d.theta = json_num(r, "rope_theta", file);
  if (present(r, "partial_rotary_factor") && json_num(r, "partial_rotary_factor", file) != 1.0)
    fail("{}: {}.partial_rotary_factor = {}: partial rotary embeddings are not supported", file, where,
         r["partial_rotary_factor"].dump());
  return d;
}

bool same_scaling(const RopeScaling& a, const RopeScaling& b) {
  return a.type == b.type && a.factor == b.factor && a.low_freq_factor == b.low_freq_factor &&
         a.high_freq_factor == b.high_freq_factor && a.original_context == b.original_context;
}

// RoPE from either layout: transformers 5 writes `rope_parameters` {rope_theta, rope_type, factors}
// (nested per layer type for models that mix attention types); older files write top-level
// `rope_theta` and `rope_scaling`. Both may be present; where they disagree, the file is ambiguous.
void parse_rope(const json& j, ModelConfig& c, const std::string& file) {
  std::optional<RopeDict> modern, legacy;
  if (present(j, "rope_parameters")) {
    const json& rp = j["rope_parameters"];
    if (!rp.is_object()) fail("{}: 'rope_parameters' must be an object, found {}", file, rp.dump());
    std::vector<std::string> nested;
    if (present(j, "layer_types") && j["layer_types"].is_array())
      for (const auto& t : j["layer_types"])
        if (t.is_string() && rp.contains(t.get<std::string>())) nested.push_back(t.get<std::string>());
    if (nested.empty()) {
      modern = parse_rope_dict(rp, "rope_parameters", file, c.context_length);
    } else {
      for (const auto& t : nested) {
        RopeDict d = parse_rope_dict(rp[t], "rope_parameters." + t, file, c.context_length);
        if (modern && (d.theta != modern->theta || !same_scaling(d.scaling, modern->scaling)))
          fail("{}: rope_parameters differ between layer types ({} and {}): per-layer RoPE is not supported", file,
               nested.front(), t);
        modern = d;
      }
    }
  }
  if (present(j, "rope_scaling")) legacy = parse_rope_dict(j["rope_scaling"], "rope_scaling", file, c.context_length);
  std::optional<double> top_theta;
  if (present(j, "rope_theta")) top_theta = json_num(j, "rope_theta", file);
  if (present(j, "partial_rotary_factor") && json_num(j, "partial_rotary_factor", file) != 1.0)
    fail("{}: partial_rotary_factor = {}: partial rotary embeddings are not supported", file,
         j["partial_rotary_factor"].dump());

  if (modern && legacy && !same_scaling(modern->scaling, legacy->scaling))
    fail("{}: rope_parameters (rope_type '{}') and rope_scaling (rope_type '{}') disagree; keep one of them", file,
         modern->type, legacy->type);
  std::vector<std::pair<std::string, double>> thetas;
  if (modern && modern->theta) thetas.emplace_back("rope_parameters.rope_theta", *modern->theta);
  if (legacy && legacy->theta) thetas.emplace_back("rope_scaling.rope_theta", *legacy->theta);
  if (top_theta) thetas.emplace_back("rope_theta", *top_theta);
  for (const auto& [key, value] : thetas)
    if (value != thetas.front().second)
      fail("{}: {} = {} but {} = {}; keep one of them", file, thetas.front().first, thetas.front().second, key, value);
  // 10000 is transformers' default for every architecture read here (RotaryEmbeddingConfigMixin).
  c.rope_theta = thetas.empty() ? 10000.0 : thetas.front().second;
  c.rope_scaling = modern ? modern->scaling : legacy ? legacy->scaling : RopeScaling{};
}

// The attention window the model declares, 0 for none. Qwen2 files carry a sliding_window that applies
// only with use_sliding_window, and then (without layer_types) to the layers from max_window_layers on
// (transformers' default 28); transformers 5 also names each layer's attention in layer_types.
int sliding_window(const json& j, const ModelConfig& c, const std::string& file) {
  bool sliding = present(j, "sliding_window");
  if (c.arch == Arch::Qwen2 || c.arch == Arch::Qwen3) {
    sliding = sliding && j.value("use_sliding_window", false);
    if (!present(j, "layer_types"))
      sliding = sliding && (present(j, "max_window_layers") ? json_int(j, "max_window_layers", file) : 28) < c.n_layers;
  }
  if (present(j, "layer_types") && j["layer_types"].is_array()) {
    bool any = false;
    for (const auto& t : j["layer_types"]) any = any || t == "sliding_attention";
    sliding = sliding && any;
  }
  return sliding ? json_int(j, "sliding_window", file) : 0;
}

// transformers' FalconConfig. Its defaults (multi_query true, parallel_attn true, ...) apply to absent
// keys, as transformers applies them. Variants kvbench does not compute (ALiBi, biased linears) are
// refused.
ModelConfig parse_falcon(const json& j, const std::string& file) {
  ModelConfig c;
  c.arch = Arch::Falcon;
  c.arch_name = "falcon";
  c.rope_layout = RopeLayout::NeoX;
  set_falcon_block(c);
  c.name = j.value("_name_or_path", std::string());
  auto flag = [&](const char* key, bool dflt) { return present(j, key) ? json_flag(j, key, file) : dflt; };
  if (flag("alibi", false)) fail("{}: alibi = true is not supported (kvbench implements Falcon with RoPE)", file);
  if (flag("bias", false)) fail("{}: bias = true is not supported (Falcon-7B/40B's linears have no bias)", file);
  if (flag("apply_residual_connection_post_layernorm", false))
    fail("{}: apply_residual_connection_post_layernorm = true is not supported", file);
  if (present(j, "activation") && j["activation"] != "gelu")
    fail("{}: activation = {} is not supported (expected \"gelu\")", file, j["activation"].dump());
  const bool new_arch = flag("new_decoder_architecture", false), multi_query = flag("multi_query", true);
  const bool parallel = flag("parallel_attn", true);
  c.n_layers = json_int(j, "num_hidden_layers", file);
  c.n_heads = json_int(j, "num_attention_heads", file);
  c.hidden = json_int(j, "hidden_size", file);
  c.head_dim = c.n_heads > 0 ? c.hidden / c.n_heads : 0;
  if (c.n_heads > 0 && c.hidden % c.n_heads != 0)
    fail("{}: hidden_size {} is not a multiple of num_attention_heads {}", file, c.hidden, c.n_heads);
  const int kv_heads = present(j, "num_kv_heads") ? json_int(j, "num_kv_heads", file) : c.n_heads;
  if (new_arch) {
    c.n_kv_heads = kv_heads;
    c.fused_qkv = ModelConfig::FusedQkv::PerKvGroup;
    const int n_ln = present(j, "num_ln_in_parallel_attn") ? json_int(j, "num_ln_in_parallel_attn", file) : 2;
    if (n_ln != 1 && n_ln != 2) fail("{}: num_ln_in_parallel_attn = {}, expected 1 or 2", file, n_ln);
    c.mlp_norm = n_ln == 2;
  } else if (multi_query) {
    c.n_kv_heads = 1;
    c.fused_qkv = ModelConfig::FusedQkv::Blocks;
  } else {
    c.n_kv_heads = c.n_heads;
    c.fused_qkv = ModelConfig::FusedQkv::PerHead;
  }
  if (!new_arch && !parallel) {  // attention, then the MLP on its own norm of the updated stream
    c.parallel_block = false;
    c.mlp_norm = true;
  }
  c.intermediate = present(j, "ffn_hidden_size") ? json_int(j, "ffn_hidden_size", file) : 4 * c.hidden;
  c.vocab_size = json_int(j, "vocab_size", file);
  c.context_length = present(j, "max_position_embeddings") ? json_int(j, "max_position_embeddings", file) : 2048;
  c.norm_eps = present(j, "layer_norm_epsilon") ? json_num(j, "layer_norm_epsilon", file) : 1e-5;
  c.tie_word_embeddings = flag("tie_word_embeddings", true);
  parse_rope(j, c, file);
  c.validate(file);
  return c;
}

ModelConfig parse_hf_config(const std::string& file) {
  std::ifstream in(file);
  if (!in) fail("{}: cannot open (a Hugging Face model directory needs config.json)", file);
  json j;
  try {
    j = json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", file, e.what());
  }
  if (!j.is_object()) fail("{}: a model configuration is a JSON object", file);
  ModelConfig c;
  c.arch_name = j.value("model_type", std::string());
  if (c.arch_name == "llama" || c.arch_name == "mistral") {
    c.arch = Arch::Llama;
  } else if (c.arch_name == "qwen2") {
    c.arch = Arch::Qwen2;
    c.qkv_bias = true;
  } else if (c.arch_name == "qwen3") {
    c.arch = Arch::Qwen3;
    c.qk_norm = true;
  } else if (c.arch_name == "falcon") {
    return parse_falcon(j, file);
  } else if (c.arch_name == "phi3") {
    c.arch = Arch::Phi3;
    c.fused_attn_qkv = c.fused_gate_up = true;
  } else {
    fail("{}: model_type '{}' is not supported (expected one of {})", file, c.arch_name,
         fmt::join(supported_architectures(), ", "));
  }
  c.rope_layout = RopeLayout::NeoX;
  c.name = j.value("_name_or_path", std::string());
  c.n_layers = json_int(j, "num_hidden_layers", file);
  c.n_heads = json_int(j, "num_attention_heads", file);
  c.n_kv_heads = j.contains("num_key_value_heads") && !j["num_key_value_heads"].is_null()
                     ? json_int(j, "num_key_value_heads", file)
                     : c.n_heads;
  c.hidden = json_int(j, "hidden_size", file);
  c.intermediate = json_int(j, "intermediate_size", file);
  // Qwen3Config's head_dim defaults to 128, not hidden / heads.
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null() ? json_int(j, "head_dim", file)
               : c.arch == Arch::Qwen3                            ? 128
                                                                  : (c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.vocab_size = json_int(j, "vocab_size", file);
  c.context_length = json_int(j, "max_position_embeddings", file);
  c.norm_eps = json_num(j, "rms_norm_eps", file);
  if (present(j, "tie_word_embeddings")) c.tie_word_embeddings = json_flag(j, "tie_word_embeddings", file);
  // transformers' Llama and Qwen3 put attention_bias on o_proj as well as on q, k and v; Mistral's
  // and Phi-3's attention have no biases whatever the key says.
  if ((c.arch_name == "llama" || c.arch == Arch::Qwen3) && present(j, "attention_bias") &&
      json_flag(j, "attention_bias", file))
    fail(
        "{}: attention_bias = true is not supported (transformers adds biases to q, k, v and o_proj; kvbench "
        "computes Qwen2's q/k/v biases only)",
        file);
  // Keys that would change the computation kvbench implements: refused rather than ignored.
  if (present(j, "hidden_act") && j["hidden_act"] != "silu")
    fail("{}: hidden_act = {} is not supported (expected \"silu\")", file, j["hidden_act"].dump());
  if (j.value("mlp_bias", false)) fail("{}: mlp_bias = true is not supported", file);
  c.sliding_window = sliding_window(j, c, file);
  parse_rope(j, c, file);
  c.validate(file);
  return c;
}

}  // namespace

ModelConfig config_from_hf_dir(const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  return with_json_errors(file, [&] { return parse_hf_config(file); });
}

}  // namespace kvb
