#include "kernels/dtype.hpp"

#include <array>
#include <limits>

#include "harness/util/error.hpp"

namespace kvb {
namespace {

// Block geometry as ggml defines it; dequantizable marks what kernels/cpu/dequant implements.
constexpr std::array kTypes = {
    DTypeInfo{DType::F32, "F32", 1, 4, true},
    DTypeInfo{DType::F16, "F16", 1, 2, true},
    DTypeInfo{DType::Q4_0, "Q4_0", 32, 18, true},
    DTypeInfo{DType::Q4_1, "Q4_1", 32, 20, true},
    DTypeInfo{DType::Q5_0, "Q5_0", 32, 22, true},
    DTypeInfo{DType::Q5_1, "Q5_1", 32, 24, true},
    DTypeInfo{DType::Q8_0, "Q8_0", 32, 34, true},
    DTypeInfo{DType::Q8_1, "Q8_1", 32, 40, false},
    DTypeInfo{DType::Q2_K, "Q2_K", 256, 84, false},
    DTypeInfo{DType::Q3_K, "Q3_K", 256, 110, false},
    DTypeInfo{DType::Q4_K, "Q4_K", 256, 144, true},
    DTypeInfo{DType::Q5_K, "Q5_K", 256, 176, true},
    DTypeInfo{DType::Q6_K, "Q6_K", 256, 210, true},
    DTypeInfo{DType::Q8_K, "Q8_K", 256, 292, false},
    DTypeInfo{DType::IQ2_XXS, "IQ2_XXS", 256, 66, false},
    DTypeInfo{DType::IQ2_XS, "IQ2_XS", 256, 74, false},
    DTypeInfo{DType::IQ3_XXS, "IQ3_XXS", 256, 98, false},
    DTypeInfo{DType::IQ1_S, "IQ1_S", 256, 50, false},
    DTypeInfo{DType::IQ4_NL, "IQ4_NL", 32, 18, false},
    DTypeInfo{DType::IQ3_S, "IQ3_S", 256, 110, false},
    DTypeInfo{DType::IQ2_S, "IQ2_S", 256, 82, false},
    DTypeInfo{DType::IQ4_XS, "IQ4_XS", 256, 136, false},
    DTypeInfo{DType::I8, "I8", 1, 1, false},
    DTypeInfo{DType::I16, "I16", 1, 2, false},
    DTypeInfo{DType::I32, "I32", 1, 4, false},
    DTypeInfo{DType::I64, "I64", 1, 8, false},
    DTypeInfo{DType::F64, "F64", 1, 8, false},
    DTypeInfo{DType::IQ1_M, "IQ1_M", 256, 56, false},
    DTypeInfo{DType::BF16, "BF16", 1, 2, true},
    DTypeInfo{DType::TQ1_0, "TQ1_0", 256, 54, false},
    DTypeInfo{DType::TQ2_0, "TQ2_0", 256, 66, false},
};

}  // namespace

std::optional<DTypeInfo> dtype_info(uint32_t id) {
  for (const auto& t : kTypes)
    if (static_cast<uint32_t>(t.type) == id) return t;
  return std::nullopt;
}

const DTypeInfo& dtype_info(DType t) {
  for (const auto& i : kTypes)
    if (i.type == t) return i;
  fail("internal: unknown dtype id {}", static_cast<uint32_t>(t));
}

std::string_view dtype_name(DType t) { return dtype_info(t).name; }

std::optional<uint64_t> dtype_bytes(DType t, uint64_t n_elems) {
  const auto& i = dtype_info(t);
  if (n_elems % i.block_elems != 0) return std::nullopt;
  const uint64_t blocks = n_elems / i.block_elems;
  if (blocks > std::numeric_limits<uint64_t>::max() / i.block_bytes) return std::nullopt;
  return blocks * i.block_bytes;
}

}  // namespace kvb
