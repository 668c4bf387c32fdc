// Base64 (the float arrays of JSON artifacts) against its known encodings and its errors.
#include "harness/util/base64.hpp"
#include "test_util.hpp"

using namespace kvb;

TEST_CASE("base64 round trip and bad text", "[util]") {
  const std::vector<float> x = {1.5f, -0.0f, 3.0e-38f, 1e30f, 7.25f};
  CHECK(floats_from_base64(floats_to_base64(x), "t") == x);
  for (size_t n = 0; n < 7; ++n) {
    std::vector<uint8_t> b(n);
    for (size_t i = 0; i < n; ++i) b[i] = uint8_t(250 - 37 * i);
    CHECK(base64_decode(base64_encode(b), "t") == b);
  }
  CHECK(base64_encode(std::vector<uint8_t>{'M', 'a'}) == "TWE=");
  test::require_error([] { base64_decode("TWE", "maps[0][1]"); }, {"maps[0][1]", "multiple of 4"});
  test::require_error([] { base64_decode("TW!=", "f"); }, {"invalid base64", "offset 2"});
  test::require_error([] { floats_from_base64("TWE=", "f"); }, {"not whole float32"});
}
