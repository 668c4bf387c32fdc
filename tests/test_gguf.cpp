#include <chrono>
#include <cstring>
#include <random>

#include "harness/model/config.hpp"
#include "harness/model/gguf.hpp"
#include "harness/model/gguf_writer.hpp"
#include "kernels/cpu/fp16.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

std::vector<uint8_t> f32_bytes(const std::vector<float>& v) {
  std::vector<uint8_t> b(v.size() * 4);
  std::memcpy(b.data(), v.data(), b.size());
  return b;
}

GGUFWriter sample_writer(uint32_t version = 3) {
  GGUFWriter w(version);
  w.add_string("general.architecture", "llama");
  w.add("u8", GGUFWriter::scalar(GGUFType::U8, 200));
  w.add("i8", GGUFWriter::scalar(GGUFType::I8, -100));
  w.add("u16", GGUFWriter::scalar(GGUFType::U16, 65000));
  w.add("i16", GGUFWriter::scalar(GGUFType::I16, -30000));
  w.add("u32", GGUFWriter::scalar(GGUFType::U32, 4000000000.0));
  w.add("i32", GGUFWriter::scalar(GGUFType::I32, -2000000000));
  w.add("u64", GGUFWriter::scalar(GGUFType::U64, 1e15));
  w.add("i64", GGUFWriter::scalar(GGUFType::I64, -1e15));
  w.add("f32", GGUFWriter::scalar(GGUFType::F32, 0.5));
  w.add("f64", GGUFWriter::scalar(GGUFType::F64, 1e-300));
  w.add("bool", GGUFWriter::scalar(GGUFType::BOOL, 1));
  w.add_string("str", "héllo");
  w.add_string_array("strs", {"a", "", "ccc"});
  w.add_int32_array("ints", {1, -2, 3});
  w.add("nested", GGUFWriter::array(GGUFType::ARRAY,
                                    {GGUFWriter::array(GGUFType::F32, {GGUFWriter::scalar(GGUFType::F32, 1.5)})}));
  w.add_tensor("a", DType::F32, {3, 2}, f32_bytes({1, 2, 3, 4, 5, 6}));
  std::vector<uint8_t> q(2 * 18, 0x11);
  w.add_tensor("b", DType::Q4_0, {64}, q);
  return w;
}

// Overwrites 8 bytes at `at` with v.
void poke64(std::vector<uint8_t>& b, size_t at, uint64_t v) { std::memcpy(b.data() + at, &v, 8); }
void poke32(std::vector<uint8_t>& b, size_t at, uint32_t v) { std::memcpy(b.data() + at, &v, 4); }

}  // namespace

TEST_CASE("GGUF metadata of every value type round-trips", "[gguf]") {
  for (uint32_t version : {2u, 3u}) {
    const auto bytes = sample_writer(version).bytes();
    const auto f = GGUFFile::parse(bytes, "mem.gguf");
    CHECK(f.version() == version);
    CHECK(f.get_uint("u8") == 200);
    CHECK(f.find("i8")->i == -100);
    CHECK(f.get_uint("u16") == 65000);
    CHECK(f.find("i16")->i == -30000);
    CHECK(f.get_uint("u32") == 4000000000u);
    CHECK(f.find("i32")->i == -2000000000);
    CHECK(f.get_uint("u64") == 1000000000000000u);
    CHECK(f.find("i64")->i == -1000000000000000);
    CHECK(f.get_float("f32") == 0.5);
    CHECK(f.get_float("f64") == 1e-300);
    CHECK(f.get_bool("bool"));
    CHECK(f.get_string("str") == "héllo");
    CHECK(f.get_string_array("strs") == std::vector<std::string>{"a", "", "ccc"});
    CHECK(f.get_int_array("ints") == std::vector<int64_t>{1, -2, 3});
    CHECK(f.find("nested")->arr.at(0).arr.at(0).f == 1.5);
    CHECK(f.keys().front() == "general.architecture");
    REQUIRE(f.tensors().size() == 2);
    const auto& a = f.tensor("a");
    CHECK(a.ne == std::vector<uint64_t>{3, 2});
    CHECK(a.n_bytes == 24);
    CHECK(a.offset % 32 == 0);
    float x[6];
    std::memcpy(x, a.data.data(), 24);
    CHECK(x[5] == 6.0f);
    CHECK(f.tensor("b").n_bytes == 36);
    CHECK(f.tensor("b").offset % f.alignment() == 0);
  }
}

TEST_CASE("GGUF alignment key is honoured", "[gguf]") {
  GGUFWriter w(3, 64);
  w.add_uint32("general.alignment", 64);
  w.add_tensor("t", DType::F32, {3}, f32_bytes({1, 2, 3}));
  w.add_tensor("u", DType::F32, {1}, f32_bytes({7}));
  const auto bytes = w.bytes();
  const auto f = GGUFFile::parse(bytes, "m");
  CHECK(f.alignment() == 64);
  CHECK(f.data_offset() % 64 == 0);
  CHECK(f.tensor("u").offset == 64);
}

TEST_CASE("GGUF typed getters report the key and the expected type", "[gguf]") {
  const auto bytes = sample_writer().bytes();
  const auto f = GGUFFile::parse(bytes, "mem.gguf");
  test::require_error([&] { f.get_uint("str"); }, {"mem.gguf", "'str'", "integer", "string"});
  test::require_error([&] { f.get_string("u8"); }, {"'u8'", "expected string", "uint8"});
  test::require_error([&] { f.get_uint("i8"); }, {"'i8'"});  // negative is not a uint
  test::require_error([&] { f.get_string("nope"); }, {"'nope'", "missing"});
  test::require_error([&] { f.get_string_array("ints"); }, {"'ints'", "array of int32"});
  test::require_error([&] { f.tensor("zzz"); }, {"'zzz'", "missing"});
}

TEST_CASE("GGUF header damage gives clear errors", "[gguf]") {
  const auto good = sample_writer().bytes();
  auto parse = [](const std::vector<uint8_t>& b) { return GGUFFile::parse(b, "bad.gguf"); };
  {
    auto b = good;
    b[0] = 'X';
    test::require_error([&] { parse(b); }, {"bad.gguf", "magic", "GGUF"});
  }
  {
    auto b = good;
    poke32(b, 4, 1);
    test::require_error([&] { parse(b); }, {"version 1"});
    poke32(b, 4, 0x03000000);
    test::require_error([&] { parse(b); }, {"big-endian"});
    poke32(b, 4, 7);
    test::require_error([&] { parse(b); }, {"version 7"});
  }
  {
    auto b = good;
    poke64(b, 8, uint64_t{1} << 60);
    test::require_error([&] { parse(b); }, {"tensors"});
    b = good;
    poke64(b, 16, uint64_t{1} << 60);
    test::require_error([&] { parse(b); }, {"metadata"});
  }
  {
    auto b = good;
    poke64(b, 24, uint64_t{1} << 62);  // length of the first key
    test::require_error([&] { parse(b); }, {"string of"});
  }
  {
    // The first key is "general.architecture" (20 bytes); its type id follows at 24 + 8 + 20.
    auto b = good;
    poke32(b, 52, 99);
    test::require_error([&] { parse(b); }, {"general.architecture", "unknown value type 99"});
  }
}

TEST_CASE("GGUF tensor damage gives clear errors", "[gguf]") {
  auto parse = [](const std::vector<uint8_t>& b) { return GGUFFile::parse(b, "t.gguf"); };
  auto one_tensor = [](DType t, std::vector<uint64_t> ne, size_t bytes) {
    GGUFWriter w;
    w.add_tensor("w", t, std::move(ne), std::vector<uint8_t>(bytes));
    return w.bytes();
  };
  // Tensor info of the only tensor starts at 24: name (8 + 1), n_dims (4), dims, type, offset.
  auto b = one_tensor(DType::F32, {4}, 16);
  const size_t ndims_at = 24 + 9, dim0_at = ndims_at + 4, type_at = dim0_at + 8, off_at = type_at + 4;
  {
    auto c = b;
    poke32(c, type_at, 77);
    test::require_error([&] { parse(c); }, {"'w'", "unknown ggml type 77"});
  }
  {
    auto c = b;
    poke64(c, off_at, 1 << 20);
    test::require_error([&] { parse(c); }, {"'w'", "past the end"});
    poke64(c, off_at, 3);
    test::require_error([&] { parse(c); }, {"'w'", "alignment"});
  }
  {
    auto c = b;
    poke64(c, dim0_at, uint64_t{1} << 45);
    test::require_error([&] { parse(c); }, {"'w'", "dimension 0"});
    poke64(c, dim0_at, 0);
    test::require_error([&] { parse(c); }, {"'w'", "dimension 0"});
  }
  {
    // Each dimension in range but their product past 2^50: the message names the product, not a dimension.
    auto c = one_tensor(DType::F32, {4, 1}, 16);
    poke64(c, dim0_at, uint64_t{1} << 40);
    poke64(c, dim0_at + 8, uint64_t{1} << 20);
    test::require_error([&] { parse(c); }, {"'w'", "dimensions 1099511627776 and 1048576 hold more than 2^50"});
  }
  {
    // A second tensor's offset moved onto the first's data: found by an audit, it read that data as its own.
    GGUFWriter w;
    w.add_tensor("a", DType::F32, {8}, std::vector<uint8_t>(32));
    w.add_tensor("b", DType::F32, {8}, std::vector<uint8_t>(32));
    auto c = w.bytes();
    const size_t b_off_at = 24 + (9 + 4 + 8 + 4 + 8) + 9 + 4 + 8 + 4;
    REQUIRE(parse(c).tensor("b").offset == 32);
    poke64(c, b_off_at, 0);
    test::require_error([&] { parse(c); }, {"tensors 'a'", "and 'b' (at data offset 0) overlap"});
  }
  {
    auto c = b;
    poke32(c, ndims_at, 9);
    test::require_error([&] { parse(c); }, {"'w'", "9 dimensions"});
  }
  {
    auto c = one_tensor(DType::Q4_0, {32}, 18);
    poke64(c, dim0_at, 31);  // not a whole block
    test::require_error([&] { parse(c); }, {"'w'", "block size 32"});
  }
  {
    GGUFWriter w;
    w.add_tensor("w", DType::F32, {1}, f32_bytes({1}));
    w.add_tensor("w", DType::F32, {1}, f32_bytes({1}));
    test::require_error([&] { parse(w.bytes()); }, {"duplicate tensor name 'w'"});
  }
  {
    GGUFWriter w;
    w.add_uint32("k", 1);
    w.add_uint32("k", 2);
    test::require_error([&] { parse(w.bytes()); }, {"duplicate metadata key 'k'"});
  }
  {
    GGUFWriter w;
    w.add_uint32("general.alignment", 48);
    test::require_error([&] { parse(w.bytes()); }, {"general.alignment", "power of two"});
  }
}

TEST_CASE("every truncation of a small GGUF is a clean error", "[gguf]") {
  const auto good = sample_writer().bytes();
  // The last tensor's data ends before the final alignment padding; cuts inside the padding leave
  // a complete file, every earlier cut must be reported.
  const auto full = GGUFFile::parse(good, "full");
  const auto& last = full.tensors().back();
  const size_t needed = full.data_offset() + last.offset + last.n_bytes;
  for (size_t n = 0; n < needed; ++n) {
    const std::vector<uint8_t> cut(good.begin(), good.begin() + static_cast<std::ptrdiff_t>(n));
    INFO("truncated to " << n << " bytes");
    CHECK_THROWS_AS(GGUFFile::parse(cut, "cut.gguf"), Error);
  }
}

TEST_CASE("random corruption of a small GGUF never crashes", "[gguf]") {
  const auto good = sample_writer().bytes();
  std::mt19937 rng(1);
  int errors = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    auto b = good;
    const int flips = 1 + static_cast<int>(rng() % 4);
    for (int k = 0; k < flips; ++k) b[rng() % 400] ^= static_cast<uint8_t>(1u << (rng() % 8));
    try {
      GGUFFile::parse(b, "fuzz.gguf");
    } catch (const Error&) {
      ++errors;
    }
  }
  CHECK(errors > 0);
}

TEST_CASE("the real model file: truncations and flipped header bytes", "[gguf][model]") {
  auto path = test::model_file(test::kDefaultModel);
  if (!path) return;
  MappedFile map(*path);
  const auto all = map.bytes();
  const auto f = GGUFFile::parse(all, *path);
  CHECK(f.version() == 3);
  CHECK(f.tensors().size() == 272);
  CHECK(f.keys().size() == 33);

  // One cut inside each region of the file: fixed header, metadata (key, type, string value, array),
  // tensor infos, alignment padding before data, each tensor's data, and one byte short of the end.
  std::vector<size_t> cuts = {0, 3, 7, 15, 23, 30, 100, 1000, 50000, 500000, 1500000};
  for (size_t k = 0; k < f.tensors().size(); k += 17)
    cuts.push_back(f.data_offset() + f.tensors()[k].offset + f.tensors()[k].n_bytes / 2);
  cuts.push_back(f.data_offset() - 1);
  cuts.push_back(all.size() - 1);
  for (size_t n : cuts) {
    INFO("cut at " << n);
    try {
      GGUFFile::parse(all.first(n), *path);
      FAIL("truncated file accepted");
    } catch (const Error& e) {
      CHECK(std::string(e.what()).find(*path) != std::string::npos);
    }
  }

  // Flip bytes of the header region in a copy: every 24-byte fixed header byte and a sample of the
  // metadata and tensor-info bytes. Fixed-header damage must be rejected; elsewhere a flip may land in
  // a string and leave a valid file, but never a crash.
  std::vector<uint8_t> copy(all.begin(), all.end());
  std::mt19937 rng(3);
  std::vector<size_t> positions;
  for (size_t p = 0; p < 24; ++p) positions.push_back(p);
  for (int k = 0; k < 60; ++k) positions.push_back(24 + rng() % (f.data_offset() - 24));
  for (size_t p : positions) {
    for (uint8_t mask : {uint8_t{0x01}, uint8_t{0x80}}) {
      copy[p] ^= mask;
      INFO("flipped byte " << p << " with mask " << int(mask));
      bool threw = false;
      try {
        GGUFFile::parse(copy, *path);
      } catch (const Error&) {
        threw = true;
      }
      // Flipping the low bit of the version turns 3 into 2, a valid version; high bits of the
      // 64-bit counts make them absurd; their low bits may still fit the file.
      if (p < 4 || (p >= 4 && p < 8 && mask == 0x80)) CHECK(threw);
      copy[p] ^= mask;
    }
  }
}

TEST_CASE("GGUF linear rope scaling: a factor of 0 is none, as llama.cpp reads it", "[gguf][config]") {
  const test::TempDir dir("gguf_rope");
  auto config_with_factor = [&](float factor) {
    GGUFWriter w;
    w.add_string("general.architecture", "llama");
    for (const auto& [key, value] : std::vector<std::pair<const char*, uint32_t>>{{"llama.block_count", 1},
                                                                                  {"llama.context_length", 128},
                                                                                  {"llama.embedding_length", 8},
                                                                                  {"llama.feed_forward_length", 16},
                                                                                  {"llama.attention.head_count", 2},
                                                                                  {"llama.vocab_size", 10}})
      w.add_uint32(key, value);
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.add_string("llama.rope.scaling.type", "linear");
    w.add_float32("llama.rope.scaling.factor", factor);
    const std::string path = (dir / "m.gguf").string();
    w.write(path);
    return config_from_gguf(GGUFFile::open(path));
  };
  CHECK(config_with_factor(0).rope_scaling.type == RopeScaling::Type::None);
  const ModelConfig scaled = config_with_factor(4);
  CHECK(scaled.rope_scaling.type == RopeScaling::Type::Linear);
  CHECK(scaled.rope_scaling.factor == 4);
  test::require_error([&] { config_with_factor(-1); }, {"m.gguf"});
}
