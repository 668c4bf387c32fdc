#pragma once
// Safetensors reader for Hugging Face model directories: one `model.safetensors` or shards listed in
// `model.safetensors.index.json`. Headers are validated as strictly as GGUF: dtype, shape, offsets
// inside the file, no overlapping tensors; errors name the file and the tensor.
#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "harness/util/mapped_file.hpp"
#include "kernels/dtype.hpp"

namespace kvb {

struct SafeTensor {
  std::string name;
  std::string file;  // the shard it lives in
  DType type = DType::F32;
  std::vector<uint64_t> shape;  // as stored: row-major, last dimension fastest
  std::span<const uint8_t> data;
};

class SafetensorsFile {
 public:
  static SafetensorsFile open(const std::string& path);
  static SafetensorsFile parse(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return name_; }
  const std::vector<SafeTensor>& tensors() const { return tensors_; }
  const std::map<std::string, std::string>& metadata() const { return metadata_; }

 private:
  std::shared_ptr<MappedFile> map_;
  std::string name_;
  std::vector<SafeTensor> tensors_;
  std::map<std::string, std::string> metadata_;
};

// All tensors of a model directory, from a single file or from every shard of the index.
class SafetensorsModel {
 public:
  static SafetensorsModel open_dir(const std::string& dir);

  const std::string& dir() const { return dir_; }
  const SafeTensor* find(const std::string& name) const;
  const std::map<std::string, SafeTensor>& tensors() const { return tensors_; }

 private:
  std::string dir_;
  std::vector<SafetensorsFile> files_;
  std::map<std::string, SafeTensor> tensors_;
};

}  // namespace kvb
