#pragma once
// Writes GGUF files: used to build test inputs and random-weight models of real shapes.
#include <cstdint>
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
  void add_tensor(const std::string& name, DType type, std::vector<uint64_t> ne,
                  std::vector<uint8_t> data);

  std::vector<uint8_t> bytes() const;
  void write(const std::string& path) const;

  static GGUFValue scalar(GGUFType t, double value);  // any numeric or bool type
  static GGUFValue string(const std::string& s);
  static GGUFValue array(GGUFType elem, std::vector<GGUFValue> items);

 private:
  struct Tensor {
    std::string name;
    DType type;
    std::vector<uint64_t> ne;
    std::vector<uint8_t> data;
  };
  uint32_t version_;
  uint64_t alignment_;
  std::vector<std::pair<std::string, GGUFValue>> kv_;
  std::vector<Tensor> tensors_;
};

}  // namespace kvb
