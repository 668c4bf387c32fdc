// Arbitrary bytes into the safetensors header parser: success or kvb::Error, nothing else.
#include <cstdint>
#include <span>

#include "harness/model/safetensors.hpp"
#include "harness/util/error.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    (void)kvb::SafetensorsFile::parse(std::span<const uint8_t>(data, size), "fuzz.safetensors");
  } catch (const kvb::Error&) {
  }
  return 0;
}
