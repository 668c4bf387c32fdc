// kvbench info: architecture, shapes and tokenizer of a model.
#include <fmt/format.h>
#include <fmt/ranges.h>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include <sstream>

#include "harness/cli/commands.hpp"
#include "harness/model/gguf.hpp"
#include "harness/model/model_file.hpp"
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
      {"norm_eps", c.norm_eps},
      {"tied_embeddings", c.tied_embeddings},
      {"qkv_bias", c.qkv_bias},
      {"qk_norm", c.qk_norm},
      {"norm", c.layer_norm ? "layernorm" : "rmsnorm"},
      {"mlp", c.gated_mlp ? "swiglu" : "gelu"},
      {"parallel_block", c.parallel_block},
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
  // None stored is null; one stored but not recognised says so (generate --chat would refuse it).
  try {
    const auto t = ChatTemplate::stored(m);
    j["chat_template"] = t ? json(t->name()) : json(nullptr);
  } catch (const Error&) {
    j["chat_template"] = "not recognised";
  }
  return j;
}

void print_info(const json& j) {
  fmt::print("{} ({})\n", j["path"].get<std::string>(), j["format"].get<std::string>());
  fmt::print("  architecture    {}  \"{}\"\n", j["architecture"].get<std::string>(), j["name"].get<std::string>());
  fmt::print("  layers          {}\n", j["layers"].get<int>());
  fmt::print("  heads           {} query, {} KV (group of {}), head dim {}\n", j["heads"].get<int>(),
             j["kv_heads"].get<int>(), j["heads"].get<int>() / j["kv_heads"].get<int>(), j["head_dim"].get<int>());
  fmt::print("  hidden          {}, intermediate {}\n", j["hidden"].get<int>(), j["intermediate"].get<int>());
  fmt::print("  vocab           {}\n", j["vocab_size"].get<int>());
  fmt::print("  context length  {}\n", j["context_length"].get<int>());
  fmt::print("  rope            theta {}, {} layout, scaling {}\n", j["rope_theta"].get<double>(),
             j["rope_layout"].get<std::string>(), j["rope_scaling"].get<std::string>());
  fmt::print("  norm eps        {}\n", j["norm_eps"].get<double>());
  fmt::print("  embeddings      {}, q/k/v bias {}, q/k norm {}\n",
             j["tied_embeddings"].get<bool>() ? "tied" : "separate output", j["qkv_bias"].get<bool>() ? "yes" : "no",
             j["qk_norm"].get<bool>() ? "yes" : "no");
  fmt::print("  block           {}, {} MLP, {}\n",
             j["norm"].get<std::string>() == "layernorm" ? "LayerNorm" : "RMSNorm",
             j["mlp"].get<std::string>() == "gelu" ? "GELU" : "SwiGLU",
             j["parallel_block"].get<bool>() ? "attention and MLP in parallel" : "attention then MLP");
  std::string types;
  for (const auto& [k, v] : j["tensor_types"].items()) types += fmt::format("{} {}  ", v.get<int>(), k);
  fmt::print("  parameters      {:.1f} M in tensors: {}\n", j["parameters"].get<double>() / 1e6, types);
  fmt::print("  tokenizer       {}, bos {}, eos {}, add bos {}\n", j["tokenizer"].get<std::string>(),
             j["bos"].is_null() ? "none" : j["bos"]["text"].get<std::string>(),
             j["eos"].is_null() ? "none" : j["eos"]["text"].get<std::string>(), j["add_bos"].get<bool>());
  if (j.contains("tokenizer_error")) fmt::print("                  ({})\n", j["tokenizer_error"].get<std::string>());
  fmt::print("  chat template   {}\n", j["chat_template"].is_null() ? "none" : j["chat_template"].get<std::string>());
}

}  // namespace

void register_info_command(CLI::App& app) {
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
    // The architecture is shown without a tokenizer too (a directory of weights and config alone).
    std::unique_ptr<Tokenizer> tok;
    std::string why;
    try {
      if (!no_vocab) tok = load_tokenizer(*m);
    } catch (const Error& e) {
      why = e.what();
    }
    json j = describe(*m, tok.get());
    if (!why.empty()) j["tokenizer_error"] = why;
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

}  // namespace kvb::cli
