// kvbench run SPEC: an experiment sweep (harness/experiment/sweep.hpp). --shard i/N runs a
// deterministic share of the cells; shards writing separate files merge by key in `kvbench report`.
#include <fmt/format.h>

#include "harness/cli/commands.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

void register_run_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("run", "Run an experiment spec (YAML): a resumable sweep of methods x budgets x task");
  struct Args {
    std::string spec, shard, out, code_version, model;
    std::vector<std::string> sets;
    bool dry_run = false;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("spec", a->spec, "Experiment YAML (see experiments/)")->required();
  cmd->add_flag("--dry-run", a->dry_run, "Print the expanded cells and the work they need; run nothing");
  cmd->add_option("--shard", a->shard,
                  "i/N: run only the cells of every N-th sample from the i-th (its shared prefill done once)");
  cmd->add_option("--out", a->out, "Results file instead of the spec's out (e.g. one per shard)");
  cmd->add_option("--model", a->model,
                  "Model file or directory instead of the spec's model (the same as --set model=PATH)");
  cmd->add_option("--set", a->sets,
                  "KEY=VALUE laid over the spec before it is read (repeatable): limit=1, max_new_tokens=16, "
                  "task_options.length=[4096]; the value is YAML");
  cmd->add_option("--code-version", a->code_version,
                  "Refuse to run unless this kvbench is that code version (a Slurm task of kvbench submit checks that "
                  "the binary was not rebuilt under it)");
  cmd->callback([a] {
    if (!a->code_version.empty() && a->code_version != code_version())
      fail(
          "this kvbench is code version {}, but the sweep was submitted with {}: records of two code versions do not "
          "mix in one results directory; rebuild {} or submit again to a new directory",
          code_version(), a->code_version, a->code_version);
    std::vector<std::string> sets = a->sets;
    if (!a->model.empty()) sets.push_back("model=" + a->model);
    ExperimentSpec spec = load_experiment(a->spec, sets);
    if (!a->out.empty()) spec.out = a->out;
    Sweep sweep(spec, a->shard.empty() ? SweepShard{} : parse_shard(a->shard));
    if (a->dry_run) {
      sweep.describe();
      return;
    }
    const SweepOutcome o = sweep.run();
    fmt::print(
        "{}: {} cells in {:.0f} s ({:.0f} s of shared prefills, {} of their {} prompt tokens computed, the rest "
        "continued from prefixes other prompts share); results in {}; tables and figures: kvbench report {}\n",
        spec.name, o.run, o.seconds, o.prefill_seconds, o.prefilled_tokens, o.prompt_tokens, spec.out, spec.out);
    if (o.failed)
      fail(
          "{}: {} cells failed (their errors are in {}); they are not recorded, so running the spec again retries them",
          spec.name, o.failed, o.failures);
  });
}

}  // namespace kvb::cli
