// Chooses the tokenizer implementation for a model from what its files declare.
#include <fmt/format.h>

#include <algorithm>
#include <cstdint>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>
#include <optional>
#include <vector>

#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/bpe.hpp"
#include "harness/tokenizer/spm.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {
namespace {

// Errors that arise while a tokenizer is built from a file's contents (a merge of tokens missing from
// the vocabulary, a split pattern that does not compile) name the file.
template <class Make>
std::unique_ptr<Tokenizer> naming(const std::string& path, Make&& make) {
  try {
    return make();
  } catch (const Error& e) {
    if (std::string_view(e.what()).starts_with(path)) throw;
    fail("{}: {}", path, e.what());
  }
}

std::unique_ptr<Tokenizer> from_gguf(const GGUFFile& f) {
  const std::string& model = f.get_string("tokenizer.ggml.model");
  if (model == "gpt2") return naming(f.path(), [&] { return std::make_unique<BpeTokenizer>(bpe_spec_from_gguf(f)); });
  if (model == "llama") return naming(f.path(), [&] { return SpmTokenizer::from_gguf(f); });
  if (model == "no_vocab")
    fail(
        "{}: the model has no tokenizer (tokenizer.ggml.model = 'no_vocab', as kvbench make-model writes): it runs "
        "on token ids, not text",
        f.path());
  fail("{}: tokenizer.ggml.model = '{}' is not supported (expected 'gpt2' or 'llama')", f.path(), model);
}

std::unique_ptr<Tokenizer> from_dir_files(const std::string& dir) {
  namespace fs = std::filesystem;
  const fs::path json = fs::path(dir) / "tokenizer.json";
  const fs::path spm = fs::path(dir) / "tokenizer.model";
  // Byte-level BPE models are described by tokenizer.json. SentencePiece models ship a
  // tokenizer.json too, in a form we do not read; their tokenizer.model is the reference for them.
  if (fs::exists(json)) {
    try {
      return naming(json.string(),
                    [&] { return std::make_unique<BpeTokenizer>(bpe_spec_from_tokenizer_json(json.string())); });
    } catch (const Error&) {
      if (!fs::exists(spm)) throw;
    }
  }
  if (fs::exists(spm)) return SpmTokenizer::from_file(spm.string());
  fail("{}: no tokenizer.json or tokenizer.model found", dir);
}

// A JSON file of the model's directory, or null where there is none.
nlohmann::json read_if_present(const std::filesystem::path& path) {
  if (!std::filesystem::exists(path)) return nullptr;
  std::ifstream in(path);
  return with_json_errors(path.string(), [&] { return nlohmann::json::parse(in); });
}

// The end-of-generation ids transformers' generate stops at: generation_config.json's eos_token_id, or
// config.json's where there is no generation config (GenerationConfig.from_model_config). A base
// model's (Llama 3's <|end_of_text|>) leave out the turn ends its tokenizer also holds.
std::optional<std::vector<int32_t>> generation_eos(const std::filesystem::path& dir, const Tokenizer& tok) {
  const nlohmann::json gen = read_if_present(dir / "generation_config.json"),
                       cfg = read_if_present(dir / "config.json");
  // The ids must index the model's logits: config.json's vocab_size where it says (a SentencePiece
  // directory's tokenizer.model leaves out the added tokens), else the tokenizer's with its added ones.
  int64_t vocab = tok.vocab_size();
  for (const auto& a : tok.added_tokens()) vocab = std::max<int64_t>(vocab, int64_t(a.id) + 1);
  if (cfg.is_object() && cfg.contains("vocab_size") && cfg["vocab_size"].is_number_integer())
    vocab = cfg["vocab_size"].get<int64_t>();
  auto names_eos = [](const nlohmann::json& c) {
    return c.is_object() && c.contains("eos_token_id") && !c["eos_token_id"].is_null();
  };
  const bool from_gen = names_eos(gen);
  if (!from_gen && !names_eos(cfg)) return std::nullopt;
  const std::string path = (dir / (from_gen ? "generation_config.json" : "config.json")).string();
  const nlohmann::json& e = (from_gen ? gen : cfg)["eos_token_id"];
  std::vector<int32_t> ids;
  for (const auto& v : e.is_array() ? e : nlohmann::json::array({e})) {
    if (!v.is_number_integer() || v.get<int64_t>() < 0 || v.get<int64_t>() >= vocab)
      fail("{}: field 'eos_token_id' must be a token id in [0, {}) or a list of them, not {}", path, vocab, v.dump());
    ids.push_back(v.get<int32_t>());
  }
  if (ids.empty()) fail("{}: field 'eos_token_id' is an empty list", path);
  return ids;
}

std::unique_ptr<Tokenizer> from_dir(const std::string& dir) {
  auto tok = from_dir_files(dir);
  const auto cfg = std::filesystem::path(dir) / "tokenizer_config.json";
  const nlohmann::json c = read_if_present(cfg);
  // A true/false field of tokenizer_config.json, nullopt where it is absent or null.
  const auto flag = [&](const char* key) -> std::optional<bool> {
    if (!c.is_object() || !c.contains(key) || c[key].is_null()) return std::nullopt;
    if (!c[key].is_boolean()) fail("{}: field '{}' must be true or false", cfg.string(), key);
    return c[key].get<bool>();
  };
  if (tok->kind() == "sentencepiece") {
    // What transformers 4's LlamaTokenizerFast holds beside tokenizer.model: tokenizer.json's added
    // tokens, and BOS/EOS as the config's add_bos_token / add_eos_token say (its defaults: BOS, no EOS;
    // it rebuilds tokenizer.json's post-processor from them).
    const auto json = std::filesystem::path(dir) / "tokenizer.json";
    if (std::filesystem::exists(json)) {
      try {
        tok->add_tokens(tokenizer_json_added_tokens(json.string()));
      } catch (const Error& e) {  // tokenizer.model alone is the model (a Git LFS pointer, say, here)
        fmt::print(stderr, "note: {}; reading tokenizer.model without the added tokens\n", e.what());
      }
    }
    tok->set_add_bos_eos(flag("add_bos_token").value_or(true), flag("add_eos_token").value_or(false));
  }
  if (auto eos = generation_eos(dir, *tok)) tok->set_end_of_generation(std::move(*eos));
  if (const auto clean = flag("clean_up_tokenization_spaces")) tok->set_clean_up_tokenization_spaces(*clean);
  return tok;
}

}  // namespace

std::unique_ptr<Tokenizer> load_tokenizer(const ModelFile& model) {
  if (model.gguf()) return from_gguf(*model.gguf());
  return from_dir(model.path());
}

std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path) {
  namespace fs = std::filesystem;
  if (fs::is_directory(path)) return from_dir(path);
  const std::string ext = fs::path(path).extension().string();
  if (ext == ".gguf") return from_gguf(GGUFFile::open(path));
  if (ext == ".json")
    return naming(path, [&] { return std::make_unique<BpeTokenizer>(bpe_spec_from_tokenizer_json(path)); });
  if (ext == ".model") return SpmTokenizer::from_file(path);
  fail(
      "{}: unknown tokenizer file (expected .gguf, tokenizer.json, tokenizer.model or a model "
      "directory)",
      path);
}

}  // namespace kvb
