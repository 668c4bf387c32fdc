#include "harness/tokenizer/chat_template.hpp"

#include <algorithm>
#include <cctype>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <nlohmann/json.hpp>

#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

bool contains(const std::string& s, const char* what) { return s.find(what) != std::string::npos; }

// The text a template writes as it stands: the raw text between its tags, and the string literals
// inside {{ }} and {% %} with their escapes decoded (Jinja reads them as Python's unicode-escape
// does). Expressions and comments are left out, so a literal never runs into a message's content.
std::vector<std::string> jinja_literals(const std::string& jinja) {
  std::vector<std::string> out;
  const auto is_tag = [&](size_t at) {
    return at + 1 < jinja.size() && (jinja[at + 1] == '{' || jinja[at + 1] == '%' || jinja[at + 1] == '#');
  };
  size_t i = 0;
  while (i < jinja.size()) {
    size_t tag = jinja.find('{', i);
    while (tag != std::string::npos && !is_tag(tag)) tag = jinja.find('{', tag + 1);  // a lone brace is text
    if (tag == std::string::npos) {
      out.push_back(jinja.substr(i));
      break;
    }
    if (tag > i) out.push_back(jinja.substr(i, tag - i));
    const char kind = jinja[tag + 1];
    const std::string close = kind == '{' ? "}}" : kind == '%' ? "%}" : "#}";
    size_t k = tag + 2;
    while (k < jinja.size() && jinja.compare(k, 2, close) != 0) {
      const char q = jinja[k];
      if (kind == '#' || (q != '\'' && q != '"')) {
        ++k;
        continue;
      }
      std::string lit;
      for (++k; k < jinja.size() && jinja[k] != q; ++k) {
        if (jinja[k] != '\\' || k + 1 == jinja.size()) {
          lit += jinja[k];
          continue;
        }
        const char e = jinja[++k];
        if (e == 'n')
          lit += '\n';
        else if (e == 't')
          lit += '\t';
        else if (e == 'r')
          lit += '\r';
        else if (e == '\\' || e == '\'' || e == '"')
          lit += e;
        else if (const size_t n = e == 'x'   ? 2
                                  : e == 'u' ? 4
                                             : 0;
                 n && k + n < jinja.size() &&
                 std::all_of(jinja.begin() + long(k) + 1, jinja.begin() + long(k + n) + 1,
                             [](char c) { return std::isxdigit(static_cast<unsigned char>(c)) != 0; })) {
          append_utf8(lit, static_cast<uint32_t>(std::stoul(jinja.substr(k + 1, n), nullptr, 16)));
          k += n;
        } else {
          lit += '\\';
          lit += e;
        }
      }
      out.push_back(std::move(lit));
      ++k;
    }
    i = k + 2;
  }
  return out;
}

// A ChatML template that injects a system turn writes it as one literal; the text between the system
// header and <|im_end|> is the default system message (SmolLM2, Qwen2). Qwen2.5's first system header
// opens its tool-use branch, whose text is an expression; the literal default comes later.
std::string chatml_default_system(const std::string& jinja) {
  const std::string head = "<|im_start|>system\n";
  for (const std::string& lit : jinja_literals(jinja)) {
    const size_t b = lit.find(head);
    if (b == std::string::npos) continue;
    const size_t e = lit.find("<|im_end|>", b);
    if (e != std::string::npos) return lit.substr(b + head.size(), e - b - head.size());
  }
  return "";
}

// The literal a Jinja `set NAME = "..."` gives (the last one: Llama 3.2 sets today's date where the
// template can ask for it, and this literal otherwise), or "".
std::string jinja_set_literal(const std::string& jinja, const std::string& name) {
  std::string value;
  const std::string pat = "set " + name + " = ";
  for (size_t b = jinja.find(pat); b != std::string::npos; b = jinja.find(pat, b + 1)) {
    const size_t q = b + pat.size();
    if (q >= jinja.size() || (jinja[q] != '"' && jinja[q] != '\'')) continue;
    const size_t e = jinja.find(jinja[q], q + 1);
    if (e != std::string::npos) value = jinja.substr(q + 1, e - q - 1);
  }
  return value;
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
    t.chatml_bos_ = contains(jinja, "bos_token");
  } else if (contains(jinja, "<|start_header_id|>")) {
    t.format_ = Format::Llama3;
    // Llama 3.1 to 3.3 open every conversation with a system turn that dates the model, whether or not
    // the conversation has a system message.
    const std::string kd = "Cutting Knowledge Date: ";
    for (const std::string& lit : jinja_literals(jinja))
      if (lit.starts_with(kd)) t.knowledge_date_ = python_strip(lit.substr(kd.size()));
    if (!t.knowledge_date_.empty()) {
      t.today_date_ = jinja_set_literal(jinja, "date_string");
      if (t.today_date_.empty())
        fail("chat template: a Llama 3.1-style template without a literal date_string default is not supported");
    }
  } else if (contains(jinja, "<<SYS>>")) {
    t.format_ = Format::Llama2;
  } else if (contains(jinja, "[INST] ")) {
    t.format_ = Format::Mistral;
    // v0.3's template closes a turn with "[/INST]" right after the content, and gives the system
    // message to the last user turn; v0.1's writes " [/INST]".
    t.mistral_v3_ = !contains(jinja, " [/INST]");
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
      return knowledge_date_.empty() ? "llama3" : "llama3.1 (today " + today_date_ + ")";
    case Format::Llama2:
      return "llama2";
    case Format::Mistral:
      return mistral_v3_ ? "mistral v3" : "mistral";
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
    case Format::Llama3: {
      out += "<|begin_of_text|>";
      size_t k = 0;
      if (!knowledge_date_.empty()) {
        out += "<|start_header_id|>system<|end_header_id|>\n\nCutting Knowledge Date: " + knowledge_date_ +
               "\nToday Date: " + today_date_ + "\n\n" + (has_system ? python_strip(messages[0].content) : "") +
               "<|eot_id|>";
        k = has_system ? 1 : 0;
      }
      for (; k < messages.size(); ++k)
        out += "<|start_header_id|>" + messages[k].role + "<|end_header_id|>\n\n" + python_strip(messages[k].content) +
               "<|eot_id|>";
      if (add_generation_prompt) out += "<|start_header_id|>assistant<|end_header_id|>\n\n";
      break;
    }
    case Format::Llama2:
    case Format::Mistral: {
      // Llama 2 folds the system message (even an empty one) into the first user turn inside <<SYS>> and
      // strips the whole turn. Mistral v1 (as its reference tokenizer, mistral_common, renders it) keeps
      // turns verbatim, prepends the system message to the first user turn and puts a space before each
      // answer; v0.3's template gives the system message to the user turn that ends the conversation and
      // strips answers.
      const bool llama2 = format_ == Format::Llama2;
      const size_t first = has_system ? 1 : 0;
      bool first_user = true;
      for (size_t k = first; k < messages.size(); ++k) {
        const auto& m = messages[k];
        if (m.role == "user") {
          std::string content = m.content;
          if (llama2) {
            if (k == first && has_system) content = "<<SYS>>\n" + messages[0].content + "\n<</SYS>>\n\n" + content;
            content = python_strip(content);
          } else if (has_system &&
                     (mistral_v3_ ? k + 1 == messages.size() : first_user && !messages[0].content.empty())) {
            content = messages[0].content + "\n\n" + content;
          }
          out += (llama2 || first_user ? "<s>" : "") + std::string("[INST] ") + content +
                 (mistral_v3_ ? "[/INST]" : " [/INST]");
          first_user = false;
        } else if (m.role == "assistant") {
          out += " " + (llama2 || mistral_v3_ ? python_strip(m.content) : m.content) + (llama2 ? " </s>" : "</s>");
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
