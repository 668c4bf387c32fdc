// kvbench dump-prefill: a prompt's per-layer K, V and window queries (and a method's kept widths) as .npy.
#include <fmt/format.h>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include <set>

#include "harness/cli/commands.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/method/prefill_dump.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

using nlohmann::json;

void register_dump_prefill_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("dump-prefill",
                                 "Write one sample's per-layer K, V and window queries (.npy), and with a method "
                                 "the width each head keeps each token at, for reference scripts");
  struct Args : TaskArgs {
    std::string out, method;
    std::vector<int> layers;
    std::vector<std::string> params;
    size_t index = 0;
    int window = 8, budget = 0;
  };
  auto a = std::make_shared<Args>();
  add_task_args(cmd, *a);
  cmd->add_option("--index,-i", a->index, "Sample index")->check(kNonNegative);
  cmd->add_option("--layers", a->layers, "Layers to write (default: all)")->delimiter(',');
  cmd->add_option("--window", a->window, "Window queries to write")->check(kPositive);
  cmd->add_option("--method", a->method, "Compression method whose kept widths to write");
  cmd->add_option("--budget", a->budget, "KV size T for a budgeted --method")->check(kPositive)->default_str("none");
  cmd->add_option("--param", a->params, "Method parameter key=value (repeatable)");
  cmd->add_option("--out", a->out, "Output directory")->required();
  cmd->callback([a] {
    auto m = ModelFile::open(a->model);
    auto tok = load_tokenizer(*m);
    auto task = make_task(*a, *tok);
    if (a->index >= task->size()) fail("--index {}: task {} has {} samples", a->index, a->task, task->size());
    const Sample s = task->sample(a->index);
    const auto ids = sample_prompt(*m, *tok, s).prefill;  // what a method compresses
    if (size_t(a->window) > ids.size())
      fail("--window {}: sample {} has {} prompt tokens; ask for at most that many window queries", a->window, a->index,
           ids.size());
    for (const int l : a->layers)
      if (l < 0 || l >= m->config().n_layers)
        fail("--layers {}: the model has layers 0 to {}", l, m->config().n_layers - 1);
    Engine engine(*m);
    auto [method, runner] =
        choose_method(a->method, parse_key_values(a->params), a->budget, engine.config(), "--method");
    std::set<int> layers(a->layers.begin(), a->layers.end());
    if (layers.empty())
      for (int l = 0; l < m->config().n_layers; ++l) layers.insert(l);
    std::filesystem::create_directories(a->out);
    PrefillDumper dumper(a->out, layers, a->window, runner.get());
    engine.prefill(ids, &dumper);
    const auto& c = m->config();
    json meta = {{"model", std::filesystem::path(a->model).filename().string()},
                 {"fingerprint", c.fingerprint},
                 {"task", a->task},
                 {"options", parse_key_values(a->options, "--option")},
                 {"index", a->index},
                 {"sample", s.id},
                 {"n_tokens", ids.size()},
                 {"n_heads", c.n_heads},
                 {"n_kv_heads", c.n_kv_heads},
                 {"head_dim", c.head_dim},
                 {"window", a->window},
                 {"layers", layers},
                 {"prompt_ids", ids}};
    if (method)
      meta["method"] = {{"name", method->name()},
                        {"budget", method->budgeted() ? json(a->budget) : json(nullptr)},
                        {"params", method->params().values()},
                        {"cache", runner->cache_profile()}};
    std::ofstream(a->out + "/meta.json") << meta.dump(1) << "\n";
    fmt::print("{}: {} tokens, {} layers written\n", a->out, ids.size(), layers.size());
  });
}

}  // namespace kvb::cli
