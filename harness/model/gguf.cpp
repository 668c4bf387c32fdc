#include "harness/model/gguf.hpp"

#include <fmt/ranges.h>

#include <algorithm>
#include <bit>
#include <cstring>
#include <limits>
#include <vector>

#include "harness/util/error.hpp"

namespace kvb {
namespace {

constexpr uint32_t kMagic = 0x46554747;  // "GGUF" read as little-endian uint32
constexpr uint64_t kDefaultAlignment = 32;
constexpr int kMaxDims = 4;        // GGML_MAX_DIMS
constexpr int kMaxArrayDepth = 8;  // nesting of arrays inside arrays
constexpr uint64_t kMaxNameLen = 1u << 16;
// Real vocabularies and merge lists stay below a million entries; a larger array is damage, and
// refusing it bounds the memory a hostile file can make us allocate.
constexpr uint64_t kMaxArrayLen = uint64_t{1} << 24;

// Smallest encoding of one element of each type: bounds the counts a file may claim before any
// allocation, so that an absurd count is rejected instead of exhausting memory.
uint64_t min_encoded_size(GGUFType t) {
  switch (t) {
    case GGUFType::U8:
    case GGUFType::I8:
    case GGUFType::BOOL:
      return 1;
    case GGUFType::U16:
    case GGUFType::I16:
      return 2;
    case GGUFType::U32:
    case GGUFType::I32:
    case GGUFType::F32:
      return 4;
    case GGUFType::U64:
    case GGUFType::I64:
    case GGUFType::F64:
    case GGUFType::STRING:
      return 8;
    case GGUFType::ARRAY:
      return 12;
  }
  return 1;
}

bool valid_type(uint32_t t) { return t <= static_cast<uint32_t>(GGUFType::F64); }

// A cursor over the file bytes that refuses to read past the end, naming what it was reading.
class Cursor {
 public:
  Cursor(std::span<const uint8_t> b, const std::string& name) : b_(b), name_(name) {}

  uint64_t pos() const { return pos_; }
  uint64_t remaining() const { return b_.size() - pos_; }

  void need(uint64_t n, std::string_view what) const {
    if (n > remaining())
      fail("{}: truncated: need {} bytes for {} at offset {}, but the file has {} bytes", name_, n, what, pos_,
           b_.size());
  }

  template <typename T>
  T read(std::string_view what) {
    need(sizeof(T), what);
    T v;
    std::memcpy(&v, b_.data() + pos_, sizeof(T));
    pos_ += sizeof(T);
    return v;
  }

  std::string read_string(std::string_view what) {
    const auto len = read<uint64_t>(what);
    if (len > remaining())
      fail("{}: {} claims a string of {} bytes at offset {}, but only {} bytes remain", name_, what, len, pos_ - 8,
           remaining());
    std::string s(reinterpret_cast<const char*>(b_.data() + pos_), len);
    pos_ += len;
    return s;
  }

 private:
  std::span<const uint8_t> b_;
  const std::string& name_;
  uint64_t pos_ = 0;
};

GGUFValue read_value(Cursor& c, GGUFType type, const std::string& name, const std::string& key, int depth) {
  GGUFValue v;
  v.type = type;
  const std::string what = fmt::format("the value of key '{}'", key);
  switch (type) {
    case GGUFType::U8:
      v.u = c.read<uint8_t>(what);
      break;
    case GGUFType::I8:
      v.i = c.read<int8_t>(what);
      break;
    case GGUFType::U16:
      v.u = c.read<uint16_t>(what);
      break;
    case GGUFType::I16:
      v.i = c.read<int16_t>(what);
      break;
    case GGUFType::U32:
      v.u = c.read<uint32_t>(what);
      break;
    case GGUFType::I32:
      v.i = c.read<int32_t>(what);
      break;
    case GGUFType::U64:
      v.u = c.read<uint64_t>(what);
      break;
    case GGUFType::I64:
      v.i = c.read<int64_t>(what);
      break;
    case GGUFType::F32:
      v.f = c.read<float>(what);
      break;
    case GGUFType::F64:
      v.f = c.read<double>(what);
      break;
    case GGUFType::BOOL: {
      const auto b = c.read<uint8_t>(what);
      if (b > 1) fail("{}: key '{}': bool value must be 0 or 1, found {}", name, key, b);
      v.b = b != 0;
      break;
    }
    case GGUFType::STRING:
      v.s = c.read_string(what);
      break;
    case GGUFType::ARRAY: {
      if (depth >= kMaxArrayDepth) fail("{}: key '{}': arrays nested deeper than {} levels", name, key, kMaxArrayDepth);
      const auto et = c.read<uint32_t>(what);
      if (!valid_type(et)) fail("{}: key '{}': unknown array element type {} (expected 0..12)", name, key, et);
      v.elem_type = static_cast<GGUFType>(et);
      const auto n = c.read<uint64_t>(what);
      if (n > kMaxArrayLen)
        fail("{}: key '{}': array of {} elements exceeds the limit of {}", name, key, n, kMaxArrayLen);
      if (n > c.remaining() / min_encoded_size(v.elem_type))
        fail("{}: key '{}': array claims {} elements but only {} bytes remain", name, key, n, c.remaining());
      v.arr.reserve(n);
      for (uint64_t k = 0; k < n; ++k) v.arr.push_back(read_value(c, v.elem_type, name, key, depth + 1));
      break;
    }
  }
  return v;
}

uint64_t align_up(uint64_t x, uint64_t a) { return (x + a - 1) / a * a; }

}  // namespace

std::string_view gguf_type_name(GGUFType t) {
  static constexpr std::string_view names[] = {"uint8", "int8",   "uint16", "int16",  "uint32", "int32",  "float32",
                                               "bool",  "string", "array",  "uint64", "int64",  "float64"};
  const auto i = static_cast<uint32_t>(t);
  return i < std::size(names) ? names[i] : "unknown";
}

bool gguf_is_integer(GGUFType t) {
  switch (t) {
    case GGUFType::U8:
    case GGUFType::I8:
    case GGUFType::U16:
    case GGUFType::I16:
    case GGUFType::U32:
    case GGUFType::I32:
    case GGUFType::U64:
    case GGUFType::I64:
      return true;
    default:
      return false;
  }
}

namespace {
bool is_unsigned(GGUFType t) {
  return t == GGUFType::U8 || t == GGUFType::U16 || t == GGUFType::U32 || t == GGUFType::U64;
}
}  // namespace

bool GGUFValue::is_integer() const { return gguf_is_integer(type); }

std::string GGUFValue::to_string(size_t max_items) const {
  if (is_integer()) return is_unsigned(type) ? std::to_string(u) : std::to_string(i);
  switch (type) {
    case GGUFType::F32:
    case GGUFType::F64:
      return fmt::format("{}", f);
    case GGUFType::BOOL:
      return b ? "true" : "false";
    case GGUFType::STRING: {
      std::string t(s, 0, s.size() > 80 ? 77 : s.size());
      if (s.size() > 80) t.append("...");
      for (auto& ch : t)
        if (ch == '\n') ch = ' ';
      return fmt::format("\"{}\"", t);
    }
    case GGUFType::ARRAY: {
      std::string out = fmt::format("[{} x {}:", arr.size(), gguf_type_name(elem_type));
      for (size_t k = 0; k < arr.size() && k < max_items; ++k) {
        out += ' ';
        out += arr[k].to_string(0);
      }
      if (arr.size() > max_items) out += " ...";
      return out + "]";
    }
    default:
      return "?";
  }
}

GGUFFile GGUFFile::open(const std::string& path) {
  auto map = std::make_shared<MappedFile>(path);
  GGUFFile f = parse(map->bytes(), path);
  f.map_ = std::move(map);
  return f;
}

GGUFFile GGUFFile::parse(std::span<const uint8_t> bytes, const std::string& name) {
  GGUFFile f;
  f.name_ = name;
  Cursor c(bytes, f.name_);

  if (bytes.size() < 4) fail("{}: not a GGUF file: only {} bytes", name, bytes.size());
  const auto magic = c.read<uint32_t>("the magic");
  if (magic != kMagic) {
    std::string shown;
    for (int k = 0; k < 4; ++k) {
      const auto ch = bytes[k];
      shown += (ch >= 32 && ch < 127) ? static_cast<char>(ch) : '?';
    }
    fail("{}: not a GGUF file: magic is '{}' (0x{:08x}), expected 'GGUF'", name, shown, magic);
  }
  f.version_ = c.read<uint32_t>("the version");
  if (f.version_ == 1)
    fail("{}: GGUF version 1 is not supported (it uses 32-bit lengths); convert the file to v3", name);
  if (f.version_ != 2 && f.version_ != 3) {
    if (__builtin_bswap32(f.version_) == 2 || __builtin_bswap32(f.version_) == 3)
      fail("{}: big-endian GGUF files are not supported", name);
    fail("{}: unsupported GGUF version {} (expected 2 or 3)", name, f.version_);
  }
  const auto n_tensors = c.read<uint64_t>("the tensor count");
  const auto n_kv = c.read<uint64_t>("the metadata count");
  // Each key-value pair takes at least 8 (key length) + 4 (type) + 1 bytes; each tensor info
  // 8 + 4 + 8 + 4 + 8 bytes. A larger claim cannot be real.
  if (n_kv > c.remaining() / 13)
    fail("{}: header claims {} metadata entries, more than {} bytes can hold", name, n_kv, c.remaining());
  if (n_tensors > c.remaining() / 32)
    fail("{}: header claims {} tensors, more than {} bytes can hold", name, n_tensors, c.remaining());

  for (uint64_t k = 0; k < n_kv; ++k) {
    std::string key = c.read_string(fmt::format("the key of metadata entry {}", k));
    const auto t = c.read<uint32_t>(fmt::format("the type of key '{}'", key));
    if (!valid_type(t)) fail("{}: key '{}': unknown value type {} (expected 0..12)", name, key, t);
    GGUFValue v = read_value(c, static_cast<GGUFType>(t), name, key, 0);
    if (f.kv_.count(key)) fail("{}: duplicate metadata key '{}'", name, key);
    f.key_order_.push_back(key);
    f.kv_.emplace(std::move(key), std::move(v));
  }

  if (const GGUFValue* a = f.find("general.alignment")) {
    if (a->type != GGUFType::U32)
      fail("{}: key 'general.alignment': expected uint32, found {}", name, gguf_type_name(a->type));
    if (a->u == 0 || (a->u & (a->u - 1)) != 0)
      fail("{}: key 'general.alignment': expected a non-zero power of two, found {}", name, a->u);
    f.alignment_ = a->u;
  } else {
    f.alignment_ = kDefaultAlignment;
  }

  f.tensors_.reserve(n_tensors);
  for (uint64_t k = 0; k < n_tensors; ++k) {
    GGUFTensor t;
    t.name = c.read_string(fmt::format("the name of tensor {}", k));
    if (t.name.size() > kMaxNameLen) fail("{}: tensor {}: name longer than {} bytes", name, k, kMaxNameLen);
    const auto what = fmt::format("the info of tensor '{}'", t.name);
    const auto n_dims = c.read<uint32_t>(what);
    if (n_dims == 0 || n_dims > kMaxDims)
      fail("{}: tensor '{}': {} dimensions, expected 1..{}", name, t.name, n_dims, kMaxDims);
    t.n_elems = 1;
    for (uint32_t d = 0; d < n_dims; ++d) {
      const auto n = c.read<uint64_t>(what);
      if (n == 0 || n > (uint64_t{1} << 40))
        fail("{}: tensor '{}': dimension {} is {}, expected 1..2^40", name, t.name, d, n);
      if (t.n_elems > (uint64_t{1} << 50) / n)
        fail("{}: tensor '{}': dimensions {} and {} hold more than 2^50 elements", name, t.name, fmt::join(t.ne, " x "),
             n);
      t.ne.push_back(n);
      t.n_elems *= n;
    }
    const auto type_id = c.read<uint32_t>(what);
    const auto info = dtype_info(type_id);
    if (!info) fail("{}: tensor '{}': unknown ggml type {}", name, t.name, type_id);
    t.type = info->type;
    if (t.ne[0] % info->block_elems != 0)
      fail("{}: tensor '{}': first dimension {} is not a multiple of the {} block size {}", name, t.name, t.ne[0],
           info->name, info->block_elems);
    t.n_bytes = *dtype_bytes(t.type, t.n_elems);
    t.offset = c.read<uint64_t>(what);
    if (t.offset % f.alignment_ != 0)
      fail("{}: tensor '{}': data offset {} is not a multiple of the alignment {}", name, t.name, t.offset,
           f.alignment_);
    if (f.tensor_index_.count(t.name)) fail("{}: duplicate tensor name '{}'", name, t.name);
    f.tensor_index_.emplace(t.name, f.tensors_.size());
    f.tensors_.push_back(std::move(t));
  }

  f.data_offset_ = align_up(c.pos(), f.alignment_);
  const uint64_t data_size = f.data_offset_ <= bytes.size() ? bytes.size() - f.data_offset_ : 0;
  for (auto& t : f.tensors_) {
    if (f.data_offset_ > bytes.size() || t.offset > data_size || t.n_bytes > data_size - t.offset)
      fail(
          "{}: tensor '{}' ({}, {} bytes at data offset {}) extends past the end of the file "
          "({} bytes, data section starts at {}); the file is truncated",
          name, t.name, dtype_name(t.type), t.n_bytes, t.offset, bytes.size(), f.data_offset_);
    t.data = bytes.subspan(f.data_offset_ + t.offset, t.n_bytes);
  }
  // Each tensor its own bytes: an offset edited onto another tensor's data read that data as its own.
  std::vector<const GGUFTensor*> by_offset;
  for (const auto& t : f.tensors_) by_offset.push_back(&t);
  std::sort(by_offset.begin(), by_offset.end(), [](auto* a, auto* b) { return a->offset < b->offset; });
  for (size_t i = 1; i < by_offset.size(); ++i) {
    const GGUFTensor &a = *by_offset[i - 1], &b = *by_offset[i];
    if (a.offset + a.n_bytes > b.offset)
      fail("{}: tensors '{}' ({} bytes at data offset {}) and '{}' (at data offset {}) overlap; the file is corrupt",
           name, a.name, a.n_bytes, a.offset, b.name, b.offset);
  }
  return f;
}

const GGUFValue* GGUFFile::find(std::string_view key) const {
  auto it = kv_.find(std::string(key));
  return it == kv_.end() ? nullptr : &it->second;
}

const GGUFValue& GGUFFile::require(std::string_view key, std::string_view expected) const {
  const GGUFValue* v = find(key);
  if (!v) fail("{}: required key '{}' ({}) is missing", name_, key, expected);
  return *v;
}

void GGUFFile::wrong_type(std::string_view key, const GGUFValue& v, std::string_view expected) const {
  std::string found(gguf_type_name(v.type));
  if (v.type == GGUFType::ARRAY) found += fmt::format(" of {}", gguf_type_name(v.elem_type));
  fail("{}: key '{}': expected {}, found {}", name_, key, expected, found);
}

namespace {
std::optional<uint64_t> as_uint(const GGUFValue& v) {
  if (!v.is_integer()) return std::nullopt;
  if (is_unsigned(v.type)) return v.u;
  if (v.i < 0) return std::nullopt;
  return static_cast<uint64_t>(v.i);
}
}  // namespace

uint64_t GGUFFile::get_uint(std::string_view key) const {
  const auto& v = require(key, "a non-negative integer");
  auto u = as_uint(v);
  if (!u) wrong_type(key, v, "a non-negative integer");
  return *u;
}

std::optional<uint64_t> GGUFFile::get_uint_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_uint(key);
}

double GGUFFile::get_float(std::string_view key) const {
  const auto& v = require(key, "a number");
  if (v.is_float()) return v.f;
  if (v.is_integer()) return is_unsigned(v.type) ? static_cast<double>(v.u) : static_cast<double>(v.i);
  wrong_type(key, v, "a number");
}

std::optional<double> GGUFFile::get_float_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_float(key);
}

bool GGUFFile::get_bool(std::string_view key) const {
  const auto& v = require(key, "a bool");
  if (v.type != GGUFType::BOOL) wrong_type(key, v, "bool");
  return v.b;
}

std::optional<bool> GGUFFile::get_bool_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_bool(key);
}

const std::string& GGUFFile::get_string(std::string_view key) const {
  const auto& v = require(key, "a string");
  if (v.type != GGUFType::STRING) wrong_type(key, v, "string");
  return v.s;
}

std::optional<std::string> GGUFFile::get_string_opt(std::string_view key) const {
  if (!has(key)) return std::nullopt;
  return get_string(key);
}

std::vector<std::string> GGUFFile::get_string_array(std::string_view key) const {
  const auto& v = require(key, "an array of strings");
  if (v.type != GGUFType::ARRAY || v.elem_type != GGUFType::STRING) wrong_type(key, v, "array of string");
  std::vector<std::string> out;
  out.reserve(v.arr.size());
  for (const auto& e : v.arr) out.push_back(e.s);
  return out;
}

std::vector<int64_t> GGUFFile::get_int_array(std::string_view key) const {
  const auto& v = require(key, "an array of integers");
  if (v.type != GGUFType::ARRAY || !gguf_is_integer(v.elem_type)) wrong_type(key, v, "array of integers");
  std::vector<int64_t> out;
  out.reserve(v.arr.size());
  for (const auto& e : v.arr) {
    if (is_unsigned(e.type) && e.u > static_cast<uint64_t>(std::numeric_limits<int64_t>::max()))
      fail("{}: key '{}': value {} does not fit a signed 64-bit integer", name_, key, e.u);
    out.push_back(is_unsigned(e.type) ? static_cast<int64_t>(e.u) : e.i);
  }
  return out;
}

std::vector<double> GGUFFile::get_float_array(std::string_view key) const {
  const auto& v = require(key, "an array of numbers");
  if (v.type != GGUFType::ARRAY || (v.elem_type != GGUFType::F32 && v.elem_type != GGUFType::F64))
    wrong_type(key, v, "array of float");
  std::vector<double> out;
  out.reserve(v.arr.size());
  for (const auto& e : v.arr) out.push_back(e.f);
  return out;
}

const GGUFTensor* GGUFFile::find_tensor(std::string_view name) const {
  auto it = tensor_index_.find(std::string(name));
  return it == tensor_index_.end() ? nullptr : &tensors_[it->second];
}

const GGUFTensor& GGUFFile::tensor(std::string_view name) const {
  const GGUFTensor* t = find_tensor(name);
  if (!t) fail("{}: tensor '{}' is missing", name_, name);
  return *t;
}

}  // namespace kvb
