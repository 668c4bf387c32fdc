// kvbench submit SPEC --slurm / submit --slurm --resume DIR: a sweep as a Slurm job array of shards
// (harness/experiment/slurm.hpp); `kvbench report DIR` merges the shards by cell key.
#include <filesystem>

#include "harness/cli/commands.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/slurm.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

namespace {

// Where a sweep's shards go unless --dir says: beside the spec's own results file, named after it
// (runs/x.jsonl -> runs/x/).
std::string default_dir(const std::string& spec_path) {
  const std::filesystem::path out = load_experiment(spec_path).out;
  return (out.parent_path() / out.stem()).string();
}

}  // namespace

void register_submit_command(CLI::App& app) {
  auto* cmd = app.add_subcommand(
      "submit", "Run a sweep on a Slurm cluster: a job array whose task i runs shard i (see docs/slurm.md)");
  struct Args {
    std::string spec, dir, resume;
    bool slurm = false, dry_run = false;
    SlurmOptions o;
  };
  auto a = std::make_shared<Args>();
  cmd->add_option("spec", a->spec, "Experiment YAML to submit");
  cmd->add_flag("--slurm", a->slurm, "Submit to Slurm with sbatch (the one scheduler supported)");
  cmd->add_option("--dir", a->dir,
                  "Directory for the script, the shards' records and logs (default: beside the spec's out, "
                  "named after it)");
  cmd->add_option("--resume", a->resume, "Resubmit the unfinished shards of this directory instead");
  cmd->add_option("--array", a->o.array, "Number of shards (array tasks)")
      ->check(kPositive)
      ->default_str("8, or one per sample if fewer");
  cmd->add_option("--partition", a->o.partition, "Slurm partition");
  cmd->add_option("--gres", a->o.gres, "Generic resources per task, e.g. gpu:1 (one GPU each)");
  cmd->add_option("--time", a->o.time, "Time limit per task, e.g. 4:00:00");
  cmd->add_option("--mem", a->o.mem, "Memory per task, e.g. 32G");
  cmd->add_option("--cpus-per-task", a->o.cpus_per_task, "CPUs per task (OpenMP threads of the CPU backend)");
  cmd->add_option("--sbatch-arg", a->o.sbatch_args, "More sbatch options, one per use, e.g. --sbatch-arg=--qos=short")
      ->allow_extra_args(false);
  cmd->add_flag("--dry-run", a->dry_run, "Write the script and print the sbatch command; submit nothing");
  cmd->callback([a] {
    if (!a->slurm) fail("submit: name the scheduler: --slurm (the one supported)");
    if (!a->resume.empty()) {
      if (!a->spec.empty()) fail("submit --resume {}: takes no spec (the directory keeps its own)", a->resume);
      slurm_resume(a->resume, a->dry_run);
      return;
    }
    if (a->spec.empty()) fail("submit: give a spec to submit, or --resume DIR");
    slurm_submit(a->spec, a->dir.empty() ? default_dir(a->spec) : a->dir, a->o,
                 std::filesystem::read_symlink("/proc/self/exe").string(), a->dry_run);
  });
}

}  // namespace kvb::cli
