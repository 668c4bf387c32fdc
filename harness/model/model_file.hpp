#pragma once
// A model on disk, whatever its format: a GGUF file or a Hugging Face directory (config.json +
// safetensors). Tensors are exposed under one naming scheme (GGUF's: token_embd.weight,
// blk.N.attn_q.weight, ...) with dimensions in ggml order (ne[0] fastest), so the engine loads both
// formats through one path.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "harness/model/config.hpp"
#include "kernels/dtype.hpp"

namespace kvb {

class GGUFFile;
class SafetensorsModel;

struct TensorRef {
  std::string name;  // canonical (GGUF) name
  DType type = DType::F32;
  std::vector<uint64_t> ne;  // ne[0] varies fastest
  std::span<const uint8_t> data;
  std::string source = {};  // the name in a Hugging Face checkpoint, whose shape lists ne reversed (torch order)
  uint64_t n_elems() const;
};

class ModelFile {
 public:
  // `path` is a .gguf file or a directory holding config.json.
  static std::unique_ptr<ModelFile> open(const std::string& path);
  ~ModelFile();

  const std::string& path() const { return path_; }
  const ModelConfig& config() const { return config_; }
  bool is_gguf() const { return gguf_ != nullptr; }
  const GGUFFile* gguf() const { return gguf_.get(); }  // null for a HF directory
  const std::vector<TensorRef>& tensors() const { return tensors_; }
  const TensorRef* find(const std::string& name) const;
  const TensorRef& tensor(const std::string& name) const;  // Error naming the file if absent

  // Checks that every tensor the architecture needs is present with the shape the config implies.
  void validate_tensors() const;
  // Dequantized copy of a tensor as fp32 (any supported type).
  std::vector<float> load_f32(const std::string& name) const;

 private:
  ModelFile() = default;
  std::string path_;
  ModelConfig config_;
  std::unique_ptr<GGUFFile> gguf_;
  std::unique_ptr<SafetensorsModel> st_;
  std::vector<TensorRef> tensors_;
  // Checkpoint tensors kvbench has no name for, kept for validate_tensors to report.
  std::vector<std::string> unmapped_;
  // Rows gathered out of a fused tensor whose parts are not contiguous in it (Falcon's grouped
  // query_key_value); tensors_ points into them.
  std::vector<std::vector<uint8_t>> owned_;
  void split_fused();
};

// Size and hash of the first and last MiB of a file (a directory: its files' names, sizes and 64 chunks
// of each): cheap, and changes with any re-quantisation or fine-tune. Results and offline artifacts are
// keyed by it.
std::string model_fingerprint(const std::string& path);

// The layer tensor (without .weight) of the norm in front of the MLP when the config has one
// (c.mlp_norm): ffn_norm, or attn_norm_2 beside attn_norm in a parallel block (llama.cpp's name).
const char* mlp_norm_name(const ModelConfig& c);

// Canonical name of a Hugging Face tensor name (Llama-family `model.layers.N.` or Falcon
// `transformer.h.N.` names), or nullopt if it is not part of the model.
std::optional<std::string> canonical_tensor_name(const std::string& hf_name);

}  // namespace kvb
