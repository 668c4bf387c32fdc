// Perplexity over a text file as the KV-compression papers measure it (GPTQ's evaluation loop, which
// Palu, KVQuant and DynaKV follow): the text tokenized once, cut into consecutive windows of `seq_len`
// tokens, each window scored by its mean next-token negative log-likelihood, the perplexity exp of the
// mean over windows. The compression acts as the method does: a transform inside prefill (DynaKV,
// Palu) with the whole window prefilled, or over a compressed prefix (`compress_at`): the window's
// first tokens prefilled and compressed, the rest predicted one at a time over the kept cache.
#include <fmt/format.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"
#include "harness/util/json_file.hpp"

namespace kvb {
namespace {

// The text of a file: a .jsonl file's "text" fields joined by blank lines (the datasets library's
// rows, as GPTQ joins WikiText-2's), any other file as it is.
std::string read_text(const std::string& path) {
  std::ifstream in(path);
  if (!in)
    fail("{}: cannot read (task perplexity's text file: option 'file', or <data>/perplexity/<dataset>.txt)", path);
  if (std::filesystem::path(path).extension() != ".jsonl") {
    std::stringstream ss;
    ss << in.rdbuf();
    return ss.str();
  }
  std::string text;
  bool first = true;
  for_each_json_line(in, path, [&](const nlohmann::json& j, int no) {
    if (!j.is_object() || !j.contains("text") || !j["text"].is_string())
      fail("{}:{}: field 'text' is missing or not a string (a .jsonl text file holds one {{\"text\": ...}} per line)",
           path, no);
    if (!first) text += "\n\n";
    text += j["text"].get<std::string>();
    first = false;
    return true;
  });
  return text;
}

class Perplexity final : public Task {
 public:
  Perplexity(const TaskContext& ctx, const Params& p)
      : dataset_(p.get("dataset")), seq_len_(p.integer("seq_len")), compress_at_(p.integer("compress_at")) {
    if (compress_at_ >= seq_len_)
      fail("task perplexity: compress_at {} must be below seq_len {} (0: the whole window in one prefill)",
           compress_at_, seq_len_);
    if (dataset_ == "text" && p.get("file").empty())
      fail("task perplexity: dataset text is the file given; add file=PATH");
    path_ = p.get("file").empty() ? fmt::format("{}/perplexity/{}.txt", ctx.data_dir, dataset_) : p.get("file");
    const std::string text = read_text(path_);
    ids_ = p.get("bos") == "tokenizer" ? ctx.tokenizer->encode_prompt(text) : ctx.tokenizer->encode(text);
    size_t n = ids_.size() / size_t(seq_len_);
    if (n == 0)
      fail("{}: {} tokens, fewer than one window of seq_len {} (task perplexity)", path_, ids_.size(), seq_len_);
    if (const long cap = p.get_int("windows"); cap > 0) n = std::min(n, size_t(cap));
    windows_ = n;
  }

  size_t size() const override { return windows_; }

  Sample sample(size_t index) const override {
    if (index >= windows_) fail("{}: window {} of {}", path_, index, windows_);
    ScoredText st;
    st.ids.assign(ids_.begin() + std::ptrdiff_t(index * size_t(seq_len_)),
                  ids_.begin() + std::ptrdiff_t((index + 1) * size_t(seq_len_)));
    st.compress_at = compress_at_;
    Sample s;
    // The window's place and its tokens: a changed file or tokenizer makes new samples.
    s.id = fmt::format("w{}-{:08x}", index,
                       uint32_t(fnv1a(std::string_view(reinterpret_cast<const char*>(st.ids.data()),
                                                       st.ids.size() * sizeof(int32_t)))));
    s.meta = {{"dataset", dataset_}, {"window", index}, {"length", seq_len_}};
    s.scored_text = std::move(st);
    return s;
  }

  double score(const Sample&, const std::string&) const override {
    fail("task perplexity scores a window's own tokens, not a generated text");
  }

 private:
  std::string dataset_, path_;
  int seq_len_, compress_at_;
  std::vector<int32_t> ids_;
  size_t windows_ = 0;
};

const bool registered = register_task(
    {.name = "perplexity",
     .summary = "perplexity of a text file in windows of seq_len tokens, the compression in the prefill or over "
                "a compressed prefix (--data DIR/perplexity/<dataset>.txt)",
     .options = {ParamSpec::choice("dataset", "wikitext2", {"wikitext2", "c4", "pg19", "text"},
                                   "which text (names the file and the table column; text: the file given)"),
                 ParamSpec::text("file", "",
                                 "the text: a .txt file, or a .jsonl of {\"text\": ...} lines joined by "
                                 "blank lines (default <data>/perplexity/<dataset>.txt)"),
                 ParamSpec::integer("seq_len", 2048, 2, 1 << 20, "tokens per window (GPTQ, Palu: 2048)"),
                 ParamSpec::integer("windows", 0, 0, 1 << 30, "at most this many windows from the start (0: all)"),
                 ParamSpec::integer("compress_at", 0, 0, 1 << 20,
                                    "0: each window in one prefill (a method acts only by changing the model); "
                                    "k: the first k tokens prefilled and compressed, the rest predicted over the "
                                    "kept cache"),
                 ParamSpec::choice("bos", "tokenizer", {"tokenizer", "none"},
                                   "BOS once before the text where the tokenizer adds one (GPTQ's encoding of the "
                                   "joined text), or none")},
     .make = [](const TaskContext& ctx, const Params& p) { return std::make_unique<Perplexity>(ctx, p); },
     .layout = {.title = "Perplexity",
                .column_option = "dataset",
                .default_column = "wikitext2",
                .columns = {{"wikitext2", "WikiText-2"}, {"c4", "C4"}, {"pg19", "PG-19"}, {"text", "Text"}},
                .note = "Perplexity (lower is better): exp of the mean over windows of each window's mean "
                        "next-token negative log-likelihood; Avg. = exp of the mean over the {shown} texts "
                        "shown{left_out}",
                .pooled_options = {"dataset"},
                .perplexity = true}});

}  // namespace
}  // namespace kvb
