#include "harness/model/config.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "harness/model/gguf.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {
namespace {

using nlohmann::json;

int to_int(uint64_t v, const std::string& file, std::string_view key) {
  if (v > static_cast<uint64_t>(std::numeric_limits<int>::max()))
    fail("{}: '{}' = {} is out of range", file, key, v);
  return static_cast<int>(v);
}

}  // namespace

std::string arch_name(Arch a) { return a == Arch::Llama ? "llama" : "qwen2"; }
std::string rope_layout_name(RopeLayout l) {
  return l == RopeLayout::Interleaved ? "interleaved" : "neox";
}
std::string rope_scaling_name(RopeScaling::Type t) {
  switch (t) {
    case RopeScaling::Type::None: return "none";
    case RopeScaling::Type::Linear: return "linear";
    case RopeScaling::Type::Llama3: return "llama3";
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
  if (!(rope_theta > 0)) fail("{}: rope theta must be positive, found {}", source, rope_theta);
  if (!(rms_eps > 0)) fail("{}: RMSNorm epsilon must be positive, found {}", source, rms_eps);
  if (!rope_freq_factors.empty() && rope_freq_factors.size() != static_cast<size_t>(head_dim / 2))
    fail("{}: rope_freqs has {} entries, expected head_dim/2 = {}", source,
         rope_freq_factors.size(), head_dim / 2);
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
  } else {
    fail("{}: general.architecture = '{}' is not supported (expected 'llama' or 'qwen2')", file,
         c.arch_name);
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
  c.head_dim = f.has(a + "attention.key_length") ? u("attention.key_length")
                                                  : (c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  if (f.has(a + "attention.value_length") && u("attention.value_length") != c.head_dim)
    fail("{}: attention.value_length differs from key_length; not a Llama-family model", file);
  if (f.has(a + "rope.dimension_count") && u("rope.dimension_count") != c.head_dim)
    fail("{}: {}rope.dimension_count = {} but the head dimension is {}: partial rotary embeddings "
         "are not supported",
         file, a, u("rope.dimension_count"), c.head_dim);
  c.rope_theta = f.get_float_opt(a + "rope.freq_base").value_or(10000.0);
  c.rms_eps = f.get_float(a + "attention.layer_norm_rms_epsilon");
  if (f.has(a + "vocab_size")) {
    c.vocab_size = u("vocab_size");
  } else {
    const GGUFValue* toks = f.find("tokenizer.ggml.tokens");
    if (!toks) fail("{}: neither {}vocab_size nor tokenizer.ggml.tokens is present", file, a);
    c.vocab_size = static_cast<int>(toks->arr.size());
  }
  if (auto st = f.get_string_opt(a + "rope.scaling.type")) {
    if (*st == "linear") {
      c.rope_scaling.type = RopeScaling::Type::Linear;
      c.rope_scaling.factor = f.get_float(a + "rope.scaling.factor");
    } else if (*st != "none") {
      fail("{}: {}rope.scaling.type = '{}' is not supported (expected 'none' or 'linear')", file, a,
           *st);
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
  if (!v.is_number_integer() || v.get<int64_t>() < 0 ||
      v.get<int64_t>() > std::numeric_limits<int>::max())
    fail("{}: field '{}' must be a non-negative integer, found {}", file, key, v.dump());
  return v.get<int>();
}

double json_num(const json& j, const char* key, const std::string& file) {
  const json& v = need(j, key, file);
  if (!v.is_number()) fail("{}: field '{}' must be a number, found {}", file, key, v.dump());
  return v.get<double>();
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
  } else {
    fail("{}: model_type '{}' is not supported (expected llama, mistral or qwen2)", file,
         c.arch_name);
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
  c.head_dim = j.contains("head_dim") && !j["head_dim"].is_null()
                   ? json_int(j, "head_dim", file)
                   : (c.n_heads > 0 ? c.hidden / c.n_heads : 0);
  c.vocab_size = json_int(j, "vocab_size", file);
  c.context_length = json_int(j, "max_position_embeddings", file);
  c.rope_theta = j.contains("rope_theta") ? json_num(j, "rope_theta", file) : 10000.0;
  c.rms_eps = json_num(j, "rms_norm_eps", file);
  c.tied_embeddings = j.value("tie_word_embeddings", false);
  if (c.arch == Arch::Llama && j.value("attention_bias", false)) c.qkv_bias = true;
  if (j.contains("sliding_window") && j["sliding_window"].is_number_integer())
    c.sliding_window = j["sliding_window"].get<int>();
  if (j.contains("rope_scaling") && !j["rope_scaling"].is_null()) {
    const json& rs = j["rope_scaling"];
    if (!rs.is_object()) fail("{}: 'rope_scaling' must be an object", file);
    const std::string type = rs.value("rope_type", rs.value("type", std::string()));
    if (type == "linear") {
      c.rope_scaling.type = RopeScaling::Type::Linear;
      c.rope_scaling.factor = json_num(rs, "factor", file);
    } else if (type == "llama3") {
      c.rope_scaling.type = RopeScaling::Type::Llama3;
      c.rope_scaling.factor = json_num(rs, "factor", file);
      c.rope_scaling.low_freq_factor = json_num(rs, "low_freq_factor", file);
      c.rope_scaling.high_freq_factor = json_num(rs, "high_freq_factor", file);
      c.rope_scaling.original_context = json_int(rs, "original_max_position_embeddings", file);
    } else if (type != "default") {
      fail("{}: rope_scaling type '{}' is not supported (expected linear or llama3)", file, type);
    }
  }
  c.validate(file);
  return c;
}

}  // namespace

ModelConfig config_from_hf_dir(const std::string& dir) {
  const std::string file = (std::filesystem::path(dir) / "config.json").string();
  return with_json_errors(file, [&] { return parse_hf_config(file); });
}

}  // namespace kvb
