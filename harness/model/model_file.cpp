#include "harness/model/model_file.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>

#include "harness/model/gguf.hpp"
#include "harness/model/safetensors.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"
#include "kernels/cpu/dequant.hpp"

namespace kvb {

uint64_t TensorRef::n_elems() const {
  uint64_t n = 1;
  for (auto d : ne) n *= d;
  return n;
}

std::optional<std::string> canonical_tensor_name(const std::string& hf) {
  static const std::pair<const char*, const char*> global[] = {
      {"model.embed_tokens.weight", "token_embd.weight"},
      {"model.norm.weight", "output_norm.weight"},
      {"lm_head.weight", "output.weight"},
  };
  for (const auto& [from, to] : global)
    if (hf == from) return std::string(to);
  static const std::pair<const char*, const char*> per_layer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},    {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},          {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},          {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"}, {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},           {"mlp.down_proj.weight", "ffn_down.weight"},
  };
  static const std::regex layer_re(R"(model\.layers\.(\d+)\.(.+))");
  std::smatch m;
  if (!std::regex_match(hf, m, layer_re)) return std::nullopt;
  for (const auto& [from, to] : per_layer)
    if (m[2] == from) return fmt::format("blk.{}.{}", m[1].str(), to);
  return std::nullopt;
}

ModelFile::~ModelFile() = default;

std::unique_ptr<ModelFile> ModelFile::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::unique_ptr<ModelFile> m(new ModelFile());
  m->path_ = path;
  if (!fs::exists(path)) fail("{}: no such file or directory (run scripts/setup.sh to fetch the default model)", path);
  if (fs::is_directory(path)) {
    m->config_ = config_from_hf_dir(path);
    m->st_ = std::make_unique<SafetensorsModel>(SafetensorsModel::open_dir(path));
    for (const auto& [name, t] : m->st_->tensors()) {
      auto canon = canonical_tensor_name(name);
      if (!canon) continue;  // e.g. rotary inv_freq buffers saved by old exporters
      TensorRef r{*canon, t.type, std::vector<uint64_t>(t.shape.rbegin(), t.shape.rend()), t.data};
      m->tensors_.push_back(std::move(r));
    }
  } else {
    m->gguf_ = std::make_unique<GGUFFile>(GGUFFile::open(path));
    m->config_ = config_from_gguf(*m->gguf_);
    for (const auto& t : m->gguf_->tensors()) m->tensors_.push_back(TensorRef{t.name, t.type, t.ne, t.data});
  }
  std::sort(m->tensors_.begin(), m->tensors_.end(),
            [](const TensorRef& a, const TensorRef& b) { return a.name < b.name; });
  if (m->st_) m->config_.tied_embeddings = m->find("output.weight") == nullptr;
  m->config_.fingerprint = model_fingerprint(path);
  return m;
}

std::string model_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    // Names and sizes, in name order (directory iteration order differs between file systems).
    std::vector<std::pair<std::string, uint64_t>> files;
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file()) files.emplace_back(e.path().filename().string(), e.file_size());
    std::sort(files.begin(), files.end());
    uint64_t h = 0xcbf29ce484222325ull;
    for (const auto& [name, size] : files) h = fnv1a(fmt::format("{}:{};", name, size), h);
    return fmt::format("dir-{:016x}", h);
  }
  const uint64_t size = fs::file_size(path);
  std::ifstream in(path, std::ios::binary);
  std::string head(std::min<uint64_t>(size, 1 << 20), '\0'), tail(head.size(), '\0');
  in.read(head.data(), static_cast<std::streamsize>(head.size()));
  in.seekg(static_cast<std::streamoff>(size - tail.size()));
  in.read(tail.data(), static_cast<std::streamsize>(tail.size()));
  return fmt::format("{}-{:016x}", size, fnv1a(tail, fnv1a(head)));
}

const TensorRef* ModelFile::find(const std::string& name) const {
  auto it = std::lower_bound(tensors_.begin(), tensors_.end(), name,
                             [](const TensorRef& t, const std::string& n) { return t.name < n; });
  return it != tensors_.end() && it->name == name ? &*it : nullptr;
}

const TensorRef& ModelFile::tensor(const std::string& name) const {
  const TensorRef* t = find(name);
  if (!t) fail("{}: tensor '{}' is missing", path_, name);
  return *t;
}

void ModelFile::validate_tensors() const {
  const ModelConfig& c = config_;
  const auto H = static_cast<uint64_t>(c.hidden), F = static_cast<uint64_t>(c.intermediate),
             V = static_cast<uint64_t>(c.vocab_size);
  const auto Q = static_cast<uint64_t>(c.n_heads) * c.head_dim;
  const auto KV = static_cast<uint64_t>(c.n_kv_heads) * c.head_dim;
  auto check = [&](const std::string& name, std::vector<uint64_t> ne) {
    const TensorRef& t = tensor(name);
    if (t.ne != ne)
      fail("{}: tensor '{}' has shape [{}], expected [{}] from the model config", path_, name, fmt::join(t.ne, ", "),
           fmt::join(ne, ", "));
    if (!dtype_info(t.type).dequantizable)
      fail("{}: tensor '{}' has type {}, which kvbench cannot dequantize", path_, name, dtype_name(t.type));
  };
  check("token_embd.weight", {H, V});
  check("output_norm.weight", {H});
  if (!c.tied_embeddings) check("output.weight", {H, V});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    check(b + "attn_norm.weight", {H});
    check(b + "ffn_norm.weight", {H});
    check(b + "attn_q.weight", {H, Q});
    check(b + "attn_k.weight", {H, KV});
    check(b + "attn_v.weight", {H, KV});
    check(b + "attn_output.weight", {Q, H});
    check(b + "ffn_gate.weight", {H, F});
    check(b + "ffn_up.weight", {H, F});
    check(b + "ffn_down.weight", {F, H});
    if (c.qkv_bias) {
      check(b + "attn_q.bias", {Q});
      check(b + "attn_k.bias", {KV});
      check(b + "attn_v.bias", {KV});
    }
    if (c.qk_norm) {
      check(b + "attn_q_norm.weight", {uint64_t(c.head_dim)});
      check(b + "attn_k_norm.weight", {uint64_t(c.head_dim)});
    }
  }
}

std::vector<float> ModelFile::load_f32(const std::string& name) const {
  const TensorRef& t = tensor(name);
  std::vector<float> out(t.n_elems());
  dequantize(t.type, t.data.data(), out.data(), out.size());
  return out;
}

}  // namespace kvb
