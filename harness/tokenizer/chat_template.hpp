#pragma once
// Chat formats of the supported model families, rendered natively. A model's Jinja template is not
// interpreted; it is recognised (ChatML, Qwen3's ChatML with thinking, Llama 3 and 3.1-3.3, Llama 2,
// Mistral v1 and v0.3) and its fixed parts, such as a default system message or Llama 3.1's dates, are
// read from it. Output is checked against transformers'
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
  const std::string& default_system() const { return default_system_; }
  // A ChatML template that opens with the tokenizer's {{ bos_token }} (Hermes-2-Pro-Llama-3): render()
  // leaves it to the caller, which knows its id.
  bool prepends_bos() const { return chatml_bos_; }

 private:
  Format format_ = Format::ChatML;
  std::string default_system_;  // inserted when the conversation has no system message
  // Llama 3.1-3.3: the system turn every conversation opens with. The date is the template's literal
  // default; transformers renders today's date instead for Llama 3.2's template, which asks for it.
  std::string knowledge_date_, today_date_;
  bool mistral_v3_ = false;  // "[INST] content[/INST]", the system message on the last user turn
  bool chatml_bos_ = false;
  bool thinking_off_ = false;  // a template with enable_thinking (Qwen3): an empty think block opens the answer
};

}  // namespace kvb
