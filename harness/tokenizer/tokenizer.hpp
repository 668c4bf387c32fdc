#pragma once
// Tokenizer interface: text <-> token ids exactly as the model's reference tokenizer does it
// (Hugging Face tokenizers / sentencepiece), plus the model's BOS/EOS conventions.
#include <array>
#include <cstdint>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <string_view>
#include <vector>

namespace kvb {

class GGUFFile;
class ModelFile;

// A token written literally in the text (e.g. "<|im_start|>") that bypasses the normal algorithm.
struct AddedToken {
  int32_t id = 0;
  std::string content;
  bool special = true;  // special tokens are skipped when decoding with skip_special
  bool lstrip = false;  // swallow whitespace on the left of the match
  bool rstrip = false;  // swallow whitespace on the right of the match
};

struct SpecialTokens {
  std::optional<int32_t> bos, eos, unk, pad;
  bool add_bos = false;
  bool add_eos = false;
  std::vector<int32_t> end_of_generation;  // eos plus e.g. <|im_end|>, <|eot_id|>
};

class Tokenizer {
 public:
  virtual ~Tokenizer() = default;

  // Ids of `text` without BOS/EOS. Added tokens written in the text are recognised; special ones only
  // when parse_special is true (the Hugging Face default).
  std::vector<int32_t> encode(std::string_view text, bool parse_special = true) const;
  // Ids for a model prompt: BOS/EOS added as the model's tokenizer config says.
  std::vector<int32_t> encode_prompt(std::string_view text) const;
  // Text of ids; bytes of partial UTF-8 sequences are kept as they are.
  virtual std::string decode(std::span<const int32_t> ids, bool skip_special = false) const;

  virtual int32_t vocab_size() const = 0;
  // The vocabulary entry of a token as stored (byte-level or SentencePiece form).
  virtual std::string token_text(int32_t id) const = 0;
  virtual std::string kind() const = 0;  // "bpe (smollm)", "sentencepiece", ...

  const SpecialTokens& special() const { return special_; }
  // tokenizer_config.json's clean_up_tokenization_spaces, where the model's directory has one (GGUF
  // files do not carry it): transformers 4.x's decode then applies clean_up_tokenization.
  std::optional<bool> clean_up_tokenization_spaces() const { return clean_up_; }
  void set_clean_up_tokenization_spaces(std::optional<bool> on) { clean_up_ = on; }
  bool is_end_of_generation(int32_t id) const;
  // The ids generation stops at, as the model's generation config names them (a Hugging Face
  // directory's), in place of those its tokens suggest.
  void set_end_of_generation(std::vector<int32_t> ids) { special_.end_of_generation = std::move(ids); }
  // A Hugging Face directory's word on a SentencePiece model, whose tokenizer.json kvbench does not read:
  // tokenizer.json's added tokens (a fine-tune's <|im_start|>, which tokenizer.model lacks), each
  // replacing one of the same id, and tokenizer_config.json's add_bos_token / add_eos_token.
  void add_tokens(const std::vector<AddedToken>& tokens);
  void set_add_bos_eos(bool bos, bool eos) {
    special_.add_bos = bos;
    special_.add_eos = eos;
  }
  const std::vector<AddedToken>& added_tokens() const { return added_; }
  const AddedToken* added_token(int32_t id) const;

 protected:
  // Encodes a stretch of text that contains no added tokens.
  virtual void encode_plain(std::string_view text, std::vector<int32_t>& out) const = 0;
  // Text of a run of ordinary (non-added) tokens.
  virtual std::string decode_plain(std::span<const int32_t> ids) const = 0;
  void set_added_tokens(std::vector<AddedToken> tokens);

  SpecialTokens special_;

 private:
  std::optional<bool> clean_up_;
  std::vector<AddedToken> added_;
  std::vector<int32_t> added_by_id_;          // index into added_, or -1, by token id
  std::array<bool, 256> added_first_byte_{};  // lets encode skip positions no added token starts at
};

// transformers' clean_up_tokenization: " ." -> ".", " ?", " !", " ,", " ' " -> "'", " n't", " 'm", " 's",
// " 've", " 're" (each replaced over the whole text, in that order).
std::string clean_up_tokenization(std::string text);

// BOS/EOS/UNK/PAD ids and add-BOS/EOS flags from GGUF metadata (tokenizer.ggml.*), checked against
// the vocabulary size, with end-of-generation ids from eos, eot and eom.
SpecialTokens special_tokens_from_gguf(const GGUFFile& f, size_t n_vocab, bool default_add_bos);
// Adds eos and the special added tokens that end a chat turn (<|im_end|>, <|eot_id|>, </s>, ...) to
// the end-of-generation ids, as llama.cpp does for these models.
void add_turn_ends(SpecialTokens& s, const std::vector<AddedToken>& added);

// The tokenizer stored with a model: GGUF metadata, or tokenizer.json / tokenizer.model in a
// Hugging Face directory.
std::unique_ptr<Tokenizer> load_tokenizer(const ModelFile& model);
// A tokenizer from a standalone file: tokenizer.json, tokenizer.model, or a .gguf file.
std::unique_ptr<Tokenizer> load_tokenizer_file(const std::string& path);

}  // namespace kvb
