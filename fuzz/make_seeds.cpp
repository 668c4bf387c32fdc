// Writes the starting corpus of every fuzz target under DIR/<target>/: small valid GGUF files (a BPE
// and a SentencePiece tokenizer, a tiny llama config, tensors of several types) written here, and for
// the file parsers the project's own specs, results and test fixtures. Targets whose first input byte
// picks a variant (longbench: the dataset, ruler: the file layout) get it prepended.
//   make_fuzz_seeds DIR
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <regex>
#include <sstream>
#include <string>

#include "harness/model/gguf_writer.hpp"

using namespace kvb;
namespace fs = std::filesystem;

namespace {

const fs::path kSource = KVBENCH_SOURCE_DIR;

std::string read(const fs::path& p, size_t max_lines = SIZE_MAX) {
  std::ifstream in(p, std::ios::binary);
  if (!in) throw std::runtime_error(p.string() + ": cannot read");
  std::string out, line;
  for (size_t n = 0; n < max_lines && std::getline(in, line); ++n) out += line + "\n";
  return out;
}

void write(const fs::path& p, const std::string& s) {
  fs::create_directories(p.parent_path());
  std::ofstream(p, std::ios::binary) << s;
}

void gguf_seeds(const fs::path& dir) {
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
    w.add_string_array("tokenizer.ggml.tokens",
                       {"<unk>", "<s>", "</s>", "H", "e", "l", "o", "He", "ll", "Ġ", "<0x41>"});
    w.add_int32_array("tokenizer.ggml.token_type", {2, 3, 3, 1, 1, 1, 1, 1, 1, 1, 6});
    w.add_string_array("tokenizer.ggml.merges", {"H e", "l l"});
    w.add_uint32("tokenizer.ggml.bos_token_id", 1);
    w.add_uint32("tokenizer.ggml.eos_token_id", 2);
    w.add_tensor("a", DType::F32, {2}, std::vector<uint8_t>(8, 0x3f));
    w.add_tensor("b", DType::Q4_K, {256}, std::vector<uint8_t>(144, 0x11));
    w.add_tensor("c", DType::Q8_0, {32}, std::vector<uint8_t>(34, 0x22));
    fs::create_directories(dir);
    w.write((dir / fmt::format("seed_{}.gguf", tok_model)).string());
  }
}

}  // namespace

int main(int argc, char** argv) {
  if (argc != 2) {
    fmt::print(stderr, "usage: make_fuzz_seeds DIR\n");
    return 2;
  }
  const fs::path out = argv[1];
  gguf_seeds(out / "gguf");
  // The specs name a model that must exist; /dev/null does, so the fuzzer gets past that check.
  const std::regex model_line("^model:.*$", std::regex::multiline);
  for (const auto& e : fs::directory_iterator(kSource / "experiments"))
    write(out / "spec" / e.path().filename(), std::regex_replace(read(e.path()), model_line, "model: /dev/null"));
  for (const auto& e : fs::recursive_directory_iterator(kSource / "results"))
    if (e.path().extension() == ".jsonl")
      write(out / "results" /
                fmt::format("{}-{}", e.path().parent_path().filename().string(), e.path().filename().string()),
            read(e.path(), 20));
  const fs::path fx = kSource / "tests/fixtures";
  write(out / "tokenizer_json/digits_grouped.json", read(fx / "tokenizer/synthetic/digits_grouped.json"));
  write(out / "tokenizer_json/tiny.json",
        R"({"added_tokens":[{"id":0,"content":"<|endoftext|>","special":true}],)"
        R"("pre_tokenizer":{"type":"ByteLevel","add_prefix_space":false,"use_regex":true},)"
        R"("model":{"type":"BPE","vocab":{"<|endoftext|>":0,"H":1,"e":2,"l":3,"o":4,"He":5,"ll":6,"Ġ":7},)"
        R"("merges":["H e","l l"]}})");
  write(out / "config/tiny_llama.json", read(fx / "safetensors/tiny_llama/config.json"));
  // longbench: the byte indexes {qasper, gov_report, trec, passage_count, passage_retrieval_en, lcc}.
  write(out / "longbench/qasper.jsonl", std::string(1, '\0') + read(fx / "longbench/data/longbench/qasper.jsonl"));
  write(out / "longbench/trec.jsonl", std::string(1, '\2') + read(fx / "longbench/data/longbench/trec.jsonl"));
  // longbench_pred: the same dataset indexes; LongBench's pred/ layout.
  write(out / "longbench_pred/qasper.jsonl",
        std::string(1, '\0') +
            R"({"pred": "in Lyon", "answers": ["Paris", "Lyon"], "all_classes": null, "length": 3000})" + "\n" +
            R"({"pred": "Rome", "answers": ["Paris"], "all_classes": null, "length": 9100})" + "\n");
  write(out / "longbench_pred/trec.jsonl", std::string(1, '\2') +
                                               R"({"pred": "Abbreviation\nx", "answers": ["Abbreviation"], )" +
                                               R"("all_classes": ["Abbreviation", "Entity"], "length": 5000})" + "\n");
  // ruler: the byte indexes {2024 layout, 2025 layout, SQuAD, HotpotQA}.
  write(out / "ruler/2024.jsonl", std::string(1, '\0') + read(fx / "ruler/files/4096/niah_single_1.jsonl"));
  write(out / "ruler/2025.jsonl", std::string(1, '\1') + read(fx / "ruler/files/vt/validation.jsonl"));
  write(out / "ruler/squad.json", std::string(1, '\2') + read(fx / "ruler/qa/squad.json"));
  write(out / "ruler/hotpotqa.json", std::string(1, '\3') + read(fx / "ruler/qa/hotpotqa.json"));
  return 0;
}
