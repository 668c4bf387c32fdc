#pragma once
// GGUF (versions 2 and 3) reader: metadata of every value type, tensor infos, alignment, and tensor
// data served from a memory map. Every length, count and offset is checked against the bytes that are
// really there before it is used, so a damaged file produces an Error naming the file and the key or
// tensor, never an out-of-bounds read.
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <unordered_map>
#include <vector>

#include "harness/util/mapped_file.hpp"
#include "kernels/dtype.hpp"

namespace kvb {

enum class GGUFType : uint32_t {
  U8 = 0,
  I8 = 1,
  U16 = 2,
  I16 = 3,
  U32 = 4,
  I32 = 5,
  F32 = 6,
  BOOL = 7,
  STRING = 8,
  ARRAY = 9,
  U64 = 10,
  I64 = 11,
  F64 = 12,
};
std::string_view gguf_type_name(GGUFType t);
bool gguf_is_integer(GGUFType t);

struct GGUFValue {
  GGUFType type = GGUFType::U8;
  // Integers of every width are widened into one of these two; floats into f; arrays hold their
  // element type in elem_type and values in arr.
  int64_t i = 0;
  uint64_t u = 0;
  double f = 0.0;
  bool b = false;
  std::string s;
  GGUFType elem_type = GGUFType::U8;
  std::vector<GGUFValue> arr;

  bool is_integer() const;
  bool is_float() const { return type == GGUFType::F32 || type == GGUFType::F64; }
  std::string to_string(size_t max_items = 8) const;  // short human-readable form
};

struct GGUFTensor {
  std::string name;
  std::vector<uint64_t> ne;  // dimensions, ne[0] varies fastest (ggml order)
  DType type = DType::F32;
  uint64_t offset = 0;  // relative to the start of the data section
  uint64_t n_elems = 0;
  uint64_t n_bytes = 0;
  std::span<const uint8_t> data;
};

class GGUFFile {
 public:
  // Maps and parses a file. Throws Error with the path and the problem.
  static GGUFFile open(const std::string& path);
  // Parses bytes owned by the caller (they must outlive the result); `name` is used in messages.
  static GGUFFile parse(std::span<const uint8_t> bytes, const std::string& name);

  const std::string& path() const { return name_; }
  uint32_t version() const { return version_; }
  uint64_t alignment() const { return alignment_; }
  uint64_t data_offset() const { return data_offset_; }

  const std::vector<std::string>& keys() const { return key_order_; }
  const GGUFValue* find(std::string_view key) const;
  bool has(std::string_view key) const { return find(key) != nullptr; }

  // Typed access: an absent key or a value of the wrong type is an Error naming file, key and the
  // expected type. The optional forms return nullopt only when the key is absent.
  uint64_t get_uint(std::string_view key) const;
  std::optional<uint64_t> get_uint_opt(std::string_view key) const;
  double get_float(std::string_view key) const;
  std::optional<double> get_float_opt(std::string_view key) const;
  bool get_bool(std::string_view key) const;
  std::optional<bool> get_bool_opt(std::string_view key) const;
  const std::string& get_string(std::string_view key) const;
  std::optional<std::string> get_string_opt(std::string_view key) const;
  std::vector<std::string> get_string_array(std::string_view key) const;
  std::vector<int64_t> get_int_array(std::string_view key) const;
  std::vector<double> get_float_array(std::string_view key) const;

  const std::vector<GGUFTensor>& tensors() const { return tensors_; }
  const GGUFTensor* find_tensor(std::string_view name) const;
  const GGUFTensor& tensor(std::string_view name) const;  // Error if absent

 private:
  GGUFFile() = default;
  const GGUFValue& require(std::string_view key, std::string_view expected) const;
  [[noreturn]] void wrong_type(std::string_view key, const GGUFValue& v, std::string_view expected) const;

  std::shared_ptr<MappedFile> map_;
  std::string name_;
  uint32_t version_ = 0;
  uint64_t alignment_ = 32;
  uint64_t data_offset_ = 0;
  std::vector<std::string> key_order_;
  std::unordered_map<std::string, GGUFValue> kv_;
  std::vector<GGUFTensor> tensors_;
  std::unordered_map<std::string, size_t> tensor_index_;
};

}  // namespace kvb
