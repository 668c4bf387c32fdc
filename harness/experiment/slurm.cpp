#include "harness/experiment/slurm.hpp"

#include <fmt/chrono.h>
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>
#include <filesystem>
#include <fstream>
#include <set>
#include <sstream>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/util/error.hpp"
#include "harness/util/hash.hpp"
#include "harness/util/json_file.hpp"
#include "harness/util/subprocess.hpp"

namespace kvb {

namespace {

namespace fs = std::filesystem;
using json = nlohmann::json;

constexpr const char* kManifest = "submit.json";
constexpr const char* kScript = "job.sbatch";
constexpr const char* kSpec = "spec.yaml";

std::string shard_file(const std::string& dir, int i) {
  return (fs::path(dir) / fmt::format("shard-{}.jsonl", i)).string();
}
std::string log_file(const std::string& dir, int i) {
  return (fs::path(dir) / "logs" / fmt::format("shard-{}.log", i)).string();
}

std::string shell_quote(const std::string& s) {
  std::string q = "'";
  for (char c : s) q += c == '\'' ? std::string("'\\''") : std::string(1, c);
  return q + "'";
}

std::string join_tasks(const std::vector<int>& tasks) {
  std::string s;
  for (int t : tasks) s += (s.empty() ? "" : ",") + std::to_string(t);
  return s;
}

std::string trim(const std::string& s) {
  const size_t a = s.find_first_not_of(" \t\r\n"), b = s.find_last_not_of(" \t\r\n");
  return a == std::string::npos ? "" : s.substr(a, b - a + 1);
}

json read_manifest(const std::string& dir) {
  const std::string path = (fs::path(dir) / kManifest).string();
  std::ifstream in(path);
  if (!in) fail("{}: not found: {} is not a directory made by kvbench submit --slurm", path, dir);
  return with_json_errors(path, [&] {
    json m = json::parse(in);
    for (const char* k : {"name", "spec_hash", "version", "kvbench", "workdir"})
      if (!m.contains(k) || !m[k].is_string()) fail("{}: field '{}' must be a string", path, k);
    if (!m.contains("shards") || !m["shards"].is_number_integer() || m["shards"].get<int>() < 1)
      fail("{}: field 'shards' must be a positive integer", path);
    if (!m.contains("jobs") || !m["jobs"].is_array()) fail("{}: field 'jobs' must be a list", path);
    for (const auto& j : m["jobs"])
      if (!j.is_object() || !j.contains("id") || !j["id"].is_string() || !j.contains("tasks") || !j["tasks"].is_array())
        fail("{}: each of 'jobs' must be an object with a string 'id' and a list 'tasks'", path);
    return m;
  });
}

void write_manifest(const std::string& dir, const json& m) {
  const fs::path path = fs::path(dir) / kManifest, tmp = fs::path(dir) / (std::string(kManifest) + ".part");
  {
    std::ofstream out(tmp);
    out << m.dump(2) << "\n";
    if (!out) fail("{}: cannot write", tmp.string());
  }
  fs::rename(tmp, path);  // a reader never sees half a manifest
}

// The sweep's cells by shard and their hash: two specs are the same sweep when they expand to the
// same cells (comments, thread counts and output paths aside).
struct Cells {
  std::vector<std::vector<std::string>> by_shard;
  std::string hash;
  size_t total = 0;
};

// With shards 0: as many as `max_shards`, fewer if there are fewer samples.
Cells sweep_cells(const ExperimentSpec& spec, int shards, int max_shards = 8) {
  const Sweep sweep(spec);
  Cells c;
  c.by_shard = sweep.cells_by_shard(shards ? shards : max_shards);
  if (!shards) {
    // Trailing shards of a sweep with fewer samples than max_shards are empty.
    while (c.by_shard.size() > 1 && c.by_shard.back().empty()) c.by_shard.pop_back();
  }
  std::vector<std::string> sorted;
  for (const auto& s : c.by_shard) sorted.insert(sorted.end(), s.begin(), s.end());
  c.total = sorted.size();
  std::sort(sorted.begin(), sorted.end());
  uint64_t h = fnv1a("kvbench sweep");
  for (const auto& k : sorted) h = fnv1a(k + "\n", h);
  c.hash = fmt::format("{:016x}", h);
  return c;
}

// Checked before anything is written: a submission that cannot happen leaves nothing behind.
void require_sbatch(bool dry_run) {
  if (!dry_run && find_program("sbatch").empty())
    fail(
        "sbatch not found on PATH: kvbench submit --slurm must run where jobs can be submitted to Slurm (a login "
        "node); --dry-run writes the job script without submitting");
}

std::string now_text() { return fmt::format("{:%Y-%m-%dT%H:%M:%S}", fmt::localtime(std::time(nullptr))); }

// Submits the script for `tasks` (all of them when empty) and records the job in the manifest.
void submit_array(const std::string& dir, json& manifest, const std::vector<int>& tasks, bool dry_run) {
  const std::string script = (fs::path(dir) / kScript).string();
  std::vector<std::string> argv = {"sbatch", "--parsable"};
  if (!tasks.empty()) argv.push_back("--array=" + join_tasks(tasks));
  argv.push_back(script);
  const int n = manifest["shards"].get<int>();
  std::vector<int> shards = tasks;
  if (shards.empty())
    for (int i = 0; i < n; ++i) shards.push_back(i);
  if (dry_run) {
    std::string cmd;
    for (const auto& a : argv) cmd += (cmd.empty() ? "" : " ") + a;
    fmt::print("dry run: would submit shards {} of {} with: {}\n", join_tasks(shards), n, cmd);
    return;
  }
  const ProcessResult r = run_process(argv);
  if (r.exit_code != 0)
    fail("sbatch rejected {} (exit {}): {}", script, r.exit_code, trim(r.err.empty() ? r.out : r.err));
  const std::string id = trim(r.out.substr(0, r.out.find(';')));  // --parsable: "ID" or "ID;cluster"
  if (id.empty() || id.find_first_not_of("0123456789") != std::string::npos)
    fail("sbatch accepted {} but printed no job id (expected a number from --parsable, got '{}')", script, trim(r.out));
  manifest["jobs"].push_back({{"id", id}, {"tasks", shards}, {"submitted", now_text()}});
  write_manifest(dir, manifest);
  fmt::print("submitted job {}: shards {} of {}; watch with `kvbench status {}`, merge with `kvbench report {}`\n", id,
             join_tasks(shards), n, dir, dir);
}

// Each array task's latest Slurm state (a task resubmitted takes the state of its newest job); a
// task Slurm no longer knows (purged, no accounting) is ENDED. nullopt: Slurm cannot be asked here, or
// does not answer (no controller): its tasks may still run, so none counts as ended.
std::optional<std::map<int, std::string>> task_states(const json& manifest) {
  const bool scontrol = !find_program("scontrol").empty(), sacct = !find_program("sacct").empty();
  if (!scontrol && !sacct) return std::nullopt;
  std::map<int, std::string> states;
  for (const auto& job : manifest["jobs"]) {
    const std::string id = job["id"].get<std::string>();
    std::map<int, std::string> s;
    // scontrol knows live jobs and those ended less than MinJobAge ago; sacct, where accounting is
    // kept, the rest.
    bool answered = false;
    if (scontrol) {
      const ProcessResult r = run_process({"scontrol", "-o", "show", "job", id});
      if (r.exit_code == 0) s = parse_scontrol_states(r.out);
      // A job it no longer holds is "Invalid job id"; any other failure is Slurm not answering.
      answered = r.exit_code == 0 || r.err.find("Invalid job id") != std::string::npos;
    }
    if (s.empty() && sacct) {
      const ProcessResult r = run_process({"sacct", "-n", "-X", "-P", "-j", id, "-o", "JobID,State"});
      if (r.exit_code == 0) s = parse_sacct_states(r.out);
      // Without accounting sacct fails on every job: scontrol's answer stands.
      answered = answered || r.exit_code == 0;
    }
    if (!answered) return std::nullopt;
    for (const auto& t : job["tasks"]) {
      const int task = t.get<int>();
      states[task] = s.count(task) ? s[task] : "ENDED";
    }
  }
  return states;
}

std::string last_line(const std::string& path) {
  std::ifstream in(path);
  std::string line, last;
  while (std::getline(in, line))
    if (!trim(line).empty()) last = trim(line);
  return last;
}

std::string duration_text(double s) {
  const long t = std::lround(s);
  return fmt::format("{}:{:02}:{:02}", t / 3600, t / 60 % 60, t % 60);
}

// Where a sweep's directory stands: cells recorded per shard and what each record cost.
struct Recorded {
  std::vector<size_t> done;
  double cell_seconds = 0;  // mean over the records
  size_t stray = 0;         // records of cells this sweep does not have
};

Recorded recorded(const std::string& dir, const Cells& cells) {
  Recorded p;
  p.done.resize(cells.by_shard.size());
  double seconds = 0;
  size_t timed = 0;
  for (size_t i = 0; i < cells.by_shard.size(); ++i) {
    const std::set<std::string> want(cells.by_shard[i].begin(), cells.by_shard[i].end());
    std::set<std::string> seen;
    for_each_record(
        shard_file(dir, int(i)),
        [&](const json& r, int) {
          const std::string key = record_key(r);
          if (!want.count(key)) {
            ++p.stray;
            return;
          }
          if (!seen.insert(key).second) return;
          seconds += r.contains("wall_seconds") ? r["wall_seconds"].get<double>()
                                                : r.value("prefill_seconds", 0.0) + r.value("decode_seconds", 0.0) +
                                                      r.value("compress_seconds", 0.0);
          ++timed;
        },
        true);
    p.done[i] = seen.size();
  }
  p.cell_seconds = timed ? seconds / double(timed) : 0;
  return p;
}

// The manifest and the cells of DIR's spec copy, checked against each other.
std::pair<json, Cells> open_sweep(const std::string& dir) {
  json m = read_manifest(dir);
  const ExperimentSpec spec = load_experiment((fs::path(dir) / kSpec).string());
  Cells cells = sweep_cells(spec, m["shards"].get<int>());
  if (cells.hash != m["spec_hash"].get<std::string>())
    fail(
        "{}: its cells (hash {}) are not those submitted (hash {}): the model, the data or the code that names "
        "cells changed since; start a new directory",
        (fs::path(dir) / kSpec).string(), cells.hash, m["spec_hash"].get<std::string>());
  return {std::move(m), std::move(cells)};
}

}  // namespace

std::vector<int> parse_array_tasks(const std::string& text) {
  std::vector<int> tasks;
  const std::string body = text.substr(0, text.find('%'));
  std::stringstream ss(body);
  std::string item;
  auto number = [&](const std::string& s) {
    if (s.empty() || s.find_first_not_of("0123456789") != std::string::npos)
      fail("Slurm array '{}': '{}' is not a task id", text, s);
    return std::stoi(s);
  };
  while (std::getline(ss, item, ',')) {
    const size_t dash = item.find('-');
    if (dash == std::string::npos) {
      tasks.push_back(number(item));
      continue;
    }
    // A step ("0-15:4") keeps every step-th id.
    std::string hi = item.substr(dash + 1);
    int step = 1;
    if (const size_t colon = hi.find(':'); colon != std::string::npos) {
      step = std::max(1, number(hi.substr(colon + 1)));
      hi = hi.substr(0, colon);
    }
    for (int t = number(item.substr(0, dash)), e = number(hi); t <= e; t += step) tasks.push_back(t);
  }
  return tasks;
}

std::map<int, std::string> parse_scontrol_states(const std::string& text) {
  std::map<int, std::string> states;
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    std::string tasks, state;
    std::stringstream fields(line);
    std::string f;
    while (fields >> f) {
      if (f.rfind("ArrayTaskId=", 0) == 0) tasks = f.substr(12);
      if (f.rfind("JobState=", 0) == 0) state = f.substr(9);
    }
    if (tasks.empty() || state.empty() || tasks == "N/A") continue;
    for (int t : parse_array_tasks(tasks)) states[t] = state;
  }
  return states;
}

std::map<int, std::string> parse_sacct_states(const std::string& text) {
  std::map<int, std::string> states;
  std::stringstream lines(text);
  std::string line;
  while (std::getline(lines, line)) {
    const size_t bar = line.find('|'), under = line.find('_');
    if (bar == std::string::npos || under == std::string::npos || under > bar) continue;
    std::string tasks = line.substr(under + 1, bar - under - 1);
    if (!tasks.empty() && tasks.front() == '[') tasks = tasks.substr(1, tasks.find(']') - 1);
    std::string state = trim(line.substr(bar + 1));
    state = state.substr(0, state.find(' '));  // "CANCELLED by 0"
    if (state.empty()) continue;
    for (int t : parse_array_tasks(tasks)) states[t] = state;
  }
  return states;
}

bool slurm_state_active(const std::string& state) {
  static const std::set<std::string> active = {"PENDING",      "RUNNING",     "CONFIGURING",  "COMPLETING", "REQUEUED",
                                               "REQUEUE_HOLD", "REQUEUE_FED", "RESIZING",     "SUSPENDED",  "STOPPED",
                                               "SIGNALING",    "STAGE_OUT",   "RESV_DEL_HOLD"};
  return active.count(state) > 0;
}

std::string sbatch_script(const json& m, const SlurmOptions& o, const std::string& dir) {
  const int n = m["shards"].get<int>();
  const std::string d = fs::absolute(dir).lexically_normal().string();
  std::string s = "#!/bin/bash\n";
  s += fmt::format(
      "# kvbench sweep '{}' on Slurm: array task i runs shard i of {} of {}/{}\n"
      "# into {}/shard-<i>.jsonl. Written by `kvbench submit --slurm`; rerun shards by hand with\n"
      "#   sbatch --array=1,3 {}/{}\n",
      m["name"].get<std::string>(), n, d, kSpec, d, d, kScript);
  // Options on the command line, not #SBATCH lines, would be lost to a resubmission by hand.
  std::vector<std::string> lines = {"--job-name=kvbench-" + m["name"].get<std::string>(),
                                    fmt::format("--array=0-{}", n - 1), "--output=" + d + "/logs/shard-%a.log",
                                    "--open-mode=append",  // a retried task's log keeps the earlier attempts
                                    "--chdir=" + m["workdir"].get<std::string>()};
  if (!o.partition.empty()) lines.push_back("--partition=" + o.partition);
  if (!o.gres.empty()) lines.push_back("--gres=" + o.gres);
  if (!o.time.empty()) lines.push_back("--time=" + o.time);
  if (!o.mem.empty()) lines.push_back("--mem=" + o.mem);
  if (!o.cpus_per_task.empty()) lines.push_back("--cpus-per-task=" + o.cpus_per_task);
  for (const auto& a : o.sbatch_args) lines.push_back(a);
  for (const auto& l : lines) {
    if (l.find('\n') != std::string::npos) fail("sbatch option '{}': a line break cannot go into #SBATCH", l);
    // sbatch reads a directive as a shell would: spaces split it, quotes and backslashes are syntax and
    // '#' starts a comment. Such a value goes in double quotes, its '\\' and '"' escaped.
    const size_t eq = l.find('=');
    if (l.find_first_of(" \t#'\"\\") == std::string::npos || eq == std::string::npos || !l.starts_with("--")) {
      s += "#SBATCH " + l + "\n";
      continue;
    }
    std::string value;
    for (char c : l.substr(eq + 1)) value += c == '\\' || c == '"' ? std::string("\\") + c : std::string(1, c);
    s += "#SBATCH " + l.substr(0, eq + 1) + "\"" + value + "\"\n";
  }
  s += fmt::format(
      "set -euo pipefail\n"
      "# OpenMP gets the CPUs Slurm allocated, not every core of a node other tasks share.\n"
      "export OMP_NUM_THREADS=${{SLURM_CPUS_PER_TASK:-1}}\n"
      "echo \"kvbench shard $SLURM_ARRAY_TASK_ID/{}: job ${{SLURM_ARRAY_JOB_ID}}_$SLURM_ARRAY_TASK_ID on $(hostname) "
      "at $(date -Is)\"\n"
      "exec {} run {} --shard \"$SLURM_ARRAY_TASK_ID/{}\" --out {}\"/shard-$SLURM_ARRAY_TASK_ID.jsonl\" "
      "--code-version {}\n",
      n, shell_quote(m["kvbench"].get<std::string>()), shell_quote(d + "/" + kSpec), n, shell_quote(d),
      shell_quote(m["version"].get<std::string>()));
  return s;
}

void slurm_submit(const std::string& spec_path, const std::string& dir, const SlurmOptions& o,
                  const std::string& kvbench, bool dry_run) {
  require_sbatch(dry_run);
  const ExperimentSpec spec = load_experiment(spec_path);
  if (o.array < 0) fail("--array {}: expected a positive number of shards", o.array);
  const fs::path manifest_path = fs::path(dir) / kManifest;
  Cells cells = sweep_cells(spec, o.array);
  if (cells.total == 0) fail("{}: the spec expands to no cells; nothing to submit", spec_path);
  if (fs::exists(manifest_path)) {
    const json old = read_manifest(dir);
    if (old["spec_hash"].get<std::string>() != cells.hash)
      fail(
          "{} holds the results of another sweep ({}, {} cells, hash {}); {} expands to other cells (hash {}): "
          "submit it with another --dir",
          dir, old.value("spec_source", std::string("?")), old.value("cells", 0), old["spec_hash"].get<std::string>(),
          spec_path, cells.hash);
    if (old["version"].get<std::string>() != code_version())
      fail(
          "{} holds results of code version {}; this kvbench is {}: results of two code versions do not mix in one "
          "directory; submit with another --dir",
          dir, old["version"].get<std::string>(), code_version());
    if (!old["jobs"].empty())
      fail(
          "{} already holds this sweep (job {}): `kvbench status {}` shows it, `kvbench submit --slurm --resume {}` "
          "reruns its unfinished shards",
          dir, old["jobs"].back()["id"].get<std::string>(), dir, dir);
  } else if (fs::exists(dir)) {
    for (const auto& e : fs::directory_iterator(dir))
      if (is_results_file_name(e.path().filename().string()))
        fail("{} holds results files ({}) but no {}: submit to a new or empty directory", dir,
             e.path().filename().string(), kManifest);
  }
  const int n = int(cells.by_shard.size());
  if (const auto empty =
          size_t(std::count_if(cells.by_shard.begin(), cells.by_shard.end(), [](const auto& s) { return s.empty(); })))
    fmt::print(stderr, "note: {} shards for fewer samples: {} array tasks will find nothing to run\n", n, empty);
  fs::create_directories(fs::path(dir) / "logs");
  fs::copy_file(spec_path, fs::path(dir) / kSpec, fs::copy_options::overwrite_existing);
  json m = {{"name", spec.name},
            {"spec_source", spec_path},
            {"spec_hash", cells.hash},
            {"cells", cells.total},
            {"shards", n},
            {"version", code_version()},
            {"kvbench", fs::absolute(kvbench).lexically_normal().string()},
            {"workdir", fs::current_path().string()},
            {"jobs", json::array()}};
  const std::string script = (fs::path(dir) / kScript).string();
  {
    std::ofstream out(script);
    out << sbatch_script(m, o, dir);
    if (!out) fail("{}: cannot write", script);
  }
  fs::permissions(script, fs::perms::owner_exec | fs::perms::group_exec, fs::perm_options::add);
  fmt::print("{}: {} cells in {} shards; script {}\n", spec.name, cells.total, n, script);
  if (dry_run) write_manifest(dir, m);
  submit_array(dir, m, {}, dry_run);
}

void slurm_resume(const std::string& dir, bool dry_run) {
  require_sbatch(dry_run);
  auto [m, cells] = open_sweep(dir);
  if (m["version"].get<std::string>() != code_version())
    fail(
        "{}: its records are of code version {}, this kvbench is {}: resume with the kvbench that made them ({}), "
        "or submit the spec again with another --dir",
        dir, m["version"].get<std::string>(), code_version(), m["kvbench"].get<std::string>());
  const auto states = task_states(m);
  if (!states && !m["jobs"].empty())
    fail(
        "cannot ask Slurm which shards of {} still run (neither scontrol nor sacct is on PATH, or they get no answer "
        "from Slurm)",
        dir);
  const Recorded p = recorded(dir, cells);
  std::vector<int> todo;
  for (size_t i = 0; i < cells.by_shard.size(); ++i) {
    if (p.done[i] == cells.by_shard[i].size()) continue;
    if (states && states->count(int(i)) && slurm_state_active(states->at(int(i)))) continue;
    todo.push_back(int(i));
  }
  if (todo.empty()) {
    fmt::print("{}: no shard to resubmit (every shard is complete or still queued or running); `kvbench status {}`\n",
               dir, dir);
    return;
  }
  submit_array(dir, m, todo, dry_run);
}

void slurm_status(const std::string& dir) {
  const auto [m, cells] = open_sweep(dir);
  const Recorded p = recorded(dir, cells);
  const auto states = task_states(m);
  const int n = m["shards"].get<int>();
  std::string jobs;
  for (const auto& j : m["jobs"]) jobs += (jobs.empty() ? "" : ", ") + j["id"].get<std::string>();
  fmt::print("{}: sweep '{}', {} cells in {} shards, code version {}, job{} {}\n", dir, m["name"].get<std::string>(),
             cells.total, n, m["version"].get<std::string>(), m["jobs"].size() == 1 ? "" : "s",
             jobs.empty() ? "none (not submitted)" : jobs);
  if (!states)
    fmt::print(
        "Slurm cannot be asked here (no scontrol or sacct on PATH, or no answer from Slurm): task states unknown\n");
  fmt::print("{:>5} {:>6} {:>6} {:>8} {:>7}  {}\n", "shard", "cells", "done", "pending", "failed", "slurm");
  size_t done = 0, pending = 0, failed = 0, running = 0, unsubmitted = 0;
  double eta = 0;
  std::vector<std::pair<int, std::string>> failures;
  for (int i = 0; i < n; ++i) {
    const size_t total = cells.by_shard[size_t(i)].size(), missing = total - p.done[size_t(i)];
    std::string state = "-";
    if (states) state = states->count(i) ? states->at(i) : "not submitted";
    const bool active = states && slurm_state_active(state);
    // Missing cells are pending while their task will still run (or Slurm cannot say), failed once it
    // has ended without them; a shard never submitted (a dry run's) has failed nothing.
    const bool never = state == "not submitted";
    const bool lost = missing > 0 && states && !active && !never;
    done += p.done[size_t(i)];
    (lost ? failed : pending) += missing;
    if (never) unsubmitted += missing;
    if (state == "RUNNING") ++running;
    if (active && missing > 0) eta = std::max(eta, double(missing) * p.cell_seconds);
    if (lost) failures.emplace_back(i, state);
    fmt::print("{:>5} {:>6} {:>6} {:>8} {:>7}  {}\n", i, total, p.done[size_t(i)], lost ? 0 : missing,
               lost ? missing : 0, state);
  }
  fmt::print("{:>5} {:>6} {:>6} {:>8} {:>7}\n", "all", cells.total, done, pending, failed);
  if (p.stray)
    fmt::print(
        "note: {} records in the shard files are of cells this sweep does not have (or in another shard's "
        "file); the report includes them\n",
        p.stray);
  if (p.cell_seconds > 0)
    fmt::print("mean cell {:.1f} s{}\n", p.cell_seconds,
               eta > 0 ? fmt::format("; ETA {} for the shards still to run ({} of them running; queued ones start "
                                     "when Slurm finds room)",
                                     duration_text(eta), running)
                       : "");
  for (const auto& [i, state] : failures) {
    const std::string why = last_line(log_file(dir, i));
    fmt::print("shard {} ended ({}) with cells missing{}\n", i, state, why.empty() ? "" : ": " + why);
  }
  if (failed) fmt::print("{} cells failed: `kvbench submit --slurm --resume {}` reruns their shards\n", failed, dir);
  if (unsubmitted)
    fmt::print("{} pending cells are in shards never submitted: `kvbench submit --slurm --resume {}` submits them\n",
               unsubmitted, dir);
  if (!pending && !failed) fmt::print("complete: `kvbench report {}` merges the shards\n", dir);
}

}  // namespace kvb
