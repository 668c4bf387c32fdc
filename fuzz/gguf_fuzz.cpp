// Feeds arbitrary bytes to the GGUF reader and, when they parse, to everything that reads GGUF
// metadata: model config, tensor validation, tokenizer construction and a short encode. Any outcome
// but success or kvb::Error (a crash, a sanitizer report, another exception) is a bug.
#include <cstdint>
#include <span>

#include "harness/model/config.hpp"
#include "harness/model/gguf.hpp"
#include "harness/tokenizer/bpe.hpp"
#include "harness/tokenizer/spm.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/dequant.hpp"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  try {
    const auto f = kvb::GGUFFile::parse(std::span<const uint8_t>(data, size), "fuzz.gguf");
    for (const auto& t : f.tensors()) {
      if (!kvb::dtype_info(t.type).dequantizable || t.n_elems > 4096) continue;
      std::vector<float> out(t.n_elems);
      kvb::dequantize(t.type, t.data.data(), out.data(), out.size());
    }
    try {
      (void)kvb::config_from_gguf(f);
    } catch (const kvb::Error&) {
    }
    const auto model = f.get_string_opt("tokenizer.ggml.model");
    if (model == "gpt2") {
      kvb::BpeTokenizer tok(kvb::bpe_spec_from_gguf(f));
      const auto ids = tok.encode("Hello, world! 123 <|im_start|>");
      (void)tok.decode(ids);
    } else if (model == "llama") {
      auto tok = kvb::SpmTokenizer::from_gguf(f);
      (void)tok->decode(tok->encode("Hello, world!"));
    }
  } catch (const kvb::Error&) {
  }
  return 0;
}
