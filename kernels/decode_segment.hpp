#pragma once
// What the CUDA decode kernels read of one segment of a head's cache: its format's kind and the device
// arrays it keeps. Plain pointers and integers, so that the formats (harness/cache, methods/) describe
// their device form beside their CPU code without the CUDA headers (Segment::device_form).
#include <cstdint>

namespace kvb::cuda {

enum SegmentKind : int32_t {
  kDense = 0,           // k, v [n, d] fp32
  kLowRank = 1,         // ck [n, rk], cv [n, rv]; bases [d, R]; keys post-RoPE
  kLowRankPreRope = 2,  // as kLowRank with RoPE applied to each rebuilt key at its position
  kQuantized = 3,       // KVmix packing, kernels/cpu/kv_quant.hpp
  kApproxAffine = 4,    // keys [n, d] post-RoPE; v = W rope^-1(k) + c
};

struct DecodeSegment {
  int32_t kind = kDense;
  int32_t cache_head = 0;
  int32_t n = 0;       // tokens
  int32_t offset = 0;  // index of its first token in the cache head's score row
  int32_t part = 0;    // index of its first partial sum (one per chunk of tokens)
  const float* k = nullptr;
  const float* v = nullptr;
  const int32_t* pos = nullptr;
  // low rank
  const float* basis_k = nullptr;
  const float* basis_v = nullptr;
  int32_t rk = 0, rv = 0, R = 0;
  // quantized
  const uint32_t* k_words = nullptr;
  const uint16_t* k_scale = nullptr;
  const uint16_t* k_min = nullptr;
  const uint32_t* v_words = nullptr;
  const uint16_t* v_scale = nullptr;
  const uint16_t* v_min = nullptr;
  int32_t k_bits = 0, v_bits = 0, k_group = 0, v_group = 0;
  // affine value estimator
  const float* w = nullptr;
  const float* c = nullptr;
};

}  // namespace kvb::cuda
