#include "harness/util/npy.hpp"

#include <fmt/format.h>

#include <fstream>

#include "harness/util/error.hpp"

namespace kvb {
namespace {

void write(const std::string& path, const char* dtype, const void* data, size_t bytes,
           const std::vector<size_t>& shape) {
  std::string dims;
  for (size_t s : shape) dims += fmt::format("{}, ", s);
  if (shape.size() > 1) dims.resize(dims.size() - 2);
  std::string header = fmt::format("{{'descr': '{}', 'fortran_order': False, 'shape': ({}), }}", dtype, dims);
  // Magic (6) + version (2) + length (2) + header + '\n', padded with spaces to a multiple of 64.
  const size_t total = 10 + header.size() + 1;
  header.append((64 - total % 64) % 64, ' ');
  header += '\n';
  std::ofstream out(path, std::ios::binary);
  if (!out) fail("{}: cannot write", path);
  out.write("\x93NUMPY\x01\x00", 8);
  const uint16_t len = static_cast<uint16_t>(header.size());
  const char le[2] = {static_cast<char>(len & 0xff), static_cast<char>(len >> 8)};
  out.write(le, 2);
  out.write(header.data(), static_cast<std::streamsize>(header.size()));
  out.write(static_cast<const char*>(data), static_cast<std::streamsize>(bytes));
  if (!out) fail("{}: write failed", path);
}

size_t count(const std::vector<size_t>& shape) {
  size_t n = 1;
  for (size_t s : shape) n *= s;
  return n;
}

}  // namespace

void write_npy(const std::string& path, std::span<const float> data, const std::vector<size_t>& shape) {
  if (count(shape) != data.size()) fail("internal: {} values for the shape of {}", data.size(), path);
  write(path, "<f4", data.data(), data.size_bytes(), shape);
}

void write_npy(const std::string& path, std::span<const int32_t> data, const std::vector<size_t>& shape) {
  if (count(shape) != data.size()) fail("internal: {} values for the shape of {}", data.size(), path);
  write(path, "<i4", data.data(), data.size_bytes(), shape);
}

}  // namespace kvb
