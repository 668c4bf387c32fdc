#pragma once
// Writes GGUF files: used to build test inputs and random-weight models of real shapes.
#include <cstdint>
#include <functional>
#include <string>
#include <vector>

#include "harness/model/gguf.hpp"

namespace kvb {

class GGUFWriter {
 public:
  explicit GGUFWriter(uint32_t version = 3, uint64_t alignment = 32);

  void add(const std::string& key, const GGUFValue& v);
  void add_uint32(const std::string& key, uint32_t v);
  void add_float32(const std::string& key, float v);
  void add_bool(const std::string& key, bool v);
  void add_string(const std::string& key, const std::string& v);
  void add_string_array(const std::string& key, const std::vector<std::string>& v);
  void add_int32_array(const std::string& key, const std::vector<int32_t>& v);
  // `data` holds the tensor in `type`'s block encoding; ne[0] varies fastest.
  void add_tensor(const std::string& name, DType type, std::vector<uint64_t> ne, std::vector<uint8_t> data);

  // A tensor whose data write_streaming() asks for when it reaches it (for files too big to hold).
  void add_tensor_shape(const std::string& name, DType type, std::vector<uint64_t> ne);

  std::vector<uint8_t> bytes() const;
  void write(const std::string& path) const;
  // Writes the file, calling fill(i, buf) for each tensor declared with add_tensor_shape (buf is
  // sized to the tensor's bytes); tensors given with data are written as they are.
  using TensorFiller = std::function<void(size_t tensor, std::vector<uint8_t>& buf)>;
  void write_streaming(const std::string& path, const TensorFiller& fill) const;

  static GGUFValue scalar(GGUFType t, double value);  // any numeric or bool type
  static GGUFValue string(const std::string& s);
  static GGUFValue array(GGUFType elem, std::vector<GGUFValue> items);

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;  // empty for tensors declared by shape
    uint64_t size = 0;          // bytes
  };
  std::vector<uint8_t> header() const;  // everything before the first tensor's data, padded
  uint64_t align(uint64_t x) const { return (x + alignment_ - 1) / alignment_ * alignment_; }
  uint32_t version_;
  uint64_t alignment_;
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvb
