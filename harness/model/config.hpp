#pragma once
// Architecture hyper-parameters of a decoder-only transformer (the Llama family, and Falcon's parallel
// block), read from GGUF metadata or a Hugging Face config.json. Both sources produce the same struct so
// the engine never cares where weights came from.
#include <cstdint>
#include <optional>
#include <string>
#include <vector>

namespace kvb {

class GGUFFile;

enum class Arch { Llama, Qwen2, Qwen3, Falcon, Phi3 };

// Which dimensions RoPE rotates together. GGUF llama files store Q/K rows permuted for adjacent pairs
// (2i, 2i+1); Hugging Face checkpoints and GGUF qwen2 use the half-split pairs (i, i + d/2).
enum class RopeLayout { Interleaved, NeoX };

struct RopeScaling {
  enum class Type { None, Linear, Llama3 };
  Type type = Type::None;
  double factor = 1.0;
  double low_freq_factor = 1.0;   // llama3
  double high_freq_factor = 4.0;  // llama3
  int64_t original_context = 0;   // llama3: original_max_position_embeddings
};

struct ModelConfig {
  Arch arch = Arch::Llama;
  std::string arch_name;  // as written in the file ("llama", "qwen2", "mistral", ...)
  std::string name;
  int n_layers = 0;
  int n_heads = 0;
  int n_kv_heads = 0;
  int head_dim = 0;
  int hidden = 0;
  int intermediate = 0;
  int vocab_size = 0;
  int context_length = 0;
  double rope_theta = 10000.0;
  RopeScaling rope_scaling;
  RopeLayout rope_layout = RopeLayout::NeoX;
  // Per-frequency divisors stored in a GGUF file (rope_freqs.weight, Llama 3.1 style); empty if none.
  std::vector<float> rope_freq_factors;
  double norm_eps = 1e-6;  // RMSNorm's epsilon, or LayerNorm's with layer_norm
  // Falcon's block: LayerNorm with bias in place of RMSNorm, an MLP down(gelu(up(h))) in place of
  // SwiGLU, and attention and MLP side by side, x + attn(norm(x)) + mlp(norm'(x)). norm' is the
  // attention's own norm (Falcon-7B: one LayerNorm per layer) unless mlp_norm says the layer has a
  // second one (Falcon-40B's ln_mlp, GGUF attn_norm_2).
  bool layer_norm = false;
  bool gated_mlp = true;
  bool parallel_block = false;
  bool mlp_norm = true;
  // How a fused query_key_value matrix (Falcon) orders its rows, in blocks of head_dim: [Q; K; V]
  // (every GGUF file, multi-query checkpoints), per KV head [its query heads; K; V]
  // (new_decoder_architecture), or per head [q; k; v].
  enum class FusedQkv { Blocks, PerKvGroup, PerHead };
  FusedQkv fused_qkv = FusedQkv::Blocks;
  // Which fused matrices the file holds and the loader splits (names as llama.cpp's): attn_qkv.weight
  // (Falcon, Phi-3) and ffn_up.weight of 2 x intermediate rows, gate then up (Phi-3's gate_up_proj).
  bool fused_attn_qkv = false;
  bool fused_gate_up = false;
  bool tied_embeddings = false;
  // What a Hugging Face config.json says of tying (Falcon's class ties by default); none where it is
  // silent, and the weights decide (ModelFile::open).
  std::optional<bool> tie_word_embeddings;
  bool qkv_bias = false;
  // Qwen3: an RMSNorm over each head's query and key (weights [head_dim], shared by the heads) after
  // the projections and before RoPE.
  bool qk_norm = false;
  // The attention window the model applies (Mistral v0.1; Qwen2 with use_sliding_window), 0 = none. Not
  // implemented: the engine refuses sequences longer than it.
  int sliding_window = 0;
  // model_fingerprint() of the file the config was read from (offline artifacts are keyed by it);
  // empty for configs built in memory.
  std::string fingerprint;

  int gqa_group() const { return n_heads / n_kv_heads; }
  // Checks internal consistency; `source` names the file in the error.
  void validate(const std::string& source) const;
};

ModelConfig config_from_gguf(const GGUFFile& f);
// Parses `<dir>/config.json`.
ModelConfig config_from_hf_dir(const std::string& dir);

std::string arch_name(Arch a);
// The architectures the loader reads, by their Hugging Face model_type (a GGUF writes mistral as llama).
const std::vector<std::string>& supported_architectures();
std::string rope_layout_name(RopeLayout l);
std::string rope_scaling_name(RopeScaling::Type t);

}  // namespace kvb
