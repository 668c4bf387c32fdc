#pragma once
// Base64 (RFC 4648, with padding), for binary arrays inside JSON artifacts.
#include <cstdint>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvb {

std::string base64_encode(std::span<const uint8_t> bytes);
// Errors name `what` and the offending position.
std::vector<uint8_t> base64_decode(std::string_view text, const std::string& what);

// float32 arrays as little-endian bytes in base64.
std::string floats_to_base64(std::span<const float> x);
std::vector<float> floats_from_base64(std::string_view text, const std::string& what);

}  // namespace kvb
