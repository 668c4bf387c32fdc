// Writes small valid GGUF files (a BPE and a SentencePiece tokenizer, a tiny llama config, tensors of
// several types) as the starting corpus for gguf_fuzz: make_fuzz_seeds DIR
#include <fmt/format.h>

#include <filesystem>

#include "harness/model/gguf_writer.hpp"

using namespace kvb;

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  std::filesystem::create_directories(argv[1]);
  for (const char* tok_model : {"gpt2", "llama"}) {
    GGUFWriter w;
    w.add_string("general.architecture", "llama");
    w.add_uint32("llama.block_count", 1);
    w.add_uint32("llama.context_length", 64);
    w.add_uint32("llama.embedding_length", 8);
    w.add_uint32("llama.feed_forward_length", 16);
    w.add_uint32("llama.attention.head_count", 2);
    w.add_uint32("llama.attention.head_count_kv", 1);
    w.add_float32("llama.attention.layer_norm_rms_epsilon", 1e-5f);
    w.add_string("tokenizer.ggml.model", tok_model);
    w.add_string("tokenizer.ggml.pre", "smollm");
    w.add_string_array("tokenizer.ggml.tokens", {"<unk>", "<s>", "</s>", "H", "e", "l", "o", "He", "ll", "Ġ", "<0x41>"});
    w.add_int32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6});
    w.add_string_array("tokenizer.ggml.merges", {"H e", "l l"});
    w.add_uint32("tokenizer.ggml.bos_token_id", 1);
    w.add_uint32("tokenizer.ggml.eos_token_id", 2);
    w.add_tensor("a", DType::F32, {2}, std::vector<uint8_t>(8, 0x3f));
    w.add_tensor("b", DType::Q4_K, {256}, std::vector<uint8_t>(144, 0x11));
    w.add_tensor("c", DType::Q8_0, {32}, std::vector<uint8_t>(34, 0x22));
    w.write(fmt::format("{}/seed_{}.gguf", argv[1], tok_model));
  }
  return 0;
}
