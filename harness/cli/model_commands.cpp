// kvbench info / tokenize / detokenize: inspect a model file and its tokenizer.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <filesystem>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>
#include <sstream>

#include "harness/cli/commands.hpp"
#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
#include "harness/model/random_model.hpp"
#include "harness/tokenizer/chat_template.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {
namespace {

using nlohmann::json;

// tok: null for a model without a tokenizer (random models of make-model).
json describe(const ModelFile& m, const Tokenizer* tok) {
  const ModelConfig& c = m.config();
  uint64_t params = 0;
  std::map<std::string, int> types;
  for (const auto& t : m.tensors()) {
    params += t.n_elems();
    ++types[std::string(dtype_name(t.type))];
  }
  json j = {
      {"path", m.path()},
      {"format", m.is_gguf() ? "gguf" : "safetensors"},
      {"architecture", c.arch_name},
      {"name", c.name},
      {"layers", c.n_layers},
      {"heads", c.n_heads},
      {"kv_heads", c.n_kv_heads},
      {"head_dim", c.head_dim},
      {"hidden", c.hidden},
      {"intermediate", c.intermediate},
      {"vocab_size", c.vocab_size},
      {"context_length", c.context_length},
      {"rope_theta", c.rope_theta},
      {"rope_layout", rope_layout_name(c.rope_layout)},
      {"rope_scaling", rope_scaling_name(c.rope_scaling.type)},
      {"rms_eps", c.rms_eps},
      {"tied_embeddings", c.tied_embeddings},
      {"qkv_bias", c.qkv_bias},
      {"qk_norm", c.qk_norm},
      {"parameters", params},
      {"tensor_types", types},
      {"tokenizer", tok ? tok->kind() : "none"},
  };
  const SpecialTokens none;
  const auto& sp = tok ? tok->special() : none;
  auto tok_json = [&](std::optional<int32_t> id) {
    return id ? json{{"id", *id}, {"text", tok->token_text(*id)}} : json(nullptr);
  };
  j["bos"] = tok_json(sp.bos);
  j["eos"] = tok_json(sp.eos);
  j["add_bos"] = sp.add_bos;
  j["end_of_generation"] = sp.end_of_generation;
  try {
    j["chat_template"] = ChatTemplate::for_model(m).name();
  } catch (const Error&) {
    j["chat_template"] = nullptr;
  }
  return j;
}

void print_info(const json& j) {
  fmt::print("{} ({})\n", j["path"].get<std::string>(), j["format"].get<std::string>());
  fmt::print("  architecture    {}  \"{}\"\n", j["architecture"].get<std::string>(), j["name"].get<std::string>());
  fmt::print("  layers          {}\n", j["layers"].get<int>());
  fmt::print("  heads           {} query, {} KV (group of {}), head dim {}\n", j["heads"].get<int>(),
             j["kv_heads"].get<int>(), j["heads"].get<int>() / j["kv_heads"].get<int>(),
             j["head_dim"].get<int>());
  fmt::print("  hidden          {}, intermediate {}\n", j["hidden"].get<int>(), j["intermediate"].get<int>());
  fmt::print("  vocab           {}\n", j["vocab_size"].get<int>());
  fmt::print("  context length  {}\n", j["context_length"].get<int>());
  fmt::print("  rope            theta {}, {} layout, scaling {}\n", j["rope_theta"].get<double>(),
             j["rope_layout"].get<std::string>(), j["rope_scaling"].get<std::string>());
  fmt::print("  rms norm eps    {}\n", j["rms_eps"].get<double>());
  fmt::print("  embeddings      {}, q/k/v bias {}, q/k norm {}\n",
             j["tied_embeddings"].get<bool>() ? "tied" : "separate output", j["qkv_bias"].get<bool>() ? "yes" : "no",
             j["qk_norm"].get<bool>() ? "yes" : "no");
  std::string types;
  for (const auto& [k, v] : j["tensor_types"].items()) types += fmt::format("{} {}  ", v.get<int>(), k);
  fmt::print("  parameters      {:.1f} M in tensors: {}\n", j["parameters"].get<double>() / 1e6, types);
  fmt::print("  tokenizer       {}, bos {}, eos {}, add bos {}\n", j["tokenizer"].get<std::string>(),
             j["bos"].is_null() ? "none" : j["bos"]["text"].get<std::string>(),
             j["eos"].is_null() ? "none" : j["eos"]["text"].get<std::string>(), j["add_bos"].get<bool>());
  fmt::print("  chat template   {}\n", j["chat_template"].is_null() ? "none" : j["chat_template"].get<std::string>());
}

std::string read_text(const std::string& text, const std::string& file) {
  if (file.empty()) return text;
  std::ifstream in(file, std::ios::binary);
  if (!in) fail("{}: cannot open", file);
  std::stringstream ss;
  ss << in.rdbuf();
  return ss.str();
}

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

void register_model_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("info", "Architecture, shapes and tokenizer of a model");
    auto model = std::make_shared<std::string>();
    auto as_json = std::make_shared<bool>(false);
    auto tensors = std::make_shared<bool>(false);
    auto metadata = std::make_shared<bool>(false);
    cmd->add_option("model", *model, "GGUF file or Hugging Face model directory")->required();
    cmd->add_flag("--json", *as_json, "Print as JSON");
    cmd->add_flag("--tensors", *tensors, "List every tensor");
    cmd->add_flag("--metadata", *metadata, "List every GGUF metadata key");
    cmd->callback([=] {
      auto m = ModelFile::open(*model);
      m->validate_tensors();
      const bool no_vocab = m->gguf() && m->gguf()->get_string_opt("tokenizer.ggml.model") == "no_vocab";
      const auto tok = no_vocab ? nullptr : load_tokenizer(*m);
      const json j = describe(*m, tok.get());
      if (*as_json)
        fmt::print("{}\n", j.dump(2));
      else
        print_info(j);
      if (*metadata && m->gguf())
        for (const auto& k : m->gguf()->keys()) fmt::print("  {:48} {}\n", k, m->gguf()->find(k)->to_string());
      if (*tensors)
        for (const auto& t : m->tensors())
          fmt::print("  {:32} {:6} [{}]\n", t.name, dtype_name(t.type), fmt::join(t.ne, ", "));
    });
  }
  {
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
    cmd->add_flag("--no-special", *no_special, "Treat special-token markers as plain text");
    cmd->add_flag("--prompt", *prompt, "Add BOS/EOS as the model does for a prompt");
    cmd->add_flag("--chat", *chat, "Wrap the text as a user message in the model's chat template");
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
        const auto tmpl = ChatTemplate::for_model(*m);
        ids = tok->encode(tmpl.render({{"user", input}}, true));
        if (!tmpl.renders_bos() && tok->special().add_bos && tok->special().bos)
          ids.insert(ids.begin(), *tok->special().bos);
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
  {
    auto* cmd = app.add_subcommand("detokenize", "Text of token ids");
    auto model = std::make_shared<std::string>();
    auto ids = std::make_shared<std::string>();
    auto skip = std::make_shared<bool>(false);
    cmd->add_option("model", *model, "GGUF file, model directory, tokenizer.json or tokenizer.model")->required();
    cmd->add_option("--ids,-i", *ids, "Ids as a JSON array or separated by commas/spaces")->required();
    cmd->add_flag("--skip-special", *skip, "Leave out special tokens");
    cmd->callback([=] {
      auto tok = load_tokenizer_file(*model);
      fmt::print("{}\n", tok->decode(parse_ids(*ids), *skip));
    });
  }
  {
    auto* cmd = app.add_subcommand("make-model", "Write a random-weight model with the shapes of a real one");
    struct Args {
      std::string shape, out, type = "f16";
      int layers = 0;
      uint64_t seed = 0;
    };
    auto a = std::make_shared<Args>();
    std::string names;
    for (const auto& s : known_model_shapes()) names += (names.empty() ? "" : ", ") + s.name;
    cmd->add_option("shape", a->shape, "Shape to copy: " + names)->required();
    cmd->add_option("--out,-o", a->out, "GGUF file to write")->required();
    cmd->add_option("--type", a->type,
                    "Weight type: f32, f16, bf16, or q4_k_m (Q4_K matrices; Q6_K attn_v, ffn_down and output)")
        ->check(CLI::IsMember({"f32", "f16", "bf16", "q4_k_m"}));
    cmd->add_option("--layers", a->layers, "Keep only this many layers (0: all)");
    cmd->add_option("--seed", a->seed, "Random seed");
    cmd->callback([a] {
      ModelShape s = model_shape(a->shape);
      if (a->layers < 0 || a->layers > s.layers) fail("--layers {}: must be between 0 and {}", a->layers, s.layers);
      if (a->layers) s.layers = a->layers;
      const DType t = a->type == "f32"      ? DType::F32
                      : a->type == "bf16"   ? DType::BF16
                      : a->type == "q4_k_m" ? DType::Q4_K
                                            : DType::F16;
      write_random_model(a->out, s, t, a->seed);
      fmt::print(stderr, "wrote {} ({} layers, random weights, seed {})\n", a->out, s.layers, a->seed);
    });
  }
}

}  // namespace kvb::cli
