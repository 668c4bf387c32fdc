// kvbench detokenize: the text of token ids.
#include <fmt/format.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include <sstream>

#include "harness/cli/commands.hpp"
#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/chat_template.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

namespace {

using nlohmann::json;

std::vector<int32_t> parse_ids(const std::string& s) {
  // Accepts a JSON array or numbers separated by commas/spaces.
  std::string t = s;
  for (auto& ch : t)
    if (ch == '[' || ch == ']' || ch == ',') ch = ' ';
  std::istringstream in(t);
  std::vector<int32_t> ids;
  std::string word;
  while (in >> word) {
    size_t used = 0;
    long v = 0;
    try {
      v = std::stol(word, &used);
    } catch (const std::exception&) {
      used = 0;
    }
    if (used != word.size() || v < 0 || v > INT32_MAX) fail("--ids: '{}' is not a token id", word);
    ids.push_back(static_cast<int32_t>(v));
  }
  return ids;
}

}  // namespace

void register_detokenize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("detokenize", "Text of token ids");
  auto model = std::make_shared<std::string>();
  auto ids = std::make_shared<std::string>();
  auto skip = std::make_shared<bool>(false);
  cmd->add_option("model", *model, "GGUF file, model directory, tokenizer.json or tokenizer.model")->required();
  cmd->add_option("--ids,-i", *ids, "Ids as a JSON array or separated by commas/spaces")->required();
  cmd->add_flag("--skip-special", *skip, "Leave out special tokens");
  cmd->callback([=] {
    auto tok = load_tokenizer_file(*model);
    // A character cut at either end prints as U+FFFD, as Hugging Face decodes it.
    fmt::print("{}\n", utf8_lossy(tok->decode(parse_ids(*ids), *skip)));
  });
}

}  // namespace kvb::cli
