// kvbench run SPEC: an experiment sweep. Cells (sample x method configuration x budget) have stable
// keys; those already in the results file are skipped, the rest run with the model loaded once and
// are appended one by one (synced), so a killed sweep resumes where it stopped. --shard i/N runs a
// deterministic share of the cells; shards writing separate files merge by key in `kvbench report`.
#include <fmt/format.h>

#include <chrono>
#include <nlohmann/json.hpp>

#include "harness/cli/commands.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"
#include "tasks/task.hpp"

namespace kvb::cli {

void register_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run an experiment spec (YAML): a resumable sweep of methods x budgets x task");
  struct Args {
    std::string spec, shard;
    bool dry_run = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("spec", a->spec, "Experiment YAML (see experiments/)")->required();
  cmd->add_flag("--dry-run", a->dry_run, "Print the expanded cells and the work they need; run nothing");
  cmd->add_option("--shard", a->shard, "i/N: run only the cells whose key falls in share i of N");
  cmd->callback([a] {
    const ExperimentSpec spec = load_experiment(a->spec);
    int shard = 0, shards = 1;
    if (!a->shard.empty() && (std::sscanf(a->shard.c_str(), "%d/%d", &shard, &shards) != 2 || shards < 1 ||
                              shard < 0 || shard >= shards))
      fail("--shard {}: expected i/N with 0 <= i < N", a->shard);
    auto m = ModelFile::open(spec.model);
    auto tok = load_tokenizer(*m);
    TaskContext ctx;
    ctx.tokenizer = tok.get();
    ctx.options = spec.task_options;
    ctx.data_dir = spec.data;
    auto task = TaskRegistry::get().create(spec.task, ctx);
    const size_t n = spec.limit ? std::min(spec.limit, task->size()) : task->size();
    std::vector<Sample> samples;
    for (size_t i = 0; i < n; ++i) samples.push_back(task->sample(i));

    // Method objects carry their parameters with defaults filled in; the configurations key the cells.
    std::unique_ptr<Engine> engine;
    if (!a->dry_run) engine = std::make_unique<Engine>(*m, EngineOptions{spec.backend, spec.threads});
    std::vector<std::unique_ptr<Method>> methods;
    std::vector<nlohmann::json> configs;
    for (const auto& c : spec.configs) {
      methods.push_back(c.name == "fullkv" ? nullptr
                                           : MethodRegistry::get().create(c.name, c.params, m->config()));
      configs.push_back(cell_config(*m, spec.model, spec.task, spec.task_options, methods.back().get(), c.budget));
    }
    auto in_shard = [&](const std::string& key) { return std::stoull(key, nullptr, 16) % uint64_t(shards) == uint64_t(shard); };

    if (a->dry_run) {
      size_t cells = 0, tokens = 0, gen = 0;
      for (const auto& s : samples) {
        const size_t p = build_prompt(*m, *tok, s.prompt, s.chat).size();
        for (const auto& c : configs)
          if (in_shard(cell_key(c, s.id))) {
            ++cells;
            tokens += p;
            gen += size_t(s.max_new_tokens);
          }
      }
      fmt::print("{}: task {} ({} samples) x {} method configurations:\n", spec.path, spec.task, samples.size(),
                 configs.size());
      for (const auto& c : configs)
        fmt::print("  {} KV size {} gqa {} params {}\n", c["method"].get<std::string>(), c["budget"].get<int>(),
                   c["gqa"].get<std::string>(), c["params"].dump());
      fmt::print("{} cells{}: {} prompt tokens to prefill, up to {} tokens to generate; results in {}\n", cells,
                 shards > 1 ? fmt::format(" in shard {}/{}", shard, shards) : "", tokens, gen, spec.out);
      return;
    }
    ResultsFile out(spec.out);
    const auto done = out.recorded("key");
    size_t todo = 0;
    for (const auto& s : samples)
      for (const auto& c : configs) {
        const std::string key = cell_key(c, s.id);
        todo += in_shard(key) && !done.count(key);
      }
    fmt::print(stderr, "{}: {} cells to run ({} already recorded in {})\n", spec.name, todo, done.size(), spec.out);
    Progress bar(spec.name, todo, "cells");
    const auto t0 = std::chrono::steady_clock::now();
    double prefill_s = 0;
    for (const auto& s : samples) {
      std::vector<size_t> pending;
      for (size_t c = 0; c < configs.size(); ++c) {
        const std::string key = cell_key(configs[c], s.id);
        if (in_shard(key) && !done.count(key)) pending.push_back(c);
      }
      if (pending.empty()) continue;
      // One full-attention prefill per sample serves every method x budget cell: it keeps what the
      // most demanding method reads.
      PrefillNeeds needs;
      for (size_t c : pending)
        if (methods[c]) {
          const PrefillNeeds want = methods[c]->needs();
          needs.window = std::max(needs.window, want.window);
          needs.k_pre_rope = needs.k_pre_rope || want.k_pre_rope;
          needs.attn_colsum = needs.attn_colsum || want.attn_colsum;
        }
      const auto t = std::chrono::steady_clock::now();
      const PrefillCapture capture = engine->prefill_capture(build_prompt(*m, *tok, s.prompt, s.chat), needs);
      prefill_s += std::chrono::duration<double>(std::chrono::steady_clock::now() - t).count();
      for (size_t c : pending) {
        auto rec = run_cell(*m, *tok, *engine, *task, s, methods[c].get(), spec.configs[c].budget, configs[c], &capture);
        out.append(rec);
        bar.advance(1, fmt::format("{} {:.2f}", configs[c]["method"].get<std::string>(), rec["score"].get<double>()));
      }
    }
    bar.finish();
    fmt::print("{}: done in {:.0f} s ({:.0f} s of shared prefills); results in {}; tables and figures: kvbench report {}\n",
               spec.name, std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count(), prefill_s,
               spec.out, spec.out);
  });
}

}  // namespace kvb::cli
