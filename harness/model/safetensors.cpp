#include "harness/model/safetensors.hpp"

#include <algorithm>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <set>

#include "harness/util/error.hpp"

namespace kvb {
namespace {

namespace fs = std::filesystem;
using nlohmann::json;

// The header is JSON text; anything near this size is not a real header.
constexpr uint64_t kMaxHeader = uint64_t{100} << 20;

DType parse_dtype(const std::string& s, const std::string& file, const std::string& tensor) {
  if (s == "F32") return DType::F32;
  if (s == "F16") return DType::F16;
  if (s == "BF16") return DType::BF16;
  if (s == "I8") return DType::I8;
  if (s == "I16") return DType::I16;
  if (s == "I32") return DType::I32;
  if (s == "I64") return DType::I64;
  if (s == "F64") return DType::F64;
  fail("{}: tensor '{}': unsupported dtype '{}' (expected F32, F16, BF16 or an integer type)", file, tensor, s);
}

}  // namespace

SafetensorsFile SafetensorsFile::open(const std::string& path) {
  auto map = std::make_shared<MappedFile>(path);
  SafetensorsFile f = parse(map->bytes(), path);
  f.map_ = std::move(map);
  return f;
}

SafetensorsFile SafetensorsFile::parse(std::span<const uint8_t> bytes, const std::string& name) {
  SafetensorsFile f;
  f.name_ = name;
  if (bytes.size() < 8)
    fail("{}: not a safetensors file: {} bytes, expected at least an 8-byte header length", name, bytes.size());
  uint64_t hlen;
  std::memcpy(&hlen, bytes.data(), 8);
  if (hlen > kMaxHeader || hlen > bytes.size() - 8)
    fail(
        "{}: header length {} exceeds the file ({} bytes) or the {} byte limit; the file is "
        "truncated or not safetensors",
        name, hlen, bytes.size(), kMaxHeader);
  const std::string_view text(reinterpret_cast<const char*>(bytes.data() + 8), hlen);
  json header;
  try {
    header = json::parse(text);
  } catch (const json::exception& e) {
    fail("{}: header is not valid JSON: {}", name, e.what());
  }
  if (!header.is_object()) fail("{}: header must be a JSON object", name);

  const auto data = bytes.subspan(8 + hlen);
  std::vector<std::pair<uint64_t, uint64_t>> ranges;
  for (const auto& [key, val] : header.items()) {
    if (key == "__metadata__") {
      if (!val.is_object()) fail("{}: '__metadata__' must be an object of strings", name);
      for (const auto& [mk, mv] : val.items()) {
        if (!mv.is_string()) fail("{}: '__metadata__.{}' must be a string", name, mk);
        f.metadata_[mk] = mv.get<std::string>();
      }
      continue;
    }
    if (!val.is_object() || !val.contains("dtype") || !val.contains("shape") || !val.contains("data_offsets"))
      fail("{}: tensor '{}': expected an object with 'dtype', 'shape' and 'data_offsets'", name, key);
    const auto& jd = val["dtype"];
    const auto& js = val["shape"];
    const auto& jo = val["data_offsets"];
    if (!jd.is_string()) fail("{}: tensor '{}': 'dtype' must be a string", name, key);
    if (!js.is_array()) fail("{}: tensor '{}': 'shape' must be an array", name, key);
    if (!jo.is_array() || jo.size() != 2 || !jo[0].is_number_unsigned() || !jo[1].is_number_unsigned())
      fail("{}: tensor '{}': 'data_offsets' must be [begin, end] of non-negative integers", name, key);
    SafeTensor t;
    t.name = key;
    t.file = name;
    t.type = parse_dtype(jd.get<std::string>(), name, key);
    uint64_t n = 1;
    for (const auto& d : js) {
      if (!d.is_number_unsigned()) fail("{}: tensor '{}': shape entries must be non-negative integers", name, key);
      const auto v = d.get<uint64_t>();
      if (v > (uint64_t{1} << 40) || (v != 0 && n > (uint64_t{1} << 50) / v))
        fail("{}: tensor '{}': shape {} is absurdly large", name, key, js.dump());
      t.shape.push_back(v);
      n *= v;
    }
    const auto b = jo[0].get<uint64_t>(), e = jo[1].get<uint64_t>();
    const uint64_t expect = n * dtype_info(t.type).block_bytes;
    if (b > e || e - b != expect)
      fail("{}: tensor '{}': data_offsets [{}, {}] hold {} bytes, but {} of shape {} needs {}", name, key, b, e,
           e >= b ? e - b : 0, jd.get<std::string>(), js.dump(), expect);
    if (e > data.size())
      fail(
          "{}: tensor '{}': data ends at {} but the data section has {} bytes; the file is "
          "truncated",
          name, key, e, data.size());
    t.data = data.subspan(b, e - b);
    ranges.emplace_back(b, e);
    f.tensors_.push_back(std::move(t));
  }
  std::sort(ranges.begin(), ranges.end());
  for (size_t k = 1; k < ranges.size(); ++k)
    if (ranges[k].first < ranges[k - 1].second)
      fail("{}: tensor data ranges overlap at byte {}", name, ranges[k].first);
  return f;
}

SafetensorsModel SafetensorsModel::open_dir(const std::string& dir) {
  SafetensorsModel m;
  m.dir_ = dir;
  const fs::path index = fs::path(dir) / "model.safetensors.index.json";
  std::vector<std::string> shards;
  // transformers reads model.safetensors where a directory also holds an index (of other shards).
  if (fs::exists(fs::path(dir) / "model.safetensors")) {
    shards.push_back("model.safetensors");
  } else if (fs::exists(index)) {
    std::ifstream in(index);
    json j;
    try {
      j = json::parse(in);
    } catch (const json::exception& e) {
      fail("{}: not valid JSON: {}", index.string(), e.what());
    }
    if (!j.contains("weight_map") || !j["weight_map"].is_object())
      fail("{}: expected an object 'weight_map' of tensor name -> shard file", index.string());
    std::set<std::string> seen;
    for (const auto& [tensor, file] : j["weight_map"].items()) {
      if (!file.is_string()) fail("{}: weight_map['{}'] must be a file name string", index.string(), tensor);
      const auto s = file.get<std::string>();
      if (s.find('/') != std::string::npos || s == "..")
        fail("{}: weight_map['{}'] = '{}' must be a file in the same directory", index.string(), tensor, s);
      if (seen.insert(s).second) shards.push_back(s);
    }
  } else {
    fail("{}: no model.safetensors or model.safetensors.index.json found", dir);
  }
  for (const auto& s : shards) {
    m.files_.push_back(SafetensorsFile::open((fs::path(dir) / s).string()));
    for (const auto& t : m.files_.back().tensors()) {
      if (m.tensors_.count(t.name))
        fail("{}: tensor '{}' appears in more than one shard", (fs::path(dir) / s).string(), t.name);
      m.tensors_.emplace(t.name, t);
    }
  }
  return m;
}

const SafeTensor* SafetensorsModel::find(const std::string& name) const {
  auto it = tensors_.find(name);
  return it == tensors_.end() ? nullptr : &it->second;
}

}  // namespace kvb
