#include "harness/tokenizer/chat_template.hpp"

#include <cstring>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

std::string trim(const std::string& s) {
  const char* ws = " \t\n\r";
  const size_t b = s.find_first_not_of(ws);
  if (b == std::string::npos) return "";
  return s.substr(b, s.find_last_not_of(ws) - b + 1);
}

// A ChatML template that injects a system turn writes it as a literal; the text between the
// system header and <|im_end|> is the default system message (SmolLM2, Qwen2).
std::string chatml_default_system(const std::string& jinja) {
  // Every system header is looked at: Qwen2.5's first opens its tool-use branch, whose text is an
  // expression; the literal default comes later.
  for (const char* head : {"<|im_start|>system\n", "<|im_start|>system\\n"}) {
    for (size_t b = jinja.find(head); b != std::string::npos; b = jinja.find(head, b + 1)) {
      const size_t start = b + std::strlen(head);
      const size_t e = jinja.find("<|im_end|>", start);
      if (e == std::string::npos) break;
      const std::string s = jinja.substr(start, e - start);
      // Only a literal counts; a template expression (message['content']) is not a default.
      if (s.find("{{") == std::string::npos && s.find('\'') == std::string::npos) return s;
    }
  }
  return "";
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::from_jinja(const std::string& jinja) {
  ChatTemplate t;
  if (contains(jinja, "<|im_start|>")) {
    t.format_ = Format::ChatML;
    t.default_system_ = chatml_default_system(jinja);
    // Qwen3's template thinks unless told not to; rendered with enable_thinking=False, as kvpress runs
    // it, the answer follows an empty think block.
    t.thinking_off_ = contains(jinja, "enable_thinking");
  } else if (contains(jinja, "<|start_header_id|>")) {
    t.format_ = Format::Llama3;
  } else if (contains(jinja, "<<SYS>>")) {
    t.format_ = Format::Llama2;
  } else if (contains(jinja, "[INST]")) {
    t.format_ = Format::Mistral;
  } else {
    return std::nullopt;
  }
  return t;
}

namespace {

// The Jinja template stored with a model (empty if none) and where it was looked for.
std::pair<std::string, std::string> stored_jinja(const ModelFile& model) {
  std::string jinja, where;
  if (model.gguf()) {
    where = model.path() + ": tokenizer.chat_template";
    jinja = model.gguf()->get_string_opt("tokenizer.chat_template").value_or("");
  } else {
    // transformers 5 (and current model repositories) keep the template in chat_template.jinja, which
    // takes priority over tokenizer_config.json's chat_template, as transformers loads them.
    const auto dir = std::filesystem::path(model.path());
    const auto file = dir / "chat_template.jinja";
    if (std::filesystem::exists(file)) {
      where = file.string();
      std::ifstream in(file, std::ios::binary);
      if (!in) fail("{}: cannot read", where);
      jinja.assign(std::istreambuf_iterator<char>(in), std::istreambuf_iterator<char>());
    } else {
      const auto cfg = dir / "tokenizer_config.json";
      where = cfg.string() + ": chat_template (and no chat_template.jinja beside it)";
      std::ifstream in(cfg);
      if (in) {
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(in);
        } catch (const nlohmann::json::exception& e) {
          fail("{}: not valid JSON: {}", cfg.string(), e.what());
        }
        const auto t = j.find("chat_template");
        if (t != j.end() && t->is_string()) {
          jinja = t->get<std::string>();
        } else if (t != j.end() && t->is_array()) {
          // The older form for several named templates: [{"name": ..., "template": ...}], "default" used.
          for (const auto& e : *t)
            if (e.is_object() && e.contains("name") && e["name"] == "default" && e.contains("template") &&
                e["template"].is_string())
              jinja = e["template"].get<std::string>();
          if (jinja.empty()) fail("{}: a list of named templates without one named \"default\"", where);
        } else if (t != j.end() && !t->is_null()) {
          fail("{}: expected a string or a list of named templates, found {}", where, t->type_name());
        }
      }
    }
  }
  return {jinja, where};
}

}  // namespace

std::optional<ChatTemplate> ChatTemplate::stored(const ModelFile& model) {
  const auto [jinja, where] = stored_jinja(model);
  if (jinja.empty()) return std::nullopt;
  auto t = from_jinja(jinja);
  if (!t) fail("{}: chat template not recognised (supported: ChatML, Llama 3, Llama 2, Mistral)", where);
  return t;
}

ChatTemplate ChatTemplate::for_model(const ModelFile& model) {
  if (auto t = stored(model)) return *t;
  fail("{}: the model has no chat template; run without the chat template", stored_jinja(model).second);
}

std::string ChatTemplate::name() const {
  switch (format_) {
    case Format::ChatML:
      return thinking_off_ ? "chatml (thinking off)" : "chatml";
    case Format::Llama3:
      return "llama3";
    case Format::Llama2:
      return "llama2";
    case Format::Mistral:
      return "mistral";
  }
  return "?";
}

std::string ChatTemplate::render(const std::vector<ChatMessage>& messages, bool add_generation_prompt) const {
  std::string out;
  const bool has_system = !messages.empty() && messages[0].role == "system";
  switch (format_) {
    case Format::ChatML:
      if (!has_system && !default_system_.empty()) out += "<|im_start|>system\n" + default_system_ + "<|im_end|>\n";
      for (const auto& m : messages) out += "<|im_start|>" + m.role + "\n" + m.content + "<|im_end|>\n";
      if (add_generation_prompt)
        out += thinking_off_ ? "<|im_start|>assistant\n<think>\n\n</think>\n\n" : "<|im_start|>assistant\n";
      break;
    case Format::Llama3:
      out += "<|begin_of_text|>";
      for (const auto& m : messages)
        out += "<|start_header_id|>" + m.role + "<|end_header_id|>\n\n" + trim(m.content) + "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    case Format::Llama2:
    case Format::Mistral: {
      // Llama 2 trims turns and folds the system message into the first user turn inside <<SYS>>;
      // Mistral (as its reference tokenizer, mistral_common, renders v1) keeps turns verbatim,
      // prepends the system message to the first user turn and puts a space before each answer.
      const bool llama2 = format_ == Format::Llama2;
      auto text = [&](const std::string& s) { return llama2 ? trim(s) : s; };
      const std::string system = has_system ? text(messages[0].content) : "";
      bool first_user = true;
      for (size_t k = has_system ? 1 : 0; k < messages.size(); ++k) {
        const auto& m = messages[k];
        if (m.role == "user") {
          std::string content = text(m.content);
          if (first_user && !system.empty())
            content = llama2 ? "<<SYS>>\n" + system + "\n<</SYS>>\n\n" + content : system + "\n\n" + content;
          out += (llama2 || first_user ? "<s>" : "") + std::string("[INST] ") + content + " [/INST]";
          first_user = false;
        } else if (m.role == "assistant") {
          out += " " + text(m.content) + (llama2 ? " </s>" : "</s>");
        } else {
          fail("chat template {}: role '{}' is not supported after the first message", name(), m.role);
        }
      }
      break;
    }
  }
  return out;
}

}  // namespace kvb
