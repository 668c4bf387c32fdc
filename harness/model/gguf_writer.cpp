#include "harness/model/gguf_writer.hpp"

#include <cstring>
#include <fstream>

#include "harness/util/error.hpp"

namespace kvb {
namespace {

template <typename T>
void put(std::vector<uint8_t>& out, T v) {
  uint8_t b[sizeof(T)];
  std::memcpy(b, &v, sizeof(T));
  out.insert(out.end(), b, b + sizeof(T));
}

void put_string(std::vector<uint8_t>& out, const std::string& s) {
  put<uint64_t>(out, s.size());
  out.insert(out.end(), s.begin(), s.end());
}

void put_value(std::vector<uint8_t>& out, const GGUFValue& v) {
  switch (v.type) {
    case GGUFType::U8:
      put<uint8_t>(out, static_cast<uint8_t>(v.u));
      break;
    case GGUFType::I8:
      put<int8_t>(out, static_cast<int8_t>(v.i));
      break;
    case GGUFType::U16:
      put<uint16_t>(out, static_cast<uint16_t>(v.u));
      break;
    case GGUFType::I16:
      put<int16_t>(out, static_cast<int16_t>(v.i));
      break;
    case GGUFType::U32:
      put<uint32_t>(out, static_cast<uint32_t>(v.u));
      break;
    case GGUFType::I32:
      put<int32_t>(out, static_cast<int32_t>(v.i));
      break;
    case GGUFType::U64:
      put<uint64_t>(out, v.u);
      break;
    case GGUFType::I64:
      put<int64_t>(out, v.i);
      break;
    case GGUFType::F32:
      put<float>(out, static_cast<float>(v.f));
      break;
    case GGUFType::F64:
      put<double>(out, v.f);
      break;
    case GGUFType::BOOL:
      put<uint8_t>(out, v.b ? 1 : 0);
      break;
    case GGUFType::STRING:
      put_string(out, v.s);
      break;
    case GGUFType::ARRAY:
      put<uint32_t>(out, static_cast<uint32_t>(v.elem_type));
      put<uint64_t>(out, v.arr.size());
      for (const auto& e : v.arr) put_value(out, e);
      break;
  }
}

}  // namespace

GGUFWriter::GGUFWriter(uint32_t version, uint64_t alignment) : version_(version), alignment_(alignment) {}

GGUFValue GGUFWriter::scalar(GGUFType t, double value) {
  GGUFValue v;
  v.type = t;
  if (t == GGUFType::F32 || t == GGUFType::F64)
    v.f = value;
  else if (t == GGUFType::BOOL)
    v.b = value != 0;
  else if (t == GGUFType::U8 || t == GGUFType::U16 || t == GGUFType::U32 || t == GGUFType::U64)
    v.u = static_cast<uint64_t>(value);
  else
    v.i = static_cast<int64_t>(value);
  return v;
}

GGUFValue GGUFWriter::string(const std::string& s) {
  GGUFValue v;
  v.type = GGUFType::STRING;
  v.s = s;
  return v;
}

GGUFValue GGUFWriter::array(GGUFType elem, std::vector<GGUFValue> items) {
  GGUFValue v;
  v.type = GGUFType::ARRAY;
  v.elem_type = elem;
  v.arr = std::move(items);
  return v;
}

void GGUFWriter::add(const std::string& key, const GGUFValue& v) { kv_.emplace_back(key, v); }
void GGUFWriter::add_uint32(const std::string& key, uint32_t v) { add(key, scalar(GGUFType::U32, v)); }
void GGUFWriter::add_float32(const std::string& key, float v) { add(key, scalar(GGUFType::F32, v)); }
void GGUFWriter::add_bool(const std::string& key, bool v) { add(key, scalar(GGUFType::BOOL, v)); }
void GGUFWriter::add_string(const std::string& key, const std::string& v) { add(key, string(v)); }

void GGUFWriter::add_string_array(const std::string& key, const std::vector<std::string>& v) {
  std::vector<GGUFValue> items;
  items.reserve(v.size());
  for (const auto& s : v) items.push_back(string(s));
  add(key, array(GGUFType::STRING, std::move(items)));
}

void GGUFWriter::add_int32_array(const std::string& key, const std::vector<int32_t>& v) {
  std::vector<GGUFValue> items;
  items.reserve(v.size());
  for (auto x : v) items.push_back(scalar(GGUFType::I32, x));
  add(key, array(GGUFType::I32, std::move(items)));
}

namespace {
uint64_t tensor_bytes(const std::string& name, DType type, const std::vector<uint64_t>& ne) {
  uint64_t n = 1;
  for (auto d : ne) n *= d;
  const auto need = dtype_bytes(type, n);
  if (!need) fail("GGUFWriter: tensor '{}': {} elements cannot be stored as {}", name, n, dtype_name(type));
  return *need;
}
}  // namespace

void GGUFWriter::add_tensor(const std::string& name, DType type, std::vector<uint64_t> ne, std::vector<uint8_t> data) {
  const uint64_t need = tensor_bytes(name, type, ne);
  if (need != data.size())
    fail("GGUFWriter: tensor '{}' has {} bytes, expected {} for {}", name, data.size(), need, dtype_name(type));
  tensors_.push_back({name, type, std::move(ne), std::move(data), need});
}

void GGUFWriter::add_tensor_shape(const std::string& name, DType type, std::vector<uint64_t> ne) {
  const uint64_t need = tensor_bytes(name, type, ne);
  tensors_.push_back({name, type, std::move(ne), {}, need});
}

std::vector<uint8_t> GGUFWriter::header() const {
  std::vector<uint8_t> out;
  put<uint32_t>(out, 0x46554747);
  put<uint32_t>(out, version_);
  put<uint64_t>(out, tensors_.size());
  put<uint64_t>(out, kv_.size());
  for (const auto& [k, v] : kv_) {
    put_string(out, k);
    put<uint32_t>(out, static_cast<uint32_t>(v.type));
    put_value(out, v);
  }
  uint64_t offset = 0;
  for (const auto& t : tensors_) {
    put_string(out, t.name);
    put<uint32_t>(out, static_cast<uint32_t>(t.ne.size()));
    for (auto d : t.ne) put<uint64_t>(out, d);
    put<uint32_t>(out, static_cast<uint32_t>(t.type));
    put<uint64_t>(out, offset);
    offset = align(offset + t.size);
  }
  out.resize(align(out.size()), 0);
  return out;
}

std::vector<uint8_t> GGUFWriter::bytes() const {
  std::vector<uint8_t> out = header();
  for (const auto& t : tensors_) {
    if (t.data.size() != t.size) fail("GGUFWriter: tensor '{}' was declared without data", t.name);
    out.insert(out.end(), t.data.begin(), t.data.end());
    out.resize(align(out.size()), 0);
  }
  return out;
}

void GGUFWriter::write(const std::string& path) const {
  write_streaming(path, [&](size_t i, std::vector<uint8_t>&) {
    fail("GGUFWriter: tensor '{}' was declared without data", tensors_[i].name);
  });
}

void GGUFWriter::write_streaming(const std::string& path, const TensorFiller& fill) const {
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot open for writing", path);
  auto put_bytes = [&](const std::vector<uint8_t>& b) {
    out.write(reinterpret_cast<const char*>(b.data()), static_cast<std::streamsize>(b.size()));
  };
  put_bytes(header());
  std::vector<uint8_t> buf;
  for (size_t i = 0; i < tensors_.size(); ++i) {
    const Tensor& t = tensors_[i];
    if (t.data.size() == t.size) {
      put_bytes(t.data);
    } else {
      buf.assign(t.size, 0);
      fill(i, buf);
      put_bytes(buf);
    }
    const std::vector<uint8_t> pad(align(t.size) - t.size, 0);
    put_bytes(pad);
    if (!out) fail("{}: write failed (disk full?)", path);
  }
}

}  // namespace kvb
