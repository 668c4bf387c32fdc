#include <bit>
#include <random>

#include "kernels/cpu/dequant.hpp"
#include "kernels/cpu/fp16.hpp"
#include "test_util.hpp"

using namespace kvb;

namespace {

std::vector<uint8_t> from_hex(const std::string& h) {
  std::vector<uint8_t> out(h.size() / 2);
  for (size_t i = 0; i < out.size(); ++i) out[i] = static_cast<uint8_t>(std::stoi(h.substr(2 * i, 2), nullptr, 16));
  return out;
}

void put_half(std::vector<uint8_t>& b, size_t at, float f) {
  const uint16_t h = float_to_half(f);
  b[at] = static_cast<uint8_t>(h & 0xFF);
  b[at + 1] = static_cast<uint8_t>(h >> 8);
}

std::vector<float> deq(DType t, const std::vector<uint8_t>& b) {
  const auto& info = dtype_info(t);
  std::vector<float> y(b.size() / info.block_bytes * info.block_elems);
  dequantize_ref(t, b.data(), y.data(), y.size());
  return y;
}

}  // namespace

TEST_CASE("fp16 conversion is exact for every half value", "[dequant]") {
  for (uint32_t h = 0; h < 65536; ++h) {
    const float f = half_to_float(static_cast<uint16_t>(h));
    if (std::isnan(f)) continue;
    REQUIRE(float_to_half(f) == h);
  }
  CHECK(half_to_float(0x3C00) == 1.0f);
  CHECK(half_to_float(0xC000) == -2.0f);
  CHECK(half_to_float(0x0001) == std::ldexp(1.0f, -24));  // smallest subnormal
  CHECK(half_to_float(0x7BFF) == 65504.0f);
  CHECK(float_to_half(1.0f + std::ldexp(1.0f, -11)) == 0x3C00);  // tie rounds to even
  CHECK(float_to_half(1e6f) == 0x7C00);
  CHECK(bf16_to_float(0x3F80) == 1.0f);
  CHECK(float_to_bf16(1.0f) == 0x3F80);
}

TEST_CASE("hand-computed Q4_0 and Q4_1 blocks", "[dequant]") {
  std::vector<uint8_t> b(18);
  put_half(b, 0, 0.5f);
  for (int j = 0; j < 16; ++j) b[2 + j] = static_cast<uint8_t>(j | (15 - j) << 4);
  auto y = deq(DType::Q4_0, b);
  // element j holds the low nibble of byte j, element j+16 the high nibble; both offset by 8.
  CHECK(y[0] == -4.0f);
  CHECK(y[15] == 3.5f);
  CHECK(y[16] == 3.5f);
  CHECK(y[31] == -4.0f);

  std::vector<uint8_t> c(20);
  put_half(c, 0, 0.25f);
  put_half(c, 2, -1.0f);
  for (int j = 0; j < 16; ++j) c[4 + j] = static_cast<uint8_t>(j | j << 4);
  y = deq(DType::Q4_1, c);
  CHECK(y[0] == -1.0f);
  CHECK(y[3] == -0.25f);
  CHECK(y[15] == 2.75f);
  CHECK(y[31] == 2.75f);
}

TEST_CASE("hand-computed Q5_0, Q5_1 and Q8_0 blocks", "[dequant]") {
  std::vector<uint8_t> b(22);
  put_half(b, 0, 1.0f);
  // qh = 0x80000002: fifth bit set for element 1 and element 31.
  b[2] = 0x02;
  b[3] = 0;
  b[4] = 0;
  b[5] = 0x80;
  for (int j = 0; j < 16; ++j) b[6 + j] = 0x3F;  // low nibble 15, high nibble 3
  auto y = deq(DType::Q5_0, b);
  CHECK(y[0] == -1.0f);    // 15 - 16
  CHECK(y[1] == 15.0f);    // 31 - 16
  CHECK(y[16] == -13.0f);  // 3 - 16
  CHECK(y[31] == 3.0f);    // 19 - 16

  std::vector<uint8_t> c(24);
  put_half(c, 0, 0.5f);
  put_half(c, 2, 2.0f);
  c[4] = 0x01;  // element 0 gets the fifth bit
  c[8] = 0x21;  // element 0 low nibble 1, element 16 high nibble 2
  y = deq(DType::Q5_1, c);
  CHECK(y[0] == 0.5f * 17 + 2.0f);
  CHECK(y[16] == 0.5f * 2 + 2.0f);
  CHECK(y[1] == 2.0f);

  std::vector<uint8_t> d(34);
  put_half(d, 0, 0.125f);
  d[2] = 0x80;  // -128
  d[3] = 0x7F;  // 127
  y = deq(DType::Q8_0, d);
  CHECK(y[0] == -16.0f);
  CHECK(y[1] == 15.875f);
  CHECK(y[2] == 0.0f);
}

TEST_CASE("hand-computed K-quant blocks", "[dequant]") {
  // Q4_K: d=1, dmin=0.5; sub-block 0 scale 2 min 3, sub-block 4 scale 0x25 min 0x11 (6-bit packed).
  std::vector<uint8_t> b(144, 0);
  put_half(b, 0, 1.0f);
  put_half(b, 2, 0.5f);
  b[4 + 0] = 2;                                        // scale[0]
  b[4 + 4] = 3;                                        // min[0]
  b[4 + 8] = 0x5 | 0x1 << 4;                           // low 4 bits of scale[4] and min[4]
  b[4 + 0] |= static_cast<uint8_t>((0x25 >> 4) << 6);  // high 2 bits of scale[4] ride on scale[0]
  b[4 + 4] |= static_cast<uint8_t>((0x11 >> 4) << 6);  // high 2 bits of min[4] ride on min[0]
  b[16] = 0x07;                                        // element 0 -> 7; element 32 -> 0
  b[16 + 64] = 0x09;                                   // element 128 (sub-block 4) -> 9
  auto y = deq(DType::Q4_K, b);
  CHECK(y[0] == 2.0f * 7 - 1.5f);
  CHECK(y[128] == 37.0f * 9 - 0.5f * 17);

  // Q6_K: d=0.5, scale[0]=-3; element 0 = (ql low 5 | qh bits 2) - 32 = 5 + 32 - 32 = 5.
  std::vector<uint8_t> c(210, 0);
  c[0] = 0x05;
  c[128] = 0x02;
  c[192] = static_cast<uint8_t>(-3);
  put_half(c, 208, 0.5f);
  y = deq(DType::Q6_K, c);
  CHECK(y[0] == 0.5f * -3 * 5);
  CHECK(y[1] == 0.5f * -3 * -32);

  // Q5_K: the fifth bit of sub-block 0 is bit 0 of qh.
  std::vector<uint8_t> d(176, 0);
  put_half(d, 0, 1.0f);
  d[4] = 1;      // scale[0] = 1, min[0] = 0
  d[16] = 0x01;  // qh: element 0 gets +16
  d[48] = 0x03;  // ql low nibble 3
  y = deq(DType::Q5_K, d);
  CHECK(y[0] == 19.0f);
}

TEST_CASE("the eight scales and mins of a K-quant block unpacked at once equal scale_min_k4's", "[dequant]") {
  std::mt19937 rng(11);
  std::uniform_int_distribution<int> byte(0, 255);
  for (int trial = 0; trial < 200; ++trial) {
    uint8_t packed[12];
    for (auto& v : packed) v = static_cast<uint8_t>(trial < 2 ? 255 * trial : byte(rng));  // all 0s, all 1s, random
    uint8_t out[16];
    unpack_scales_mins_k4(packed, out);
    for (int j = 0; j < 8; ++j) {
      uint8_t sc = 0, m = 0;
      scale_min_k4(j, packed, sc, m);
      INFO("trial " << trial << " sub-block " << j);
      CHECK(int(out[j]) == int(sc));
      CHECK(int(out[8 + j]) == int(m));
    }
  }
}

TEST_CASE("dequantization matches the gguf package bit for bit on random blocks", "[dequant]") {
  for (const auto& j : test::read_jsonl(test::fixture("gguf/dequant_blocks.jsonl"))) {
    const std::string name = j["type"];
    INFO("type " << name);
    DType t = DType::F32;
    for (uint32_t id = 0; id < 64; ++id)
      if (auto info = dtype_info(id); info && info->name == name) t = info->type;
    REQUIRE(dtype_name(t) == name);
    const auto bytes = from_hex(j["hex"]);
    const size_t n = j["n"];
    std::vector<float> ref(n), fast(n);
    dequantize_ref(t, bytes.data(), ref.data(), n);
    dequantize(t, bytes.data(), fast.data(), n);
    const auto bits = j["bits"].get<std::vector<uint32_t>>();
    for (size_t i = 0; i < n; ++i) {
      INFO("element " << i);
      REQUIRE(std::bit_cast<uint32_t>(ref[i]) == bits[i]);
      REQUIRE(std::bit_cast<uint32_t>(fast[i]) == bits[i]);
    }
  }
}

TEST_CASE("parallel dequantization equals the reference on large random tensors", "[dequant]") {
  std::mt19937 rng(7);
  for (DType t : {DType::Q4_0, DType::Q4_1, DType::Q5_0, DType::Q5_1, DType::Q8_0, DType::Q4_K, DType::Q5_K,
                  DType::Q6_K, DType::F16, DType::BF16, DType::F32}) {
    const auto& info = dtype_info(t);
    const size_t blocks = 20000;
    std::vector<uint8_t> b(blocks * info.block_bytes);
    for (auto& x : b) x = static_cast<uint8_t>(rng());
    const size_t n = blocks * info.block_elems;
    std::vector<float> ref(n), fast(n);
    dequantize_ref(t, b.data(), ref.data(), n);
    dequantize(t, b.data(), fast.data(), n);
    INFO(info.name);
    CHECK(std::memcmp(ref.data(), fast.data(), n * sizeof(float)) == 0);
  }
}

TEST_CASE("unsupported types and partial blocks are errors", "[dequant]") {
  std::vector<uint8_t> b(84);
  std::vector<float> y(256);
  test::require_error([&] { dequantize(DType::Q2_K, b.data(), y.data(), 256); }, {"Q2_K", "not supported"});
  test::require_error([&] { dequantize(DType::Q4_0, b.data(), y.data(), 33); }, {"33", "Q4_0"});
}
