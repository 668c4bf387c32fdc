// kvbench tokenize: the token ids of a text (optionally chat-templated), as JSON.
#include <fmt/format.h>
#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include <sstream>

#include "harness/cli/commands.hpp"
#include "harness/engine/generate.hpp"
#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/chat_template.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

namespace {

using nlohmann::json;

std::string read_text(const std::string& text, const std::string& file) {
  if (file.empty()) return text;
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("{}: cannot open", file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

}  // namespace

void register_tokenize_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("tokenize", "Token ids of a text, as JSON");
  auto model = std::make_shared<std::string>();
  auto text = std::make_shared<std::string>();
  auto file = std::make_shared<std::string>();
  auto no_special = std::make_shared<bool>(false);
  auto prompt = std::make_shared<bool>(false);
  auto chat = std::make_shared<bool>(false);
  auto pieces = std::make_shared<bool>(false);
  cmd->add_option("model", *model, "GGUF file, model directory, tokenizer.json or tokenizer.model")->required();
  auto* t = cmd->add_option("--text,-t", *text, "Text to tokenize");
  cmd->add_option("--file,-f", *file, "Read the text from a file")->excludes(t);
  auto* plain = cmd->add_flag("--no-special", *no_special, "Treat special-token markers as plain text");
  // A prompt and a chat turn read markers as the model's special tokens, as a run does.
  cmd->add_flag("--prompt", *prompt, "Add BOS/EOS as the model does for a prompt")->excludes(plain);
  cmd->add_flag("--chat", *chat, "Wrap the text as a user message in the model's chat template")->excludes(plain);
  cmd->add_flag("--pieces", *pieces, "Print the vocabulary entry of each id too");
  cmd->callback([=] {
    // An empty --text is a text like any other (it tokenizes to []), so ask whether it was given.
    if (t->count() == 0 && file->empty()) fail("tokenize: give --text or --file");
    std::string input = read_text(*text, *file);
    std::unique_ptr<Tokenizer> tok;
    std::unique_ptr<ModelFile> m;
    namespace fs = std::filesystem;
    const bool model_like = fs::path(*model).extension() == ".gguf" || fs::exists(fs::path(*model) / "config.json");
    if (model_like) {
      m = ModelFile::open(*model);
      tok = load_tokenizer(*m);
    } else {
      tok = load_tokenizer_file(*model);
    }
    std::vector<int32_t> ids;
    if (*chat) {
      if (!m) fail("tokenize --chat needs a model file or directory (for its chat template)");
      ids = build_prompt(*m, *tok, input, true);
    } else {
      ids = *prompt ? tok->encode_prompt(input) : tok->encode(input, !*no_special);
    }
    if (!*pieces) {
      fmt::print("{}\n", json(ids).dump());
      return;
    }
    json out = json::array();
    for (auto id : ids) out.push_back({{"id", id}, {"piece", tok->token_text(id)}});
    fmt::print("{}\n", out.dump(1));
  });
}

}  // namespace kvb::cli
