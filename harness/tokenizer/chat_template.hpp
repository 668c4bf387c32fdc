#pragma once
// Chat formats of the supported model families, rendered natively. A model's Jinja template is not
// interpreted; it is recognised (ChatML, Qwen3's ChatML with thinking, Llama 3, Llama 2, Mistral) and
// its fixed parts, such as a default system message, are read from it. Output is checked against transformers'
// apply_chat_template in the tests.
#include <optional>
#include <string>
#include <vector>

namespace kvb {

class ModelFile;

struct ChatMessage {
  std::string role;  // system, user, assistant
  std::string content;
};

class ChatTemplate {
 public:
  enum class Format { ChatML, Llama3, Llama2, Mistral };

  // Recognises the format of a Jinja chat template; nullopt if it is none of the supported ones.
  static std::optional<ChatTemplate> from_jinja(const std::string& jinja);
  // The template stored with a model (GGUF tokenizer.chat_template; in a model directory
  // chat_template.jinja, else tokenizer_config.json's chat_template, as transformers loads them);
  // Error naming the file if there is none or it is not recognised.
  static ChatTemplate for_model(const ModelFile& model);
  // The same, or nullopt for a model that stores none (an unrecognised one is still an Error).
  static std::optional<ChatTemplate> stored(const ModelFile& model);

  std::string render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const;
  Format format() const { return format_; }
  std::string name() const;
  // Whether render() writes the BOS token itself (then the prompt must not get another one).
  bool renders_bos() const { return format_ != Format::ChatML; }
  const std::string& default_system() const { return default_system_; }

 private:
  Format format_ = Format::ChatML;
  std::string default_system_;  // inserted when the conversation has no system message
  bool thinking_off_ = false;   // a template with enable_thinking (Qwen3): an empty think block opens the answer
};

}  // namespace kvb
