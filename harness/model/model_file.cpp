#include "harness/model/model_file.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <regex>
#include <set>

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
      {"transformer.word_embeddings.weight", "token_embd.weight"},
      {"transformer.ln_f.weight", "output_norm.weight"},
      {"transformer.ln_f.bias", "output_norm.bias"},
  };
  for (const auto& [from, to] : global)
    if (hf == from) return std::string(to);
  static const std::pair<const char*, const char*> per_layer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"self_attn.q_proj.weight", "attn_q.weight"},
      {"self_attn.k_proj.weight", "attn_k.weight"},
      {"self_attn.v_proj.weight", "attn_v.weight"},
      {"self_attn.o_proj.weight", "attn_output.weight"},
      {"self_attn.q_proj.bias", "attn_q.bias"},
      {"self_attn.k_proj.bias", "attn_k.bias"},
      {"self_attn.v_proj.bias", "attn_v.bias"},
      {"self_attn.q_norm.weight", "attn_q_norm.weight"},
      {"self_attn.k_norm.weight", "attn_k_norm.weight"},
      {"mlp.gate_proj.weight", "ffn_gate.weight"},
      {"mlp.up_proj.weight", "ffn_up.weight"},
      {"mlp.down_proj.weight", "ffn_down.weight"},
      // Phi-3's fused projections, split after loading.
      {"self_attn.qkv_proj.weight", "attn_qkv.weight"},
      {"mlp.gate_up_proj.weight", "ffn_up.weight"},
  };
  // Falcon's, with llama.cpp's names: the fused query_key_value is split after loading.
  static const std::pair<const char*, const char*> falcon_layer[] = {
      {"input_layernorm.weight", "attn_norm.weight"},
      {"input_layernorm.bias", "attn_norm.bias"},
      {"ln_attn.weight", "attn_norm.weight"},
      {"ln_attn.bias", "attn_norm.bias"},
      {"ln_mlp.weight", "attn_norm_2.weight"},
      {"ln_mlp.bias", "attn_norm_2.bias"},
      {"post_attention_layernorm.weight", "ffn_norm.weight"},
      {"post_attention_layernorm.bias", "ffn_norm.bias"},
      {"self_attention.query_key_value.weight", "attn_qkv.weight"},
      {"self_attention.dense.weight", "attn_output.weight"},
      {"mlp.dense_h_to_4h.weight", "ffn_up.weight"},
      {"mlp.dense_4h_to_h.weight", "ffn_down.weight"},
  };
  static const std::regex layer_re(R"(model\.layers\.(\d+)\.(.+))"), falcon_re(R"(transformer\.h\.(\d+)\.(.+))");
  std::smatch m;
  const bool falcon = std::regex_match(hf, m, falcon_re);
  if (!falcon && !std::regex_match(hf, m, layer_re)) return std::nullopt;
  using Names = std::span<const std::pair<const char*, const char*>>;
  for (const auto& [from, to] : falcon ? Names(falcon_layer) : Names(per_layer))
    if (m[2] == from) return fmt::format("blk.{}.{}", m[1].str(), to);
  return std::nullopt;
}

const char* mlp_norm_name(const ModelConfig& c) { return c.parallel_block ? "attn_norm_2" : "ffn_norm"; }

ModelFile::~ModelFile() = default;

std::unique_ptr<ModelFile> ModelFile::open(const std::string& path) {
  namespace fs = std::filesystem;
  std::unique_ptr<ModelFile> m(new ModelFile());
  m->path_ = path;
  if (!fs::exists(path))
    fail("{}: no such file or directory{}", path,
         fs::path(path).filename() == "SmolLM2-135M-Instruct.Q4_1.gguf"
             ? " (the default model: scripts/setup.sh fetches it)"
             : "");
  if (fs::is_directory(path)) {
    m->config_ = config_from_hf_dir(path);
    m->st_ = std::make_unique<SafetensorsModel>(SafetensorsModel::open_dir(path));
    for (const auto& [name, t] : m->st_->tensors()) {
      auto canon = canonical_tensor_name(name);
      if (!canon) {
        // Rotary inv_freq buffers (old exporters) are recomputed from the config; anything else is a
        // part of the checkpoint's model kvbench would not compute, reported by validate_tensors.
        if (!name.ends_with("rotary_emb.inv_freq")) m->unmapped_.push_back(name);
        continue;
      }
      TensorRef r{*canon, t.type, std::vector<uint64_t>(t.shape.rbegin(), t.shape.rend()), t.data, name};
      m->tensors_.push_back(std::move(r));
    }
  } else {
    m->gguf_ = std::make_unique<GGUFFile>(GGUFFile::open(path));
    m->config_ = config_from_gguf(*m->gguf_);
    for (const auto& t : m->gguf_->tensors()) m->tensors_.push_back(TensorRef{t.name, t.type, t.ne, t.data});
  }
  std::sort(m->tensors_.begin(), m->tensors_.end(),
            [](const TensorRef& a, const TensorRef& b) { return a.name < b.name; });
  if (m->st_) {
    // As transformers 5: a config that unties needs lm_head.weight (transformers would start it from
    // random numbers); one that ties reads the embeddings unless the checkpoint's lm_head.weight differs
    // from them, which transformers then keeps untied (transformers 4 tied them); one that says nothing
    // leaves it to the weights.
    const TensorRef* head = m->find("output.weight");
    const TensorRef* embd = m->find("token_embd.weight");
    const std::optional<bool> tie = m->config_.tie_word_embeddings;
    if (tie == false && !head)
      fail("{}: config.json says tie_word_embeddings = false, but the weights hold no lm_head.weight", path);
    const bool copy = head && embd && head->type == embd->type && head->ne == embd->ne &&
                      std::equal(head->data.begin(), head->data.end(), embd->data.begin(), embd->data.end());
    m->config_.tied_embeddings = tie.value_or(!head) && (!head || copy);
    if (tie == true && head && !copy)
      fmt::print(stderr,
                 "{}: config.json ties the word embeddings, but lm_head.weight differs from them; the output head "
                 "reads lm_head.weight, as transformers 5 does\n",
                 path);
  }
  m->config_.fingerprint = model_fingerprint(path);
  m->split_fused();
  return m;
}

// Each attn_qkv.weight [(hq + 2 hkv) d rows, H] becomes attn_q/k/v.weight, each fused ffn_up.weight
// [2F rows, H] ffn_gate.weight then ffn_up.weight. A part that is one run of rows is a view of the file;
// one scattered over the rows (grouped or per-head layouts) is gathered once.
void ModelFile::split_fused() {
  const ModelConfig& c = config_;
  const int d = c.head_dim, hq = c.n_heads, hkv = c.n_kv_heads, group = hq / hkv;
  const auto H = static_cast<uint64_t>(c.hidden);
  std::vector<TensorRef> parts;
  std::set<std::string> fused;
  // Splits layer l's `what` ([unit x units rows, H]) into parts made of the listed units, in order.
  auto split = [&](int l, const std::string& what, int unit, int units, const std::string& layout,
                   const std::vector<std::pair<std::string, std::vector<int>>>& want) {
    const std::string prefix = fmt::format("blk.{}.", l), name = prefix + what;
    const TensorRef& t = tensor(name);
    const uint64_t rows = uint64_t(unit) * units;
    if (t.ne != std::vector<uint64_t>{H, rows})
      fail("{}: tensor '{}' has shape [{}], expected [{}, {}] ({})", path_, name, fmt::join(t.ne, ", "), H, rows,
           layout);
    const DTypeInfo& info = dtype_info(t.type);
    if (H % info.block_elems != 0)
      fail("{}: tensor '{}': rows of {} elements do not hold whole {} blocks", path_, name, H, dtype_name(t.type));
    const size_t unit_bytes = H / info.block_elems * info.block_bytes * size_t(unit);
    for (const auto& [part, b] : want) {
      TensorRef r{prefix + part, t.type, {H, uint64_t(b.size()) * unit}, {}};
      if (b.back() - b.front() + 1 == static_cast<int>(b.size())) {
        r.data = t.data.subspan(size_t(b.front()) * unit_bytes, b.size() * unit_bytes);
      } else {
        auto& own = owned_.emplace_back(b.size() * unit_bytes);
        for (size_t i = 0; i < b.size(); ++i)
          std::copy_n(t.data.data() + size_t(b[i]) * unit_bytes, unit_bytes, own.data() + i * unit_bytes);
        r.data = own;
      }
      parts.push_back(std::move(r));
    }
    fused.insert(name);
  };
  if (c.fused_attn_qkv) {
    // The head-row blocks (of d rows) that make up Q, K and V, in order.
    std::vector<int> q, k, v;
    for (int g = 0; g < hkv; ++g)
      for (int j = 0; j < group; ++j) {
        const int h = g * group + j;
        switch (c.fused_qkv) {
          case ModelConfig::FusedQkv::Blocks:
            q.push_back(h);
            if (j == 0) k.push_back(hq + g), v.push_back(hq + hkv + g);
            break;
          case ModelConfig::FusedQkv::PerKvGroup:
            q.push_back(g * (group + 2) + j);
            if (j == 0) k.push_back(g * (group + 2) + group), v.push_back(g * (group + 2) + group + 1);
            break;
          case ModelConfig::FusedQkv::PerHead:  // hq == hkv
            q.push_back(3 * h), k.push_back(3 * h + 1), v.push_back(3 * h + 2);
            break;
        }
      }
    const std::string layout = fmt::format("{} query and {} KV heads of {}", hq, hkv, d);
    for (int l = 0; l < c.n_layers; ++l)
      split(l, "attn_qkv.weight", d, hq + 2 * hkv, layout,
            {{"attn_q.weight", q}, {"attn_k.weight", k}, {"attn_v.weight", v}});
  }
  if (c.fused_gate_up)
    for (int l = 0; l < c.n_layers; ++l)
      split(l, "ffn_up.weight", c.intermediate, 2, "gate and up, each of the intermediate size",
            {{"ffn_gate.weight", {0}}, {"ffn_up.weight", {1}}});
  // The views stay valid without the fused entries: the file's mapping owns the bytes.
  std::erase_if(tensors_, [&](const TensorRef& t) { return fused.count(t.name) > 0; });
  for (auto& p : parts) tensors_.push_back(std::move(p));
  std::sort(tensors_.begin(), tensors_.end(), [](const TensorRef& a, const TensorRef& b) { return a.name < b.name; });
}

namespace {

// Hash of `count` chunks of `chunk` bytes spread evenly over a file, the first and last included (the
// whole file when it is smaller).
uint64_t sampled_content_hash(const std::string& path, uint64_t size, uint64_t chunk, int count, uint64_t h) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read", path);
  const int n = size <= chunk * uint64_t(count) ? 1 : count;
  const uint64_t len = n == 1 ? size : chunk;
  std::string buf(len, '\0');
  for (int i = 0; i < n; ++i) {
    const uint64_t at = n == 1 ? 0 : (size - chunk) * uint64_t(i) / uint64_t(n - 1);
    in.seekg(static_cast<std::streamoff>(at));
    in.read(buf.data(), static_cast<std::streamsize>(len));
    h = fnv1a(buf, h);
  }
  return h;
}

}  // namespace

std::string model_fingerprint(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) {
    // Names, sizes and sampled contents, in name order (directory iteration order differs between file
    // systems). Contents, because a fine-tune and its base have files of the same names and sizes; 64
    // chunks per file, because a merged LoRA may change only a few tensors of a shard.
    std::vector<std::pair<std::string, uint64_t>> files;
    for (const auto& e : fs::directory_iterator(path))
      if (e.is_regular_file()) files.emplace_back(e.path().filename().string(), e.file_size());
    std::sort(files.begin(), files.end());
    uint64_t h = 0xcbf29ce484222325ull;
    for (const auto& [name, size] : files) {
      h = fnv1a(fmt::format("{}:{};", name, size), h);
      h = sampled_content_hash((fs::path(path) / name).string(), size, 64 << 10, 64, h);
    }
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
  std::set<std::string> used;
  auto check = [&](const std::string& name, std::vector<uint64_t> ne) {
    used.insert(name);
    const TensorRef& t = tensor(name);
    if (t.ne != ne && !t.source.empty())  // as the checkpoint names and shapes it
      fail("{}: tensor '{}' (kvbench's {}) has shape [{}], expected [{}] from config.json", path_, t.source, name,
           fmt::join(t.ne.rbegin(), t.ne.rend(), ", "), fmt::join(ne.rbegin(), ne.rend(), ", "));
    if (t.ne != ne)
      fail("{}: tensor '{}' has shape [{}], expected [{}] from the model config", path_, name, fmt::join(t.ne, ", "),
           fmt::join(ne, ", "));
    if (!dtype_info(t.type).dequantizable)
      fail("{}: tensor '{}' has type {}, which kvbench cannot dequantize", path_, name, dtype_name(t.type));
  };
  // A norm's weight, and its bias for LayerNorm.
  auto check_norm = [&](const std::string& name) {
    check(name + ".weight", {H});
    if (c.layer_norm) check(name + ".bias", {H});
  };
  check("token_embd.weight", {H, V});
  check_norm("output_norm");
  if (!c.tied_embeddings) check("output.weight", {H, V});
  for (int l = 0; l < c.n_layers; ++l) {
    const std::string b = fmt::format("blk.{}.", l);
    check_norm(b + "attn_norm");
    if (c.mlp_norm) check_norm(b + mlp_norm_name(c));
    check(b + "attn_q.weight", {H, Q});
    check(b + "attn_k.weight", {H, KV});
    check(b + "attn_v.weight", {H, KV});
    check(b + "attn_output.weight", {Q, H});
    if (c.gated_mlp) check(b + "ffn_gate.weight", {H, F});
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
  // A tensor the model does not read (a bias on o_proj, a layer beyond num_hidden_layers) means the
  // checkpoint computes something else than what kvbench would: refused, as transformers would not
  // load it silently either. GGUF's rope_freqs is read into the config; a tied model's saved
  // lm_head.weight is a copy of the embeddings.
  auto ignored = [&](const std::string& name) {
    return name == "rope_freqs.weight" || (name == "output.weight" && c.tied_embeddings);
  };
  std::vector<std::string> unused = unmapped_;
  for (const TensorRef& t : tensors_)
    if (!used.count(t.name) && !ignored(t.name)) unused.push_back(t.source.empty() ? t.name : t.source);
  for (const std::string& name : unused)
    if (name.starts_with("rope_factors_"))
      fail("{}: tensor '{}' holds LongRoPE's factors (Phi-3-128k, Phi-3.5), which kvbench does not compute", path_,
           name);
  if (!unused.empty())
    fail(
        "{}: tensor '{}'{} is no part of the {} model its config describes: kvbench would ignore it and compute "
        "another model than the checkpoint's",
        path_, unused.front(), unused.size() > 1 ? fmt::format(" (and {} more)", unused.size() - 1) : std::string(),
        c.arch_name);
}

std::vector<float> ModelFile::load_f32(const std::string& name) const {
  const TensorRef& t = tensor(name);
  std::vector<float> out(t.n_elems());
  dequantize(t.type, t.data.data(), out.data(), out.size());
  return out;
}

}  // namespace kvb
