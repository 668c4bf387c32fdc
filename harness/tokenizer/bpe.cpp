#include "harness/tokenizer/bpe.hpp"

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <limits>
#include <nlohmann/json.hpp>

#include "harness/model/gguf.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {
namespace {

using nlohmann::json;

// GPT-2's pre-tokenizer pattern, as Hugging Face's ByteLevel(use_regex=true) applies it.
constexpr const char* kGpt2Regex = R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
constexpr const char* kLlama3Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
// Hugging Face's Punctuation pre-tokenizer: Unicode punctuation (P*) or ASCII punctuation, which adds
// $+<=>^`|~ (Unicode symbols).
constexpr const char* kPunctuation = R"([\p{P}\x21-\x2F\x3A-\x40\x5B-\x60\x7B-\x7E])";
constexpr const char* kQwen2Regex =
    R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";

uint64_t pair_key(int32_t a, int32_t b) {
  return static_cast<uint64_t>(static_cast<uint32_t>(a)) << 32 | static_cast<uint32_t>(b);
}

std::string escape_regex(const std::string& s) {
  std::string out;
  for (char c : s) {
    if (std::string_view("\\^$.|?*+()[]{}").find(c) != std::string_view::npos) out += '\\';
    out += c;
  }
  return out;
}

}  // namespace

std::vector<PreSplit> pre_tokenizer_preset(const std::string& name, bool* nfc, bool* ignore_merges) {
  if (nfc) *nfc = false;
  if (ignore_merges) *ignore_merges = false;
  if (name == "gpt2" || name == "gpt-2" || name == "default") return {{kGpt2Regex}};
  // SmolLM (StarCoder vocabulary) isolates every digit before the GPT-2 split.
  if (name == "smollm" || name == "starcoder") return {{R"(\p{N})"}, {kGpt2Regex}};
  if (name == "llama3" || name == "llama-bpe") {
    if (ignore_merges) *ignore_merges = true;
    return {{kLlama3Regex}};
  }
  if (name == "qwen2") {
    if (nfc) *nfc = true;
    return {{kQwen2Regex}};
  }
  // Falcon's tokenizer.json: Punctuation (contiguous), ByteLevel, Digits, then digit triples isolated;
  // the last two on the byte-level text. (llama.cpp's own falcon preset leaves out the Digits stage.)
  if (name == "falcon") {
    PreSplit digits{R"(\p{N}+)"}, triples{"[0-9][0-9][0-9]"};
    digits.on_mapped = triples.on_mapped = true;
    return {{std::string(kPunctuation) + "+"}, {kGpt2Regex}, digits, triples};
  }
  fail("unknown pre-tokenizer '{}' (supported: gpt2, smollm, starcoder, llama3/llama-bpe, qwen2, falcon)", name);
}

BpeSpec bpe_spec_from_gguf(const GGUFFile& f) {
  BpeSpec s;
  s.name = f.get_string_opt("tokenizer.ggml.pre").value_or("default");
  try {
    s.splits = pre_tokenizer_preset(s.name, &s.nfc, &s.ignore_merges);
  } catch (const Error& e) {
    fail("{}: tokenizer.ggml.pre: {}", f.path(), e.what());
  }
  s.vocab = f.get_string_array("tokenizer.ggml.tokens");
  const size_t n = s.vocab.size();
  std::vector<int64_t> types;
  if (f.has("tokenizer.ggml.token_type")) {
    types = f.get_int_array("tokenizer.ggml.token_type");
    if (types.size() != n)
      fail("{}: tokenizer.ggml.token_type has {} entries, expected one per token ({})", f.path(), types.size(), n);
  }
  for (const auto& m : f.get_string_array("tokenizer.ggml.merges")) {
    const size_t sp = m.find(' ', 1);
    if (sp == std::string::npos || sp + 1 >= m.size())
      fail("{}: tokenizer.ggml.merges entry '{}' is not 'left right'", f.path(), m);
    s.merges.emplace_back(m.substr(0, sp), m.substr(sp + 1));
  }
  // Control (3) and user-defined (4) tokens are matched literally in the text, as llama.cpp and the
  // Hugging Face tokenizer.json of these models do.
  for (size_t id = 0; id < types.size(); ++id)
    if (types[id] == 3 || types[id] == 4)
      s.added.push_back({static_cast<int32_t>(id), s.vocab[id], types[id] == 3, false, false});
  s.special = special_tokens_from_gguf(f, n, false);
  add_turn_ends(s.special, s.added);
  return s;
}

namespace {

// The Hugging Face tokenizers' regex engines read \s as Unicode's White_Space property; PCRE2's \s also
// takes U+180E (Mongolian vowel separator, its \h), which then split words the reference keeps whole.
std::string white_space_classes(std::string_view pattern) {
  std::string out;
  for (size_t i = 0; i < pattern.size(); ++i) {
    if (pattern[i] == '\\' && i + 1 < pattern.size()) {
      const char c = pattern[++i];
      out += c == 's' ? "\\p{White_Space}" : c == 'S' ? "\\P{White_Space}" : std::string{'\\', c};
    } else {
      out += pattern[i];
    }
  }
  return out;
}

void parse_pre_tokenizer(const json& j, BpeSpec& s, const std::string& file) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  const size_t before = s.splits.size();
  const bool after_byte_level = s.byte_level;
  if (type == "Sequence") {
    for (const auto& p : j.at("pretokenizers")) parse_pre_tokenizer(p, s, file);
    return;
  }
  if (type == "ByteLevel") {
    s.byte_level = true;
    PreSplit p;
    if (j.value("use_regex", true)) p.pattern = kGpt2Regex;
    p.prefix_space = j.value("add_prefix_space", true);
    if (!p.pattern.empty() || p.prefix_space) s.splits.push_back(std::move(p));
  } else if (type == "Digits") {
    s.splits.push_back({j.value("individual_digits", false) ? R"(\p{N})" : R"(\p{N}+)"});
  } else if (type == "Punctuation") {
    const std::string b = j.value("behavior", "Isolated");
    PreSplit p{kPunctuation};
    if (b == "Contiguous")
      p.pattern += "+";
    else if (b == "Removed")
      p.behavior = PreSplit::Behavior::Removed;
    else if (b != "Isolated")
      fail("{}: pre_tokenizer Punctuation behavior '{}' is not supported (expected Isolated, Contiguous or Removed)",
           file, b);
    s.splits.push_back(std::move(p));
  } else if (type == "Split") {
    PreSplit p;
    const json& pat = j.at("pattern");
    if (pat.contains("Regex"))
      p.pattern = pat["Regex"].get<std::string>();
    else if (pat.contains("String"))
      p.pattern = escape_regex(pat["String"].get<std::string>());
    else
      fail("{}: pre_tokenizer Split: pattern must have 'Regex' or 'String'", file);
    const std::string b = j.value("behavior", "Isolated");
    if (b == "Isolated")
      p.behavior = PreSplit::Behavior::Isolated;
    else if (b == "Removed")
      p.behavior = PreSplit::Behavior::Removed;
    else
      fail("{}: pre_tokenizer Split behavior '{}' is not supported (expected Isolated or Removed)", file, b);
    p.invert = j.value("invert", false);
    s.splits.push_back(std::move(p));
  } else {
    fail(
        "{}: pre_tokenizer type '{}' is not supported (expected ByteLevel, Split, Digits, Punctuation or "
        "Sequence); for SentencePiece models use tokenizer.model",
        file, type);
  }
  if (after_byte_level)
    for (size_t k = before; k < s.splits.size(); ++k) s.splits[k].on_mapped = true;
}

void parse_normalizer(const json& j, BpeSpec& s, const std::string& file) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "NFC") {
    s.nfc = true;
  } else if (type == "Sequence") {
    for (const auto& n : j.at("normalizers")) parse_normalizer(n, s, file);
  } else {
    fail(
        "{}: normalizer '{}' is not supported (expected none or NFC); for SentencePiece models use "
        "tokenizer.model",
        file, type);
  }
}

// Finds the TemplateProcessing post-processor and reads which special tokens wrap a single sequence.
void parse_post_processor(const json& j, BpeSpec& s, const std::unordered_map<std::string, int32_t>& ids) {
  if (j.is_null()) return;
  const std::string type = j.value("type", "");
  if (type == "Sequence") {
    for (const auto& p : j.at("processors")) parse_post_processor(p, s, ids);
    return;
  }
  if (type != "TemplateProcessing" || !j.contains("single")) return;
  const json& single = j["single"];
  if (!single.is_array() || single.empty()) return;
  auto special_id = [&](const json& piece) -> std::optional<int32_t> {
    if (!piece.contains("SpecialToken")) return std::nullopt;
    auto it = ids.find(piece["SpecialToken"].value("id", ""));
    return it == ids.end() ? std::nullopt : std::optional<int32_t>(it->second);
  };
  if (auto b = special_id(single.front())) {
    s.special.add_bos = true;
    s.special.bos = *b;
  }
  if (single.size() > 1)
    if (auto e = special_id(single.back())) {
      s.special.add_eos = true;
      s.special.eos = *e;
    }
}

json read_json(const std::string& path) {
  std::ifstream in(path);
  if (!in) fail("{}: cannot open", path);
  try {
    return json::parse(in);
  } catch (const json::exception& e) {
    fail("{}: not valid JSON: {}", path, e.what());
  }
}

std::optional<std::string> token_content(const json& j) {
  if (j.is_string()) return j.get<std::string>();
  if (j.is_object() && j.contains("content") && j["content"].is_string()) return j["content"].get<std::string>();
  return std::nullopt;
}

// Ids index the vocabulary table: a negative or huge one would write outside it or allocate gigabytes.
int32_t json_token_id(const json& id, const std::string& path, const std::string& field) {
  if (!id.is_number_integer() || id.get<int64_t>() < 0 || id.get<int64_t>() > (1 << 24))
    fail("{}: {} must be a token id (0 to {}), found {}", path, field, 1 << 24, id.dump());
  return id.get<int32_t>();
}

std::vector<AddedToken> added_tokens_of(const json& j, const std::string& path) {
  std::vector<AddedToken> out;
  if (!j.contains("added_tokens")) return out;
  if (!j["added_tokens"].is_array()) fail("{}: added_tokens must be an array", path);
  for (size_t i = 0; i < j["added_tokens"].size(); ++i) {
    const json& a = j["added_tokens"][i];
    if (!a.is_object() || !a.contains("id") || !a.contains("content") || !a["content"].is_string())
      fail("{}: added_tokens[{}] must be an object with an id and a content string", path, i);
    AddedToken t;
    t.id = json_token_id(a["id"], path, fmt::format("added_tokens[{}].id", i));
    t.content = a["content"].get<std::string>();
    t.special = a.value("special", false);
    t.lstrip = a.value("lstrip", false);
    t.rstrip = a.value("rstrip", false);
    out.push_back(t);
  }
  return out;
}

BpeSpec parse_tokenizer_json(const std::string& path) {
  namespace fs = std::filesystem;
  const json j = read_json(path);
  BpeSpec s;
  s.byte_level = false;
  const json& model = j.at("model");
  if (model.value("type", "BPE") != "BPE")
    fail("{}: model type '{}' is not supported (expected BPE)", path, model.value("type", ""));
  const json& vocab = model.at("vocab");
  std::unordered_map<std::string, int32_t> ids;
  int32_t max_id = -1;
  for (const auto& [tok, id] : vocab.items()) {
    ids[tok] = json_token_id(id, path, fmt::format("model.vocab['{}']", tok));
    max_id = std::max(max_id, ids[tok]);
  }
  s.added = added_tokens_of(j, path);
  for (const AddedToken& t : s.added) {
    ids[t.content] = t.id;
    max_id = std::max(max_id, t.id);
  }
  s.vocab.assign(static_cast<size_t>(max_id + 1), std::string());
  for (const auto& [tok, id] : ids) s.vocab[id] = tok;
  for (const auto& m : model.at("merges")) {
    if (m.is_string()) {
      const auto str = m.get<std::string>();
      const size_t sp = str.find(' ', 1);
      if (sp == std::string::npos) fail("{}: merge '{}' is not 'left right'", path, str);
      s.merges.emplace_back(str.substr(0, sp), str.substr(sp + 1));
    } else if (m.is_array() && m.size() == 2) {
      s.merges.emplace_back(m[0].get<std::string>(), m[1].get<std::string>());
    } else {
      fail("{}: merge {} must be 'left right' or [left, right]", path, m.dump());
    }
  }
  s.ignore_merges = model.value("ignore_merges", false);
  s.byte_fallback = model.value("byte_fallback", false);
  if (model.contains("unk_token") && model["unk_token"].is_string()) {
    auto it = ids.find(model["unk_token"].get<std::string>());
    if (it != ids.end()) s.special.unk = s.model_unk = it->second;
  }
  parse_normalizer(j.value("normalizer", json()), s, path);
  parse_pre_tokenizer(j.value("pre_tokenizer", json()), s, path);
  if (j.contains("decoder") && j["decoder"].is_object() && j["decoder"].value("type", "") == "ByteLevel")
    s.byte_level = true;
  parse_post_processor(j.value("post_processor", json()), s, ids);
  s.name = fs::path(path).filename().string();

  // BOS/EOS names live in tokenizer_config.json beside tokenizer.json when there is one.
  const fs::path cfg = fs::path(path).parent_path() / "tokenizer_config.json";
  if (fs::exists(cfg)) {
    const json c = read_json(cfg.string());
    auto lookup = [&](const char* key) -> std::optional<int32_t> {
      if (!c.contains(key)) return std::nullopt;
      auto name = token_content(c[key]);
      if (!name) return std::nullopt;
      auto it = ids.find(*name);
      return it == ids.end() ? std::nullopt : std::optional<int32_t>(it->second);
    };
    if (auto b = lookup("bos_token")) s.special.bos = *b;
    if (auto e = lookup("eos_token")) s.special.eos = *e;
    if (auto p = lookup("pad_token")) s.special.pad = *p;
    if (c.contains("add_bos_token") && c["add_bos_token"].is_boolean())
      s.special.add_bos = c["add_bos_token"].get<bool>();
  }
  add_turn_ends(s.special, s.added);
  return s;
}

}  // namespace

std::vector<AddedToken> tokenizer_json_added_tokens(const std::string& path) {
  return with_json_errors(path, [&] { return added_tokens_of(read_json(path), path); });
}

BpeSpec bpe_spec_from_tokenizer_json(const std::string& path) {
  return with_json_errors(path, [&] { return parse_tokenizer_json(path); });
}

BpeTokenizer::BpeTokenizer(BpeSpec spec)
    : name_(std::move(spec.name)),
      vocab_(std::move(spec.vocab)),
      splits_(std::move(spec.splits)),
      nfc_(spec.nfc),
      byte_level_(spec.byte_level),
      ignore_merges_(spec.ignore_merges),
      byte_fallback_(spec.byte_fallback),
      model_unk_(spec.model_unk) {
  special_ = spec.special;
  ids_.reserve(vocab_.size());
  for (size_t id = 0; id < vocab_.size(); ++id)
    if (!vocab_[id].empty()) ids_.emplace(vocab_[id], static_cast<int32_t>(id));
  merges_.reserve(spec.merges.size());
  for (size_t r = 0; r < spec.merges.size(); ++r) {
    const auto& [a, b] = spec.merges[r];
    auto ia = ids_.find(a), ib = ids_.find(b), im = ids_.find(a + b);
    if (ia == ids_.end() || ib == ids_.end() || im == ids_.end())
      fail("tokenizer {}: merge {} '{} {}' refers to a token missing from the vocabulary", name_, r, a, b);
    // A pair listed twice takes its last rank: the reference builds its merge map the same way.
    merges_.insert_or_assign(pair_key(ia->second, ib->second), std::make_pair(static_cast<int32_t>(r), im->second));
  }
  for (const auto& p : splits_)
    regexes_.push_back(p.pattern.empty() ? nullptr : std::make_unique<Regex>(white_space_classes(p.pattern)));
  byte_token_.fill(-1);
  if (byte_fallback_)
    for (int b = 0; b < 256; ++b) {
      auto it = ids_.find(fmt::format("<0x{:02X}>", b));
      if (it != ids_.end()) byte_token_[b] = it->second;
    }
  set_added_tokens(std::move(spec.added));
}

BpeTokenizer::~BpeTokenizer() = default;

std::string BpeTokenizer::token_text(int32_t id) const {
  if (id < 0 || id >= vocab_size()) fail("token id {} is outside the vocabulary", id);
  return vocab_[id];
}

std::vector<std::string> BpeTokenizer::pre_tokenize(std::string_view text) const {
  std::vector<std::string> pieces{std::string(text)};
  for (size_t k = 0; k < splits_.size(); ++k) {
    const PreSplit& sp = splits_[k];
    std::vector<std::string> next;
    for (auto& piece : pieces) {
      if (sp.prefix_space && (piece.empty() || piece[0] != ' ')) piece.insert(piece.begin(), ' ');
      if (!regexes_[k]) {
        next.push_back(std::move(piece));
        continue;
      }
      // On byte-level text the matches are found in the stand-ins; raw_at maps their offsets back.
      std::string mapped;
      std::vector<size_t> raw_at;
      if (sp.on_mapped) {
        const auto& bl = ByteLevelMap::get();
        raw_at.assign(piece.size() * 2 + 1, 0);
        for (size_t i = 0; i < piece.size(); ++i) {
          raw_at[mapped.size()] = i;
          mapped += bl.byte_to_utf8[static_cast<unsigned char>(piece[i])];
        }
        raw_at[mapped.size()] = piece.size();
      }
      size_t prev = 0;
      auto keep = [&](size_t b, size_t e, bool is_match) {
        if (e <= b) return;
        const bool delimiter = is_match != sp.invert;
        if (delimiter && sp.behavior == PreSplit::Behavior::Removed) return;
        next.push_back(piece.substr(b, e - b));
      };
      for (auto [b, e] : regexes_[k]->find_all(sp.on_mapped ? mapped : piece)) {
        if (sp.on_mapped) {
          b = raw_at[b];
          e = raw_at[e];
        }
        keep(prev, b, false);
        keep(b, e, true);
        prev = e;
      }
      keep(prev, piece.size(), false);
    }
    pieces = std::move(next);
  }
  return pieces;
}

void BpeTokenizer::encode_plain(std::string_view text, std::vector<int32_t>& out) const {
  const std::string normalized = nfc_ ? nfc(text) : std::string(text);
  const auto& bl = ByteLevelMap::get();
  for (const auto& piece : pre_tokenize(normalized)) {
    if (!byte_level_) {
      bpe_word(piece, out);
      continue;
    }
    std::string mapped;
    mapped.reserve(piece.size() * 2);
    for (unsigned char c : piece) mapped += bl.byte_to_utf8[c];
    bpe_word(mapped, out);
  }
}

void BpeTokenizer::bpe_word(const std::string& word, std::vector<int32_t>& out) const {
  if (word.empty()) return;
  if (ignore_merges_) {
    auto it = ids_.find(word);
    if (it != ids_.end()) {
      out.push_back(it->second);
      return;
    }
  }
  // Start from one symbol per character; characters missing from the vocabulary fall back to byte
  // tokens or the model's unknown token, and otherwise are dropped, as the reference BPE model does
  // (SmolLM2's vocabulary lacks 21 of the 256 byte stand-ins).
  std::vector<int32_t> sym;
  for (size_t i = 0; i < word.size();) {
    const size_t n = std::min(utf8_len(static_cast<unsigned char>(word[i])), word.size() - i);
    auto it = ids_.find(word.substr(i, n));
    if (it != ids_.end()) {
      sym.push_back(it->second);
    } else if (byte_fallback_) {
      for (size_t k = 0; k < n; ++k) {
        const int32_t bt = byte_token_[static_cast<unsigned char>(word[i + k])];
        if (bt >= 0)
          sym.push_back(bt);
        else if (model_unk_)
          sym.push_back(*model_unk_);
      }
    } else if (model_unk_) {
      sym.push_back(*model_unk_);
    }
    i += n;
  }
  // Repeatedly merge the pair of lowest rank, the leftmost one among equal ranks.
  while (sym.size() > 1) {
    int32_t best_rank = std::numeric_limits<int32_t>::max(), best_id = -1;
    size_t best_pos = 0;
    for (size_t k = 0; k + 1 < sym.size(); ++k) {
      auto it = merges_.find(pair_key(sym[k], sym[k + 1]));
      if (it != merges_.end() && it->second.first < best_rank) {
        best_rank = it->second.first;
        best_id = it->second.second;
        best_pos = k;
      }
    }
    if (best_id < 0) break;
    sym[best_pos] = best_id;
    sym.erase(sym.begin() + static_cast<std::ptrdiff_t>(best_pos) + 1);
  }
  out.insert(out.end(), sym.begin(), sym.end());
}

std::string BpeTokenizer::decode_plain(std::span<const int32_t> ids) const {
  std::string out;
  const auto& bl = ByteLevelMap::get();
  for (int32_t id : ids) {
    const std::string& t = vocab_[id];
    if (byte_fallback_ && t.size() == 6 && t.rfind("<0x", 0) == 0 && t[5] == '>') {
      out += static_cast<char>(std::stoi(t.substr(3, 2), nullptr, 16));
      continue;
    }
    if (!byte_level_) {
      out += t;
      continue;
    }
    // Each character stands for one byte; characters outside the map are kept as UTF-8.
    for (size_t i = 0; i < t.size();) {
      const size_t n = std::min(utf8_len(static_cast<unsigned char>(t[i])), t.size() - i);
      uint32_t cp = static_cast<unsigned char>(t[i]);
      if (n == 2) cp = (cp & 0x1Fu) << 6 | (static_cast<unsigned char>(t[i + 1]) & 0x3Fu);
      if (n <= 2 && cp < bl.cp_to_byte.size() && bl.cp_to_byte[cp] >= 0)
        out += static_cast<char>(bl.cp_to_byte[cp]);
      else
        out.append(t, i, n);
      i += n;
    }
  }
  return out;
}

}  // namespace kvb
