// kvbench generate / logits: run the model.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <map>
#include <nlohmann/json.hpp>
#include <numeric>

#include "harness/cli/commands.hpp"
#include "harness/engine/backend.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/gradients.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/method.hpp"
#include "tasks/task.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/npy.hpp"

namespace kvb::cli {

std::map<std::string, std::string> parse_key_values(const std::vector<std::string>& items) {
  std::map<std::string, std::string> out;
  for (const auto& kv : items) {
    const size_t eq = kv.find('=');
    if (eq == std::string::npos || eq == 0) fail("--param '{}': expected key=value", kv);
    out[kv.substr(0, eq)] = kv.substr(eq + 1);
  }
  return out;
}

void register_list_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("list", "List registered components");
  auto what = std::make_shared<std::string>();
  cmd->add_option("what", *what, "methods or tasks")->required()->check(CLI::IsMember({"methods", "tasks"}));
  cmd->callback([what] {
    if (*what == "tasks") {
      const auto& reg = TaskRegistry::get();
      for (const auto& name : reg.names()) {
        const TaskInfo& t = reg.info(name);
        fmt::print("{:14} {}\n", name, t.summary);
        for (const auto& p : t.options) fmt::print("    {:10} {}  {}\n", p.name, p.describe(), p.help);
      }
      return;
    }
    const auto& reg = MethodRegistry::get();
    for (const auto& name : reg.names()) {
      const MethodInfo& info = reg.info(name);
      fmt::print("{:14} {}\n", name, info.summary);
      for (const auto& p : reg.param_specs(name)) fmt::print("    {:10} {}  {}\n", p.name, p.describe(), p.help);
      if (info.composition == Composition::Wrapper)
        fmt::print("    base.NAME  any parameter of the base method (or base_params: in YAML); the base's gqa is this "
                   "method's\n    wraps: {}\n",
                   fmt::join(reg.names(Composition::Selector), ", "));
      if (info.composition == Composition::Selector)
        fmt::print("    can be wrapped by: {}\n", fmt::join(reg.names(Composition::Wrapper), ", "));
      if (info.calibrate) {
        fmt::print("    offline step: kvbench calibrate {} MODEL [--out FILE] [-o key=value ...]\n", name);
        for (const auto& p : info.calibration) fmt::print("      {:10} {}  {}\n", p.name, p.describe(), p.help);
      }
    }
    for (const auto& s : reg.steps()) {
      fmt::print("offline step: kvbench {} {} MODEL [--out FILE] [-o key=value ...]\n    {}\n", s.command, s.name,
                 s.summary);
      for (const auto& p : s.options) fmt::print("      {:10} {}  {}\n", p.name, p.describe(), p.help);
    }
  });
}

void register_engine_commands(CLI::App& app) {
  {
    auto* cmd = app.add_subcommand("generate", "Greedy continuation of a prompt");
    struct Args {
      std::string model, prompt, backend = "cpu", method, kv_dtype = "fp32", weights;
      bool chat = false, json = false;
      int max_new = 128, threads = 0, budget = 0;
      std::vector<std::string> stop, params;
    };
    auto a = std::make_shared<Args>();
    cmd->add_option("model", a->model, "GGUF file or Hugging Face model directory")->required();
    cmd->add_option("--prompt,-p", a->prompt, "Prompt text")->required();
    cmd->add_flag("--chat", a->chat, "Wrap the prompt as a user message in the chat template");
    cmd->add_option("--max-new-tokens,-n", a->max_new, "Tokens to generate at most")->check(CLI::PositiveNumber);
    cmd->add_option("--stop", a->stop, "Stop string (repeatable)");
    cmd->add_option("--backend", a->backend, "cpu or cuda");
    cmd->add_option("--threads", a->threads, "Threads (0 = all cores)");
    cmd->add_flag("--json", a->json, "Print ids, text, timings as JSON");
    cmd->add_option("--method", a->method, "KV-cache compression method (kvbench list methods)");
    cmd->add_option("--budget", a->budget, "KV size T: tokens kept per stored head per layer")->check(CLI::PositiveNumber);
    cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
    add_kv_dtype_option(cmd, a->kv_dtype);
    add_weights_option(cmd, a->weights);
    cmd->callback([a] {
      auto m = ModelFile::open(a->model);
      auto tok = load_tokenizer(*m);
      Engine engine(*m, {.backend = a->backend,
                         .threads = a->threads,
                         .kv_dtype = parse_kv_dtype(a->kv_dtype, "--kv-dtype"),
                         .weights = weights_option(a->weights)});
      const auto prompt = build_prompt(*m, *tok, a->prompt, a->chat);
      GenerateOptions opt;
      opt.max_new_tokens = a->max_new;
      opt.stop = a->stop;
      auto [method, runner] = choose_method(a->method, parse_key_values(a->params), a->budget, engine.config(), "--method");
      const Generation g = generate(engine, *tok, prompt, opt, runner.get());
      const size_t full = engine.full_kv_bytes(prompt.size());
      const size_t kept = runner ? runner->prefill_kv_bytes() : full;
      if (a->json) {
        nlohmann::json j = {{"prompt_tokens", g.prompt_tokens}, {"tokens", g.tokens},
                            {"text", utf8_lossy(g.text)}, {"stop_reason", g.stop_reason},
                            {"prefill_seconds", g.prefill_seconds}, {"decode_seconds", g.decode_seconds},
                            {"prefill_kv_bytes", kept}, {"full_kv_bytes", full},
                            {"kv_dtype", a->kv_dtype}, {"weights", weight_format_name(engine.weight_format())}, {"T_eq", equivalent_kv_size(engine.config(), kept)},
                            {"method", a->method.empty() ? "fullkv" : a->method},
                            {"params", method ? nlohmann::json(method->params().values()) : nlohmann::json::object()},
                            {"compress_seconds", runner ? runner->compress_seconds() : 0.0}};
        fmt::print("{}\n", j.dump(2));
        return;
      }
      fmt::print("{}\n", utf8_lossy(g.text));
      if (runner)
        fmt::print(stderr, "[{} T={} gqa={}: prompt KV {:.2f} MiB of {:.2f} MiB full ({:.1f}%){}, compression {:.3f} s]\n",
                   a->method, a->budget, gqa_mode_name(method->gqa()), static_cast<double>(kept) / 1048576.0,
                   static_cast<double>(full) / 1048576.0, 100.0 * static_cast<double>(kept) / static_cast<double>(full),
                   runner->compressed() ? "" : ", prompt fits: not compressed", runner->compress_seconds());
      fmt::print(stderr, "[{} prompt tokens, {} generated ({}), prefill {:.2f} s, decode {:.1f} tok/s]\n",
                 g.prompt_tokens, g.tokens.size(), g.stop_reason, g.prefill_seconds,
                 g.tokens.size() > 1 ? static_cast<double>(g.tokens.size() - 1) / std::max(g.decode_seconds, 1e-9) : 0.0);
    });
  }
  {
    auto* cmd = app.add_subcommand(
        "logits", "Top-k next-token logits of a text, as JSON: after the prompt, and with --steps after each decode "
                  "step over the cache a --method kept (all logits with --out FILE.npy)");
    struct Args {
      std::string model, text, backend = "cpu", method, continuation, out, kv_dtype = "fp32", weights;
      int top_k = 10, threads = 0, budget = 0, steps = 0;
      bool chat = false;
      std::vector<std::string> params;
    };
    auto a = std::make_shared<Args>();
    cmd->add_option("model", a->model, "GGUF file or Hugging Face model directory")->required();
    cmd->add_option("--text,-t", a->text, "Input text")->required();
    cmd->add_option("--top-k,-k", a->top_k, "How many logits")->check(CLI::PositiveNumber);
    cmd->add_flag("--chat", a->chat, "Wrap the text in the chat template");
    cmd->add_option("--method", a->method, "KV-cache compression method (kvbench list methods)");
    cmd->add_option("--budget", a->budget, "KV size T for a budgeted --method")->check(CLI::PositiveNumber);
    cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
    auto* steps = cmd->add_option("--steps", a->steps, "Decode steps after the prompt, each fed the greedy token")
                      ->check(CLI::NonNegativeNumber);
    cmd->add_option("--continuation", a->continuation,
                    "Text fed token by token after the prompt instead of greedy tokens (as many steps as its tokens)")
        ->excludes(steps);
    cmd->add_option("--out", a->out, "Write every logit as .npy, float32 [1 + steps, vocab]");
    cmd->add_option("--backend", a->backend, "cpu or cuda");
    cmd->add_option("--threads", a->threads, "Threads (0 = all cores)");
    add_kv_dtype_option(cmd, a->kv_dtype);
    add_weights_option(cmd, a->weights);
    cmd->callback([a] {
      auto m = ModelFile::open(a->model);
      auto tok = load_tokenizer(*m);
      Engine engine(*m, {.backend = a->backend,
                         .threads = a->threads,
                         .kv_dtype = parse_kv_dtype(a->kv_dtype, "--kv-dtype"),
                         .weights = weights_option(a->weights)});
      const auto ids = build_prompt(*m, *tok, a->text, a->chat);
      const std::vector<int32_t> forced = a->continuation.empty() ? std::vector<int32_t>{} : tok->encode(a->continuation, false);
      if (!a->continuation.empty() && forced.empty()) fail("--continuation '{}' has no tokens", a->continuation);
      auto [method, runner] = choose_method(a->method, parse_key_values(a->params), a->budget, engine.config(), "--method");
      const int n_steps = forced.empty() ? a->steps : int(forced.size());
      const StepLogits sl = step_logits(engine, ids, n_steps, forced, runner.get());
      nlohmann::json rows = nlohmann::json::array();
      for (size_t r = 0; r < sl.logits.size(); ++r) {
        const auto& logits = sl.logits[r];
        std::vector<int32_t> order(logits.size());
        std::iota(order.begin(), order.end(), 0);
        const size_t k = std::min<size_t>(a->top_k, order.size());
        std::partial_sort(order.begin(), order.begin() + static_cast<std::ptrdiff_t>(k), order.end(),
                          [&](int32_t x, int32_t y) { return logits[x] > logits[y] || (logits[x] == logits[y] && x < y); });
        nlohmann::json top = nlohmann::json::array();
        for (size_t i = 0; i < k; ++i)
          top.push_back({{"id", order[i]}, {"token", utf8_lossy(tok->decode(std::vector<int32_t>{order[i]}))},
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
  {
    auto* cmd = app.add_subcommand(
        "grad", "Next-token loss of a sequence and its gradients (the backward pass), optionally written as .npy");
    struct Args {
      std::string model, text, ids, weights = "kv", out;
      int tokens = 0, threads = 0;
    };
    auto a = std::make_shared<Args>();
    cmd->add_option("model", a->model, "GGUF file or Hugging Face model directory")->required();
    auto* text = cmd->add_option("--text,-t", a->text, "Input text (tokenized with BOS, no chat template)");
    cmd->add_option("--ids", a->ids, "JSON file holding a list of token ids (used as they are)")->excludes(text);
    cmd->add_option("--tokens", a->tokens, "Keep the first N tokens (0: all)");
    cmd->add_option("--weights", a->weights,
                    "Gradients of: all, kv (every layer's attn_k/attn_v), or comma-separated tensor names");
    cmd->add_option("--out", a->out, "Directory for meta.json and one <tensor>.npy per gradient");
    cmd->add_option("--threads", a->threads, "Threads (0 = all cores)");
    cmd->callback([a] {
      if (a->threads > 0) set_cpu_threads(a->threads);
      auto m = ModelFile::open(a->model);
      std::vector<int32_t> ids;
      if (!a->ids.empty()) {
        std::ifstream in(a->ids);
        if (!in) fail("--ids {}: cannot read", a->ids);
        nlohmann::json j;
        try {
          j = nlohmann::json::parse(in);
          ids = j.get<std::vector<int32_t>>();
        } catch (const nlohmann::json::exception&) {
          fail("--ids {}: expected a JSON list of integer token ids", a->ids);
        }
      } else if (!a->text.empty()) {
        auto tok = load_tokenizer(*m);
        ids = build_prompt(*m, *tok, a->text, false);
      } else {
        fail("grad: give --text or --ids");
      }
      if (a->tokens > 0 && size_t(a->tokens) < ids.size()) ids.resize(size_t(a->tokens));
      ModelGradients mg(*m);
      std::set<std::string> want;
      const auto names = mg.tensor_names();
      std::vector<std::string> parts;
      for (size_t b = 0; b <= a->weights.size();) {
        const size_t e = std::min(a->weights.find(',', b), a->weights.size());
        if (e > b) parts.push_back(a->weights.substr(b, e - b));
        b = e + 1;
      }
      for (const auto& part : parts) {
        if (part == "all") want.insert(names.begin(), names.end());
        else if (part == "kv")
          for (const auto& n : names) {
            if (n.ends_with("attn_k.weight") || n.ends_with("attn_v.weight")) want.insert(n);
          }
        else want.insert(part);
      }
      const auto t0 = std::chrono::steady_clock::now();
      const LossGradients g = mg.compute(ids, want);
      const double seconds = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
      nlohmann::json norms = nlohmann::json::object();
      for (const auto& [name, v] : g.grads) {
        double ss = 0;
        for (float x : v) ss += double(x) * x;
        norms[name] = std::sqrt(ss);
      }
      fmt::print("loss {:.6f} over {} targets; {} gradients in {:.2f} s ({:.0f} tokens/s)\n", g.loss, g.n_targets,
                 g.grads.size(), seconds, double(ids.size()) / seconds);
      for (const auto& [name, norm] : norms.items()) fmt::print("  {:28} |grad|_F {:.6g}\n", name, norm.get<double>());
      if (a->out.empty()) return;
      std::filesystem::create_directories(a->out);
      nlohmann::json meta = {{"model", m->path()},          {"model_fingerprint", m->config().fingerprint},
                             {"loss", g.loss},              {"n_targets", g.n_targets},
                             {"ids", ids},                  {"seconds", seconds},
                             {"tensors", nlohmann::json::array()}, {"frobenius", norms}};
      for (const auto& [name, v] : g.grads) {
        const auto [rows, cols] = mg.shape(name);
        write_npy(a->out + "/" + name + ".npy", v,
                  cols == 1 || rows == 1 ? std::vector<size_t>{v.size()} : std::vector<size_t>{size_t(rows), size_t(cols)});
        meta["tensors"].push_back(name);
      }
      std::ofstream(a->out + "/meta.json") << meta.dump(2) << "\n";
      fmt::print("wrote {} gradients and meta.json to {}\n", g.grads.size(), a->out);
    });
  }
}

}  // namespace kvb::cli
