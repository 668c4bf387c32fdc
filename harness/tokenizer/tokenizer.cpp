#include "harness/tokenizer/tokenizer.hpp"

#include <algorithm>

#include "harness/model/gguf.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

bool is_space(char c) { return c == ' ' || c == '\t' || c == '\n' || c == '\r' || c == '\f' || c == '\v'; }

}  // namespace

SpecialTokens special_tokens_from_gguf(const GGUFFile& f, size_t n_vocab, bool default_add_bos) {
  auto id = [&](const char* key) -> std::optional<int32_t> {
    auto v = f.get_uint_opt(key);
    if (!v) return std::nullopt;
    if (*v >= n_vocab) fail("{}: {} = {} is outside the vocabulary of {} tokens", f.path(), key, *v, n_vocab);
    return static_cast<int32_t>(*v);
  };
  SpecialTokens s;
  s.bos = id("tokenizer.ggml.bos_token_id");
  s.eos = id("tokenizer.ggml.eos_token_id");
  s.unk = id("tokenizer.ggml.unknown_token_id");
  s.pad = id("tokenizer.ggml.padding_token_id");
  s.add_bos = f.get_bool_opt("tokenizer.ggml.add_bos_token").value_or(default_add_bos);
  s.add_eos = f.get_bool_opt("tokenizer.ggml.add_eos_token").value_or(false);
  for (const char* k : {"tokenizer.ggml.eot_token_id", "tokenizer.ggml.eom_token_id"})
    if (auto e = id(k)) s.end_of_generation.push_back(*e);
  return s;
}

void add_turn_ends(SpecialTokens& s, const std::vector<AddedToken>& added) {
  static const char* names[] = {"<|im_end|>",      "<|eot_id|>", "<|eom_id|>", "<|endoftext|>",
                                "<|end_of_text|>", "<|end|>",    "</s>",       "<end_of_turn>"};
  auto& eog = s.end_of_generation;
  if (s.eos) eog.push_back(*s.eos);
  for (const auto& a : added)
    if (a.special && std::find(std::begin(names), std::end(names), a.content) != std::end(names)) eog.push_back(a.id);
  std::sort(eog.begin(), eog.end());
  eog.erase(std::unique(eog.begin(), eog.end()), eog.end());
}

void Tokenizer::set_added_tokens(std::vector<AddedToken> tokens) {
  added_ = std::move(tokens);
  int32_t max_id = -1;
  for (const auto& t : added_) max_id = std::max(max_id, t.id);
  added_by_id_.assign(static_cast<size_t>(max_id + 1), -1);
  added_first_byte_.fill(false);
  for (size_t k = 0; k < added_.size(); ++k) {
    added_by_id_[added_[k].id] = static_cast<int32_t>(k);
    if (!added_[k].content.empty()) added_first_byte_[static_cast<unsigned char>(added_[k].content[0])] = true;
  }
}

void Tokenizer::add_tokens(const std::vector<AddedToken>& tokens) {
  std::vector<AddedToken> all = tokens;
  for (const AddedToken& a : added_)
    if (std::none_of(tokens.begin(), tokens.end(), [&](const AddedToken& t) { return t.id == a.id; })) all.push_back(a);
  std::sort(all.begin(), all.end(), [](const AddedToken& x, const AddedToken& y) { return x.id < y.id; });
  set_added_tokens(std::move(all));
  add_turn_ends(special_, added_);
}

const AddedToken* Tokenizer::added_token(int32_t id) const {
  if (id < 0 || static_cast<size_t>(id) >= added_by_id_.size() || added_by_id_[id] < 0) return nullptr;
  return &added_[added_by_id_[id]];
}

bool Tokenizer::is_end_of_generation(int32_t id) const {
  const auto& e = special_.end_of_generation;
  return std::find(e.begin(), e.end(), id) != e.end();
}

std::vector<int32_t> Tokenizer::encode(std::string_view text, bool parse_special) const {
  require_utf8(text, "tokenizer input");
  std::vector<int32_t> out;
  // Split on added tokens, leftmost match first and the longest among matches at one position, as
  // Hugging Face's added-vocabulary matcher does; the stretches between go through encode_plain.
  size_t seg_begin = 0, pos = 0;
  while (pos < text.size()) {
    const AddedToken* best = nullptr;
    if (added_first_byte_[static_cast<unsigned char>(text[pos])])
      for (const auto& t : added_) {
        if (t.special && !parse_special) continue;
        if (t.content.empty() || text.compare(pos, t.content.size(), t.content) != 0) continue;
        if (!best || t.content.size() > best->content.size()) best = &t;
      }
    if (!best) {
      ++pos;
      continue;
    }
    size_t seg_end = pos, next = pos + best->content.size();
    if (best->lstrip)
      while (seg_end > seg_begin && is_space(text[seg_end - 1])) --seg_end;
    if (best->rstrip)
      while (next < text.size() && is_space(text[next])) ++next;
    if (seg_end > seg_begin) encode_plain(text.substr(seg_begin, seg_end - seg_begin), out);
    out.push_back(best->id);
    seg_begin = pos = next;
  }
  if (seg_begin < text.size()) encode_plain(text.substr(seg_begin), out);
  return out;
}

std::vector<int32_t> Tokenizer::encode_prompt(std::string_view text) const {
  std::vector<int32_t> ids;
  if (special_.add_bos && special_.bos) ids.push_back(*special_.bos);
  auto body = encode(text);
  ids.insert(ids.end(), body.begin(), body.end());
  if (special_.add_eos && special_.eos) ids.push_back(*special_.eos);
  return ids;
}

std::string Tokenizer::decode(std::span<const int32_t> ids, bool skip_special) const {
  std::string out;
  size_t run = 0;  // start of the current run of ordinary tokens
  for (size_t k = 0; k <= ids.size(); ++k) {
    const AddedToken* a = k < ids.size() ? added_token(ids[k]) : nullptr;
    if (k < ids.size() && !a) {
      if (ids[k] < 0 || ids[k] >= vocab_size())
        fail("decode: token id {} is outside the vocabulary (0..{})", ids[k], vocab_size() - 1);
      continue;
    }
    if (k > run) out += decode_plain(ids.subspan(run, k - run));
    run = k + 1;
    if (a && !(skip_special && a->special)) out += a->content;
  }
  return out;
}

std::string clean_up_tokenization(std::string text) {
  static const std::pair<std::string_view, std::string_view> kSteps[] = {
      {" .", "."},     {" ?", "?"},   {" !", "!"},   {" ,", ","},     {" ' ", "'"},
      {" n't", "n't"}, {" 'm", "'m"}, {" 's", "'s"}, {" 've", "'ve"}, {" 're", "'re"}};
  for (const auto& [from, to] : kSteps) {
    std::string out;
    out.reserve(text.size());
    size_t at = 0;
    for (size_t hit; (hit = text.find(from, at)) != std::string::npos; at = hit + from.size()) {
      out.append(text, at, hit - at);
      out.append(to);
    }
    out.append(text, at);
    text = std::move(out);
  }
  return text;
}

}  // namespace kvb
