#pragma once
// Byte-pair-encoding tokenizer with the Hugging Face `tokenizers` semantics: added tokens, a
// pre-tokenizer made of regex splits (the variants of GPT-2, Llama 3, Qwen2, SmolLM), byte-level
// mapping, merges by rank (lowest rank first, leftmost among equals), optional ignore_merges and
// byte fallback. Built from GGUF metadata or from tokenizer.json.
#include <cstdint>
#include <memory>
#include <optional>
#include <string>
#include <unordered_map>
#include <utility>
#include <vector>

#include "harness/tokenizer/regex.hpp"
#include "harness/tokenizer/tokenizer.hpp"

namespace kvb {

class GGUFFile;

// One pre-tokenizer step, applied to every piece the previous steps produced.
struct PreSplit {
  enum class Behavior { Isolated, Removed };
  std::string pattern;  // empty: no split
  Behavior behavior = Behavior::Isolated;
  bool invert = false;  // the pattern describes the pieces rather than the delimiters
  // Prepend a space to each incoming piece that does not start with one (ByteLevel's
  // add_prefix_space, which acts on the pieces that reach it, before its own regex split).
  bool prefix_space = false;
  // Split the byte-level text (each byte as the character standing for it), as Hugging Face does for a
  // stage after ByteLevel: Falcon's Digits then sees the latin-1 stand-ins '²' or '¼' inside multi-byte
  // characters. The pieces handed on are raw bytes still.
  bool on_mapped = false;
};

struct BpeSpec {
  std::string name;                                         // pre-tokenizer name, for display
  std::vector<std::string> vocab;                           // id -> token text
  std::vector<std::pair<std::string, std::string>> merges;  // in rank order
  std::vector<AddedToken> added;
  SpecialTokens special;
  bool nfc = false;  // NFC-normalise text before pre-tokenizing (Qwen2)
  std::vector<PreSplit> splits;
  bool byte_level = true;      // map bytes to GPT-2's printable stand-ins before BPE
  bool ignore_merges = false;  // a pre-token found whole in the vocabulary is emitted as is
  bool byte_fallback = false;  // unknown pieces become <0xXX> byte tokens
  // What a character missing from the vocabulary becomes: the BPE model's own unk token if it
  // declares one (tokenizer.json model.unk_token), else nothing: the reference drops such bytes.
  std::optional<int32_t> model_unk;
};

// Regex splits of a named pre-tokenizer ("gpt2", "llama3", "qwen2", "smollm", ... as GGUF's
// tokenizer.ggml.pre names them). Error for an unknown name.
std::vector<PreSplit> pre_tokenizer_preset(const std::string& name, bool* nfc = nullptr, bool* ignore_merges = nullptr);

BpeSpec bpe_spec_from_gguf(const GGUFFile& f);
BpeSpec bpe_spec_from_tokenizer_json(const std::string& path);
// The added tokens of a tokenizer.json of any model type (a SentencePiece model's too).
std::vector<AddedToken> tokenizer_json_added_tokens(const std::string& path);

class BpeTokenizer : public Tokenizer {
 public:
  explicit BpeTokenizer(BpeSpec spec);
  ~BpeTokenizer() override;

  int32_t vocab_size() const override { return static_cast<int32_t>(vocab_.size()); }
  std::string token_text(int32_t id) const override;
  std::string kind() const override { return "bpe (" + name_ + ")"; }

 protected:
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode_plain(std::span<const int32_t> ids) const override;

 private:
  void bpe_word(const std::string& word, std::vector<int32_t>& out) const;
  std::vector<std::string> pre_tokenize(std::string_view text) const;

  std::string name_;
  std::vector<std::string> vocab_;
  std::unordered_map<std::string, int32_t> ids_;
  // (left id, right id) -> (rank, merged id)
  std::unordered_map<uint64_t, std::pair<int32_t, int32_t>> merges_;
  std::vector<std::unique_ptr<Regex>> regexes_;  // null where a step does not split
  std::vector<PreSplit> splits_;
  bool nfc_, byte_level_, ignore_merges_, byte_fallback_;
  std::optional<int32_t> model_unk_;
  std::array<int32_t, 256> byte_token_{};  // <0xXX> token ids for byte fallback, -1 if absent
};

}  // namespace kvb
