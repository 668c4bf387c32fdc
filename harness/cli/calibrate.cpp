// kvbench calibrate METHOD MODEL: a method's offline step (profiling, fitting), writing the artifact
// the method then finds by the model's fingerprint.
#include <fmt/format.h>
#include <fmt/ranges.h>

#include "harness/cli/commands.hpp"
#include "harness/engine/engine.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

namespace {

void add_offline_command(CLI::App& app, const std::string& command, const std::string& help) {
  auto* cmd = app.add_subcommand(command, help);
  struct Args {
    std::string method, model, out, backend = "cpu", data = default_data_dir(), haystack, tokens, prompts, max_tokens,
                                    alpha, mode, steps;
    std::vector<std::string> text, options;
    int threads = 0;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("step", a->method, "Method or named step (kvbench list methods shows the offline steps)")->required();
  cmd->add_option("model", a->model, "Model: .gguf file or Hugging Face directory")->required();
  cmd->add_option("--out", a->out, "Artifact path (default: artifacts/<kind>/<model fingerprint>.json)");
  cmd->add_option("--haystack", a->haystack, "Text file(s) for needle prompts (option 'haystack')");
  cmd->add_option("--text", a->text, "Text files to fit on (option 'text')");
  cmd->add_option("--tokens", a->tokens, "Tokens to fit on (option 'tokens')");
  cmd->add_option("--prompts", a->prompts, "Prompts to profile on (option 'prompts')");
  cmd->add_option("--max-tokens", a->max_tokens, "Tokens per prompt (option 'max_tokens')");
  cmd->add_option("-o,--option", a->options, "key=value: any calibration option (see kvbench list methods)");
  cmd->add_option("--data", a->data, "Benchmark data directory (default: $KVBENCH_DATA or <source>/data)");
  cmd->add_option("--backend", a->backend, "cpu or cuda");
  cmd->add_option("--threads", a->threads, "CPU threads (0: all)")->check(kNonNegative);
  cmd->add_option("--alpha", a->alpha, "Rate penalty (option 'alpha')");
  cmd->add_option("--mode", a->mode, "Training objective (option 'mode')");
  cmd->add_option("--steps", a->steps, "Optimizer steps (option 'steps')");
  cmd->callback([a, command] {
    const OfflineStep step = MethodRegistry::get().offline_step(command, a->method);
    auto given = parse_key_values(a->options, "--option");
    if (!a->haystack.empty()) given["haystack"] = a->haystack;
    if (!a->text.empty()) given["text"] = fmt::format("{}", fmt::join(a->text, ","));
    if (!a->tokens.empty()) given["tokens"] = a->tokens;
    if (!a->prompts.empty()) given["prompts"] = a->prompts;
    if (!a->max_tokens.empty()) given["max_tokens"] = a->max_tokens;
    if (!a->alpha.empty()) given["alpha"] = a->alpha;
    if (!a->mode.empty()) given["mode"] = a->mode;
    if (!a->steps.empty()) given["steps"] = a->steps;
    Params options(step.options, given, "kvbench " + command + " " + a->method);
    if (!a->out.empty()) check_artifact_destination(a->out);
    auto model = ModelFile::open(a->model);
    auto tok = load_tokenizer(*model);
    EngineOptions eo;
    eo.backend = a->backend;
    eo.threads = a->threads;
    Engine engine(*model, eo);
    CalibrationContext ctx{*model, *tok, engine, std::move(options), a->out, a->data, true};
    step.run(ctx);
  });
}

}  // namespace

void register_calibrate_command(CLI::App& app) {
  add_offline_command(app, "calibrate", "Run a method's offline step on a model and write its artifact");
  add_offline_command(app, "train", "Train a method's learned parameters on a model (base frozen) and write them");
}

}  // namespace kvb::cli
