#pragma once
// SentencePiece tokenizer (Llama 2, Mistral) through libsentencepiece, from a tokenizer.model file or
// from the vocabulary of a GGUF file whose tokenizer.ggml.model is "llama".
#include <memory>
#include <string>

#include "harness/tokenizer/tokenizer.hpp"

namespace sentencepiece {
class SentencePieceProcessor;
}

namespace kvb {

class GGUFFile;

class SpmTokenizer : public Tokenizer {
 public:
  // `model_proto` is a serialised sentencepiece ModelProto; `name` is used in messages.
  SpmTokenizer(const std::string& model_proto, const std::string& name, SpecialTokens special);
  ~SpmTokenizer() override;

  static std::unique_ptr<SpmTokenizer> from_file(const std::string& path);
  static std::unique_ptr<SpmTokenizer> from_gguf(const GGUFFile& f);

  // The vocabulary in GGUF's form (tokenizer.ggml.tokens / scores / token_type).
  struct Vocab {
    std::vector<std::string> pieces;
    std::vector<float> scores;
    std::vector<int32_t> types;  // 1 normal, 2 unknown, 3 control, 5 unused, 6 byte
  };
  Vocab vocab() const;

  int32_t vocab_size() const override;
  std::string token_text(int32_t id) const override;
  std::string kind() const override { return "sentencepiece"; }

 protected:
  void encode_plain(std::string_view text, std::vector<int32_t>& out) const override;
  std::string decode_plain(std::span<const int32_t> ids) const override;

 private:
  std::string name_;
  std::unique_ptr<sentencepiece::SentencePieceProcessor> sp_;
};

// Serialises a sentencepiece ModelProto (BPE) from a vocabulary: the protobuf wire format written
// by hand, because Debian's libsentencepiece-dev does not ship the generated proto header.
std::string spm_model_proto(const std::vector<std::string>& pieces, const std::vector<float>& scores,
                            const std::vector<int64_t>& types, bool add_dummy_prefix, bool byte_fallback);

}  // namespace kvb
