#pragma once
// A sweep on Slurm: the spec's cells split into N shards by key (Sweep's --shard i/N), run as one job
// array whose task i appends shard i's records to its own file. Everything lives in one directory,
// readable and resubmittable by hand:
//   submit.json      what was submitted: the spec's hash (its cells), the code version, the jobs
//   spec.yaml        the spec as submitted (the tasks run this copy, not the original)
//   job.sbatch       the batch script; `sbatch --array=1,3 job.sbatch` reruns shards 1 and 3
//   shard-<i>.jsonl  shard i's records (`kvbench report DIR` merges them by cell key)
//   logs/shard-<i>.log
// Slurm is driven through its own commands (sbatch, scontrol, sacct), found on PATH.
#include <map>
#include <nlohmann/json.hpp>
#include <optional>
#include <string>
#include <vector>

namespace kvb {

struct SlurmOptions {
  int array = 0;  // shards; 0: 8, or one per sample if the sweep has fewer
  std::string partition, gres, time, mem, cpus_per_task;
  std::vector<std::string> sbatch_args;  // more #SBATCH lines, e.g. "--account=lab" or "--qos=short"
};

// Writes DIR's files for the spec and submits the array (with dry_run, writes them and prints the
// sbatch command instead). `kvbench` is the absolute path of the binary the tasks run; each node must
// be able to read it, the model and the data at the same paths (a shared filesystem). Error if DIR
// already holds another sweep (a different spec or code version), or this one (use resume).
void slurm_submit(const std::string& spec_path, const std::string& dir, const SlurmOptions& options,
                  const std::string& kvbench, bool dry_run);

// Resubmits the shards of DIR with cells missing whose tasks are neither queued nor running; prints
// what it did. Error if the code version differs from the one that made DIR's records.
void slurm_resume(const std::string& dir, bool dry_run);

// Prints cells done / pending / failed per shard and overall, each array task's Slurm state where
// Slurm can be asked, and the ETA of what still runs.
void slurm_status(const std::string& dir);

// --- pieces, exposed for the tests ---

// The script for `shards` array tasks; `manifest` is what submit.json holds.
std::string sbatch_script(const nlohmann::json& manifest, const SlurmOptions& options, const std::string& dir);
// Task ids of a Slurm array expression: "0-3", "1,3,5-6", "0-7%2" (a throttle suffix is ignored).
std::vector<int> parse_array_tasks(const std::string& text);
// The array tasks' states in `scontrol -o show job ID` output (JobState of each ArrayTaskId).
std::map<int, std::string> parse_scontrol_states(const std::string& text);
// The same from `sacct -n -X -P -o JobID,State` output ("12_3|CANCELLED by 0", "12_[4-7]|PENDING").
std::map<int, std::string> parse_sacct_states(const std::string& text);
// Whether a task in this state will still run (queued, running or being requeued).
bool slurm_state_active(const std::string& state);

}  // namespace kvb
