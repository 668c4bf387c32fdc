#include "harness/tokenizer/spm.hpp"

#include <sentencepiece_processor.h>

#include <bit>
#include <fstream>
#include <sstream>

#include "harness/model/gguf.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

void put_varint(std::string& out, uint64_t v) {
  while (v >= 0x80) {
    out += static_cast<char>((v & 0x7F) | 0x80);
    v >>= 7;
  }
  out += static_cast<char>(v);
}
void put_tag(std::string& out, uint32_t field, uint32_t wire) { put_varint(out, field << 3 | wire); }
void put_bytes(std::string& out, uint32_t field, const std::string& s) {
  put_tag(out, field, 2);
  put_varint(out, s.size());
  out += s;
}
void put_uint(std::string& out, uint32_t field, uint64_t v) {
  put_tag(out, field, 0);
  put_varint(out, v);
}
void put_float(std::string& out, uint32_t field, float f) {
  put_tag(out, field, 5);
  const auto bits = std::bit_cast<uint32_t>(f);
  for (int k = 0; k < 4; ++k) out += static_cast<char>(bits >> (8 * k) & 0xFF);
}

int64_t find_piece(const std::vector<std::string>& pieces, std::string_view p) {
  for (size_t k = 0; k < pieces.size(); ++k)
    if (pieces[k] == p) return static_cast<int64_t>(k);
  return -1;
}

}  // namespace

std::string spm_model_proto(const std::vector<std::string>& pieces, const std::vector<float>& scores,
                            const std::vector<int64_t>& types, bool add_dummy_prefix, bool byte_fallback) {
  // Field numbers from sentencepiece_model.proto: ModelProto{pieces=1, trainer_spec=2,
  // normalizer_spec=3}; SentencePiece{piece=1, score=2, type=3}; TrainerSpec{model_type=3,
  // vocab_size=4, byte_fallback=35, unk_id=40, bos_id=41, eos_id=42, pad_id=43};
  // NormalizerSpec{name=1, add_dummy_prefix=3, remove_extra_whitespaces=4, escape_whitespaces=5}.
  std::string out;
  for (size_t k = 0; k < pieces.size(); ++k) {
    std::string p;
    put_bytes(p, 1, pieces[k]);
    put_float(p, 2, k < scores.size() ? scores[k] : 0.0f);
    put_uint(p, 3, k < types.size() && types[k] > 0 ? static_cast<uint64_t>(types[k]) : 1);
    put_bytes(out, 1, p);
  }
  std::string trainer;
  put_uint(trainer, 3, 2);  // BPE
  put_uint(trainer, 4, pieces.size());
  put_uint(trainer, 35, byte_fallback ? 1 : 0);
  int64_t unk = find_piece(pieces, "<unk>");
  for (size_t k = 0; k < types.size(); ++k)
    if (types[k] == 2) unk = static_cast<int64_t>(k);
  // Negative ids (absent tokens) encode as 10-byte varints, as protobuf writes int32 -1.
  put_uint(trainer, 40, static_cast<uint64_t>(unk < 0 ? 0 : unk));
  put_uint(trainer, 41, static_cast<uint64_t>(find_piece(pieces, "<s>")));
  put_uint(trainer, 42, static_cast<uint64_t>(find_piece(pieces, "</s>")));
  put_uint(trainer, 43, static_cast<uint64_t>(int64_t{-1}));
  put_bytes(out, 2, trainer);
  std::string norm;
  put_bytes(norm, 1, "identity");
  put_uint(norm, 3, add_dummy_prefix ? 1 : 0);
  put_uint(norm, 4, 0);
  put_uint(norm, 5, 1);
  put_bytes(out, 3, norm);
  return out;
}

SpmTokenizer::SpmTokenizer(const std::string& model_proto, const std::string& name, SpecialTokens special)
    : name_(name), sp_(std::make_unique<sentencepiece::SentencePieceProcessor>()) {
  const auto st = sp_->LoadFromSerializedProto(model_proto);
  if (!st.ok()) fail("{}: not a SentencePiece model: {}", name, st.ToString());
  special_ = std::move(special);
  // Control pieces written in the text map to their ids, as Hugging Face's Llama tokenizer splits on
  // them before calling sentencepiece (which itself matches user-defined pieces).
  std::vector<AddedToken> added;
  for (int id = 0; id < sp_->GetPieceSize(); ++id)
    if (sp_->IsControl(id)) added.push_back({id, sp_->IdToPiece(id), true, false, false});
  set_added_tokens(std::move(added));
}

SpmTokenizer::~SpmTokenizer() = default;

std::unique_ptr<SpmTokenizer> SpmTokenizer::from_file(const std::string& path) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot open", path);
  std::stringstream ss;
  ss << in.rdbuf();
  auto t = std::make_unique<SpmTokenizer>(ss.str(), path, SpecialTokens{});
  SpecialTokens s;
  if (t->sp_->bos_id() >= 0) s.bos = t->sp_->bos_id();
  if (t->sp_->eos_id() >= 0) s.eos = t->sp_->eos_id();
  if (t->sp_->unk_id() >= 0) s.unk = t->sp_->unk_id();
  s.add_bos = true;  // Llama 2 and Mistral prepend <s>
  add_turn_ends(s, t->added_tokens());
  t->special_ = s;
  return t;
}

std::unique_ptr<SpmTokenizer> SpmTokenizer::from_gguf(const GGUFFile& f) {
  const auto pieces = f.get_string_array("tokenizer.ggml.tokens");
  std::vector<float> scores;
  if (f.has("tokenizer.ggml.scores"))
    for (double d : f.get_float_array("tokenizer.ggml.scores")) scores.push_back(static_cast<float>(d));
  std::vector<int64_t> types;
  if (f.has("tokenizer.ggml.token_type")) types = f.get_int_array("tokenizer.ggml.token_type");
  if ((!scores.empty() && scores.size() != pieces.size()) || (!types.empty() && types.size() != pieces.size()))
    fail("{}: tokenizer scores/token_type must have one entry per token ({})", f.path(), pieces.size());
  bool byte_fallback = false;
  for (auto t : types) byte_fallback |= t == 6;
  const bool dummy = f.get_bool_opt("tokenizer.ggml.add_space_prefix").value_or(true);
  auto t = std::make_unique<SpmTokenizer>(spm_model_proto(pieces, scores, types, dummy, byte_fallback), f.path(),
                                          SpecialTokens{});
  t->special_ = special_tokens_from_gguf(f, pieces.size(), true);
  add_turn_ends(t->special_, t->added_tokens());
  return t;
}

SpmTokenizer::Vocab SpmTokenizer::vocab() const {
  Vocab v;
  for (int id = 0; id < sp_->GetPieceSize(); ++id) {
    v.pieces.push_back(sp_->IdToPiece(id));
    v.scores.push_back(sp_->GetScore(id));
    v.types.push_back(sp_->IsUnknown(id)   ? 2
                      : sp_->IsControl(id) ? 3
                      : sp_->IsUnused(id)  ? 5
                      : sp_->IsByte(id)    ? 6
                                           : 1);
  }
  return v;
}

int32_t SpmTokenizer::vocab_size() const { return sp_->GetPieceSize(); }

std::string SpmTokenizer::token_text(int32_t id) const {
  if (const AddedToken* a = added_token(id); a && id >= vocab_size()) return a->content;  // a directory's own
  if (id < 0 || id >= vocab_size()) fail("token id {} is outside the vocabulary", id);
  return sp_->IdToPiece(id);
}

void SpmTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  std::vector<int> ids;
  const auto st = sp_->Encode(text, &ids);
  if (!st.ok()) fail("{}: sentencepiece encode failed: {}", name_, st.ToString());
  out.insert(out.end(), ids.begin(), ids.end());
}

std::string SpmTokenizer::decode_plain(std::span<const int32_t> ids) const {
  std::string text;
  const std::vector<int> v(ids.begin(), ids.end());
  const auto st = sp_->Decode(v, &text);
  if (!st.ok()) fail("{}: sentencepiece decode failed: {}", name_, st.ToString());
  return text;
}

}  // namespace kvb
