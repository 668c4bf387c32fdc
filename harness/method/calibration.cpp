#include "harness/method/calibration.hpp"

#include <fmt/format.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/json_file.hpp"
#include "harness/util/text_files.hpp"

namespace kvb {

std::vector<std::vector<int32_t>> token_sequences(const Tokenizer& tok, const std::vector<std::string>& docs, int len,
                                                  size_t tokens, const std::string& asked) {
  std::vector<std::vector<int32_t>> out;
  std::vector<int32_t> cur;
  const auto bos = tok.special().bos;
  size_t total = 0;
  for (const auto& d : docs) {
    for (int32_t t : tok.encode(d + "\n\n", false)) {
      if (cur.empty() && bos) cur.push_back(*bos);
      cur.push_back(t);
      if (static_cast<int>(cur.size()) == len) {
        total += cur.size();
        out.push_back(std::move(cur));
        cur.clear();
        if (total >= tokens) return out;
      }
    }
  }
  if (cur.size() > 1) {
    total += cur.size();
    out.push_back(std::move(cur));
  }
  if (total < tokens)
    fmt::print(stderr, "{} asks for {} tokens; the text gives {} ({} sequence(s) of up to {}), used as they are\n",
               asked, tokens, total, out.size(), len);
  return out;
}

std::vector<std::vector<int32_t>> read_id_sequences(const std::string& path, int vocab) {
  std::ifstream in(path, std::ios::binary);
  if (!in) fail("{}: cannot read the token id sequences", path);
  const nlohmann::json doc = with_json_errors(path, [&] { return nlohmann::json::parse(in); });
  const nlohmann::json& seqs = doc.is_object() && doc.contains("sequences") ? doc.at("sequences") : doc;
  if (!seqs.is_array() || seqs.empty())
    fail("{}: expected a non-empty array of token id sequences (or an object with one as \"sequences\")", path);
  std::vector<std::vector<int32_t>> out;
  for (size_t i = 0; i < seqs.size(); ++i) {
    const auto& s = seqs[i];
    if (!s.is_array() || s.size() < 2) fail("{}: sequence {} must be an array of at least 2 token ids", path, i);
    auto& ids = out.emplace_back();
    for (size_t j = 0; j < s.size(); ++j) {
      if (!s[j].is_number_integer() || s[j].get<long long>() < 0 || s[j].get<long long>() >= vocab)
        fail("{}: sequence {} position {}: {} is not a token id of this model (0 to {})", path, i, j, s[j].dump(),
             vocab - 1);
      ids.push_back(s[j].get<int32_t>());
    }
  }
  return out;
}

ParamSpec id_sequences_option() {
  return ParamSpec::text("ids", "",
                         "JSON file of token id sequences ([[id, ...], ...]) to fit on instead of --text, used as "
                         "given (seq_len and tokens do not apply), e.g. the windows of a paper's own code");
}

SplitDocuments split_held_out(const std::vector<std::string>& docs, long every, const std::string& command,
                              const std::string& hint) {
  if (std::all_of(docs.begin(), docs.end(),
                  [](const std::string& d) { return d.find_first_not_of(" \t\r\n") == std::string::npos; }))
    fail("{}: the calibration text is empty ({} document(s) without a word)", command, docs.size());
  SplitDocuments s;
  for (size_t i = 0; i < docs.size(); ++i)
    (static_cast<long>(i % size_t(every)) == every - 1 ? s.held : s.fit).push_back(docs[i]);
  if (s.fit.empty() || s.held.empty())
    fail("{}: {} document(s) cannot be split into fitting and held-out text (every {}th is held out); {}", command,
         docs.size(), every, hint);
  return s;
}

CalibrationText calibration_text(const std::string& text, const std::string& data_dir, const std::string& command,
                                 const std::string& paper_note) {
  CalibrationText c;
  std::vector<std::string> all;
  if (!text.empty()) {
    c.described = text;
    all = read_text_files(text, "text");
  } else {
    const auto dir = std::filesystem::path(data_dir) / "python-docs";
    if (!std::filesystem::is_directory(dir))
      fail("{}: no --text given and {} is missing (scripts/setup.sh fetches it)", command, dir.string());
    c.described = "the Python 3 documentation's tutorial, HOWTOs, FAQ and What's New pages (" + dir.string() +
                  ", PSF License); " + paper_note;
    all = read_text_files(dir.string(), "text");
  }
  c.split = split_held_out(all, 10, command, "give more files");
  return c;
}

std::vector<ParamSpec> calibration_text_options() {
  return {ParamSpec::text("text", "", "text files or directories (default: set-up's data/python-docs)"),
          ParamSpec::integer("seq_len", 512, 16, 1 << 20, "tokens per sequence (BOS + text)")};
}

FitSequences fit_sequences(const CalibrationContext& ctx, const std::string& command, const std::string& paper_note) {
  const ModelConfig& cfg = ctx.model.config();
  const Params& o = ctx.options;
  FitSequences f;
  const std::string ids = o.get("ids");
  if (!ids.empty()) {
    if (!o.get("text").empty()) fail("{}: give --text or -o ids=FILE, not both", command);
    f.seqs = read_id_sequences(ids, cfg.vocab_size);
    for (size_t i = 0; i < f.seqs.size(); ++i)
      if (f.seqs[i].size() > size_t(cfg.context_length))
        fail("{}: sequence {} holds {} ids, more than the model's context length {}", ids, i, f.seqs[i].size(),
             cfg.context_length);
    f.described = ids + " (token ids, used as given)";
  } else {
    const CalibrationText docs = calibration_text(o.get("text"), ctx.data_dir, command, paper_note);
    f.seqs = token_sequences(ctx.tokenizer, docs.split.fit, o.integer("seq_len"),
                             static_cast<size_t>(o.get_int("tokens")), command + ": tokens");
    f.described = docs.described;
  }
  for (const auto& s : f.seqs) f.seq_len = std::max(f.seq_len, static_cast<long>(s.size()));
  return f;
}

ParamSpec group_size_option() {
  return ParamSpec::integer("group_size", 0, 0, 4096,
                            "KV heads per group, each group fitted apart (Palu's G-LRD); 0: all the layer's KV "
                            "heads jointly (J-LRD)");
}

int heads_per_group(const Params& options, int n_kv_heads, const std::string& command) {
  const int g = options.integer("group_size") == 0 ? n_kv_heads : options.integer("group_size");
  if (n_kv_heads % g != 0) fail("{}: group_size {} does not divide the model's {} KV heads", command, g, n_kv_heads);
  return g;
}

}  // namespace kvb
