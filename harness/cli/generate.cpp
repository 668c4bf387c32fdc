// kvbench generate: a greedy continuation of a prompt, optionally under a compression method.
#include <fmt/format.h>
#include <algorithm>

#include <nlohmann/json.hpp>

#include "harness/cli/commands.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/engine/gradients.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"

namespace kvb::cli {

using nlohmann::json;

void register_generate_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("generate", "Greedy continuation of a prompt");
  struct Args : EngineArgs {
    std::string model, prompt, method;
    bool chat = false, json = false;
    int max_new = 128, budget = 0;
    std::vector<std::string> stop, params;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("model", a->model, "GGUF file or Hugging Face model directory")->required();
  cmd->add_option("--prompt,-p", a->prompt, "Prompt text")->required();
  cmd->add_flag("--chat", a->chat, "Wrap the prompt as a user message in the chat template");
  cmd->add_option("--max-new-tokens,-n", a->max_new, "Tokens to generate at most")->check(kPositive);
  cmd->add_option("--stop", a->stop, "Stop string (repeatable)");
  cmd->add_flag("--json", a->json, "Print ids, text, timings as JSON");
  cmd->add_option("--method", a->method, "KV-cache compression method (kvbench list methods)");
  cmd->add_option("--budget", a->budget, "KV size T: tokens kept per stored head per layer")
      ->check(kPositive)
      ->default_str("none");
  cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
  add_engine_options(cmd, *a);
  cmd->callback([a] {
    auto m = ModelFile::open(a->model);
    auto tok = load_tokenizer(*m);
    Engine engine(*m, engine_options(*a));
    const auto prompt = build_prompt(*m, *tok, a->prompt, a->chat);
    GenerateOptions opt;
    opt.max_new_tokens = a->max_new;
    opt.stop = a->stop;
    auto [method, runner] =
        choose_method(a->method, parse_key_values(a->params), a->budget, engine.config(), "--method");
    const Generation g = generate(engine, *tok, prompt, opt, runner.get());
    const size_t full = engine.full_kv_bytes(prompt.size());
    const size_t kept = runner ? runner->prefill_kv_bytes() : full;
    if (a->json) {
      nlohmann::json j = {{"prompt_tokens", g.prompt_tokens},
                          {"tokens", g.tokens},
                          {"text", g.text},
                          {"stop_reason", g.stop_reason},
                          {"prefill_seconds", g.prefill_seconds},
                          {"decode_seconds", g.decode_seconds},
                          {"prefill_kv_bytes", kept},
                          {"full_kv_bytes", full},
                          {"kv_dtype", a->kv_dtype},
                          {"weights", weight_format_name(engine.weight_format())},
                          {"T_eq", equivalent_kv_size(engine.config(), kept)},
                          {"method", a->method.empty() ? "fullkv" : a->method},
                          {"params", method ? nlohmann::json(method->params().values()) : nlohmann::json::object()},
                          {"compress_seconds", runner ? runner->compress_seconds() : 0.0}};
      fmt::print("{}\n", j.dump(2));
      return;
    }
    fmt::print("{}\n", g.text);
    if (runner)
      fmt::print(stderr,
                 "[{} T={} gqa={}: prompt KV {:.2f} MiB of {:.2f} MiB full ({:.1f}%){}, compression {:.3f} s]\n",
                 a->method, a->budget, gqa_mode_name(method->gqa()), static_cast<double>(kept) / 1048576.0,
                 static_cast<double>(full) / 1048576.0, 100.0 * static_cast<double>(kept) / static_cast<double>(full),
                 runner->compressed() ? "" : ", prompt fits: not compressed", runner->compress_seconds());
    fmt::print(stderr, "[{} prompt tokens, {} generated ({}), prefill {:.2f} s, decode {:.1f} tok/s]\n",
               g.prompt_tokens, g.tokens.size(), g.stop_reason, g.prefill_seconds,
               g.tokens.size() > 1 ? static_cast<double>(g.tokens.size() - 1) / std::max(g.decode_seconds, 1e-9) : 0.0);
  });
}

}  // namespace kvb::cli
