// kvbench logits: top-k next-token logits of a text, after the prompt and after each decode step.
#include <fmt/format.h>
#include <algorithm>
#include <nlohmann/json.hpp>

#include <numeric>

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
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/npy.hpp"

namespace kvb::cli {

using nlohmann::json;

void register_logits_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "logits",
      "Top-k next-token logits of a text, as JSON: after the prompt, and with --steps after each decode "
      "step over the cache a --method kept (all logits with --out FILE.npy)");
  struct Args : EngineArgs {
    std::string model, text, method, continuation, out;
    int top_k = 10, budget = 0, steps = 0;
    bool chat = false;
    std::vector<std::string> params;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("model", a->model, "GGUF file or Hugging Face model directory")->required();
  cmd->add_option("--text,-t", a->text, "Input text")->required();
  cmd->add_option("--top-k,-k", a->top_k, "How many logits")->check(kPositive);
  cmd->add_flag("--chat", a->chat, "Wrap the text in the chat template");
  cmd->add_option("--method", a->method, "KV-cache compression method (kvbench list methods)");
  cmd->add_option("--budget", a->budget, "KV size T for a budgeted --method")->check(kPositive)->default_str("none");
  cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
  auto* steps = cmd->add_option("--steps", a->steps, "Decode steps after the prompt, each fed the greedy token")
                    ->check(kNonNegative);
  cmd->add_option("--continuation", a->continuation,
                  "Text fed token by token after the prompt instead of greedy tokens (as many steps as its tokens)")
      ->excludes(steps);
  cmd->add_option("--out", a->out, "Write every logit as .npy, float32 [1 + steps, vocab]");
  add_engine_options(cmd, *a);
  cmd->callback([a] {
    auto m = ModelFile::open(a->model);
    auto tok = load_tokenizer(*m);
    Engine engine(*m, engine_options(*a));
    const auto ids = build_prompt(*m, *tok, a->text, a->chat);
    const std::vector<int32_t> forced =
        a->continuation.empty() ? std::vector<int32_t>{} : tok->encode(a->continuation, false);
    if (!a->continuation.empty() && forced.empty()) fail("--continuation '{}' has no tokens", a->continuation);
    auto [method, runner] =
        choose_method(a->method, parse_key_values(a->params), a->budget, engine.config(), "--method");
    const int n_steps = forced.empty() ? a->steps : int(forced.size());
    const StepLogits sl = step_logits(engine, ids, n_steps, forced, runner.get());
    nlohmann::json rows = nlohmann::json::array();
    for (size_t r = 0; r < sl.logits.size(); ++r) {
      const auto& logits = sl.logits[r];
      std::vector<int32_t> order(logits.size());
      std::iota(order.begin(), order.end(), 0);
      const size_t k = std::min<size_t>(a->top_k, order.size());
      std::partial_sort(
          order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
          [&](int32_t x, int32_t y) { return logits[x] > logits[y] || (logits[x] == logits[y] && x < y); });
      nlohmann::json top = nlohmann::json::array();
      for (size_t i = 0; i < k; ++i)
        top.push_back({{"id", order[i]},
                       {"token", utf8_lossy(tok->decode(std::vector<int32_t>{order[i]}))},
                       {"logit", logits[order[i]]}});
      nlohmann::json row = {{"position", ids.size() - 1 + r}, {"top", top}};
      if (r > 0) row["fed"] = sl.fed[r - 1];
      rows.push_back(row);
    }
    nlohmann::json j = {{"tokens", ids.size()}, {"top", rows[0]["top"]}};
    if (n_steps > 0) j["steps"] = rows;
    if (method) {
      j["method"] = method->name();
      j["params"] = method->params().values();
      if (const nlohmann::json art = method->artifacts(); !art.is_null()) j["artifacts"] = art;  // file and digest
      j["prefill_kv_bytes"] = runner->prefill_kv_bytes();
      j["full_kv_bytes"] = engine.full_kv_bytes(ids.size());
      j["cache"] = runner->cache_profile();
    }
    if (!a->out.empty()) {
      write_npy(a->out, sl.flat(), {sl.logits.size(), sl.logits[0].size()});
      j["out"] = a->out;
    }
    fmt::print("{}\n", j.dump(2));
  });
}

}  // namespace kvb::cli
