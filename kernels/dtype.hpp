#pragma once
// Element types of model tensors, numbered as in GGUF (ggml_type) so that a GGUF type id maps directly.
// Safetensors dtypes map onto the same enum.
#include <cstddef>
#include <cstdint>
#include <optional>
#include <string_view>

namespace kvb {

enum class DType : uint32_t {
  F32 = 0,
  F16 = 1,
  Q4_0 = 2,
  Q4_1 = 3,
  Q5_0 = 6,
  Q5_1 = 7,
  Q8_0 = 8,
  Q8_1 = 9,
  Q2_K = 10,
  Q3_K = 11,
  Q4_K = 12,
  Q5_K = 13,
  Q6_K = 14,
  Q8_K = 15,
  IQ2_XXS = 16,
  IQ2_XS = 17,
  IQ3_XXS = 18,
  IQ1_S = 19,
  IQ4_NL = 20,
  IQ3_S = 21,
  IQ2_S = 22,
  IQ4_XS = 23,
  I8 = 24,
  I16 = 25,
  I32 = 26,
  I64 = 27,
  F64 = 28,
  IQ1_M = 29,
  BF16 = 30,
  TQ1_0 = 34,
  TQ2_0 = 35,
};

struct DTypeInfo {
  DType type;
  std::string_view name;
  uint32_t block_elems;  // elements per block (1 for plain types)
  uint32_t block_bytes;  // bytes per block
  bool dequantizable;    // whether kernels/cpu/dequant converts it to fp32
};

// Known types only; nullopt for an id this build does not know (the caller reports it with context).
std::optional<DTypeInfo> dtype_info(uint32_t id);
const DTypeInfo& dtype_info(DType t);
std::string_view dtype_name(DType t);

// Bytes needed for n elements, or nullopt if n is not a whole number of blocks or overflows.
std::optional<uint64_t> dtype_bytes(DType t, uint64_t n_elems);

}  // namespace kvb
