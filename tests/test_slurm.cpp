// The Slurm path without a cluster: parsing what Slurm's commands print, the job script, and submit /
// resume / status driven through stand-in sbatch and scontrol programs that log their arguments.
// tests/slurm/test_cluster.sh runs the same on a real single-node cluster.
#include <cstdlib>
#include <filesystem>
#include <fstream>

#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/experiment/slurm.hpp"
#include "harness/experiment/sweep.hpp"
#include "harness/task/task.hpp"
#include "harness/util/subprocess.hpp"
#include "test_util.hpp"

using namespace kvb;
using namespace kvb::test;
namespace fs = std::filesystem;

TEST_CASE("Slurm array expressions, scontrol and sacct states", "[slurm]") {
  CHECK(parse_array_tasks("0-3") == std::vector<int>{0, 1, 2, 3});
  CHECK(parse_array_tasks("1,3,5-6") == std::vector<int>{1, 3, 5, 6});
  CHECK(parse_array_tasks("0-7%2") == std::vector<int>{0, 1, 2, 3, 4, 5, 6, 7});
  CHECK(parse_array_tasks("0-15:4") == std::vector<int>{0, 4, 8, 12});
  require_error([] { parse_array_tasks("a-3"); }, {"'a'", "not a task id"});

  // As Slurm 22.05 prints them (-o: one line per job record; unsplit pending tasks share one).
  const std::string scontrol =
      "JobId=14 ArrayJobId=13 ArrayTaskId=3 JobName=kvbench-x JobState=RUNNING Reason=None\n"
      "JobId=15 ArrayJobId=13 ArrayTaskId=1 JobName=kvbench-x JobState=CANCELLED Reason=None ExitCode=0:15\n"
      "JobId=13 ArrayJobId=13 ArrayTaskId=4-6,8 JobName=kvbench-x JobState=PENDING Reason=Resources\n"
      "JobId=20 JobName=other JobState=RUNNING\n";
  const auto s = parse_scontrol_states(scontrol);
  CHECK(s == std::map<int, std::string>{
                 {1, "CANCELLED"}, {3, "RUNNING"}, {4, "PENDING"}, {5, "PENDING"}, {6, "PENDING"}, {8, "PENDING"}});
  const auto a = parse_sacct_states("13_3|CANCELLED by 0\n13_[4-5]|PENDING\n13_0|COMPLETED\n13|RUNNING\n");
  CHECK(a == std::map<int, std::string>{{0, "COMPLETED"}, {3, "CANCELLED"}, {4, "PENDING"}, {5, "PENDING"}});
  CHECK(slurm_state_active("PENDING"));
  CHECK(slurm_state_active("RUNNING"));
  CHECK_FALSE(slurm_state_active("CANCELLED"));
  CHECK_FALSE(slurm_state_active("TIMEOUT"));
  CHECK_FALSE(slurm_state_active("ENDED"));
}

TEST_CASE("the job script: one task per shard, options as #SBATCH lines, paths quoted", "[slurm]") {
  const nlohmann::json m = {{"name", "s"},
                            {"shards", 3},
                            {"version", "abc1234"},
                            {"kvbench", "/opt/it's/kvbench"},
                            {"workdir", "/lab/project"}};
  SlurmOptions o;
  o.partition = "gpu";
  o.gres = "gpu:1";
  o.time = "4:00:00";
  o.sbatch_args = {"--qos=short"};
  const std::string script = sbatch_script(m, o, "/lab/runs/s");
  for (const char* line : {"#SBATCH --array=0-2\n", "#SBATCH --partition=gpu\n", "#SBATCH --gres=gpu:1\n",
                           "#SBATCH --time=4:00:00\n", "#SBATCH --qos=short\n", "#SBATCH --chdir=/lab/project\n",
                           "#SBATCH --output=/lab/runs/s/logs/shard-%a.log\n", "--code-version 'abc1234'",
                           "'/opt/it'\\''s/kvbench' run '/lab/runs/s/spec.yaml' --shard \"$SLURM_ARRAY_TASK_ID/3\""})
    CHECK(script.find(line) != std::string::npos);
  CHECK(script.find("--mem") == std::string::npos);
  o.sbatch_args = {"--qos=a\n#SBATCH --x"};
  require_error([&] { sbatch_script(m, o, "/lab/runs/s"); }, {"line break"});
  // Found by an audit: sbatch cut a value at its first space.
  nlohmann::json spaced = m;
  spaced["name"] = "my sweep";
  spaced["workdir"] = "/lab/my project";
  o.sbatch_args = {};
  const std::string quoted = sbatch_script(spaced, o, "/lab/runs/s 2");
  spaced["name"] = "bob's #1";
  CHECK(sbatch_script(spaced, o, "/lab/runs/s").find("#SBATCH --job-name=\"kvbench-bob's #1\"\n") != std::string::npos);
  spaced["name"] = "my sweep";
  spaced["workdir"] = "/lab/a\\b\"c";
  CHECK(sbatch_script(spaced, o, "/lab/runs/s").find("#SBATCH --chdir=\"/lab/a\\\\b\\\"c\"\n") != std::string::npos);
  spaced["workdir"] = "/lab/my project";
  for (const char* line : {"#SBATCH --job-name=\"kvbench-my sweep\"\n", "#SBATCH --chdir=\"/lab/my project\"\n",
                           "#SBATCH --output=\"/lab/runs/s 2/logs/shard-%a.log\"\n", "#SBATCH --array=0-2\n"})
    CHECK(quoted.find(line) != std::string::npos);
}

namespace {

// Stand-in Slurm commands in a directory put first on PATH for the test's process (each test case
// runs in a process of its own): each logs its arguments and answers from a file the test writes.
class FakeSlurm {
 public:
  explicit FakeSlurm(const TempDir& dir) : bin_(dir / "bin"), log_(dir / "calls.log") {
    fs::create_directories(bin_);
    old_path_ = std::getenv("PATH") ? std::getenv("PATH") : "";
    setenv("PATH", (bin_.string() + ":" + old_path_).c_str(), 1);
  }
  ~FakeSlurm() { setenv("PATH", old_path_.c_str(), 1); }
  // A program that logs "name args", prints `out` (to stderr with `status` != 0) and exits `status`.
  void program(const std::string& name, const std::string& out, int status = 0) const {
    const fs::path p = bin_ / name;
    std::ofstream(p) << "#!/bin/sh\necho \"" << name << " $*\" >> '" << log_.string() << "'\ncat <<'EOF'"
                     << (status ? " >&2" : "") << "\n"
                     << out << "\nEOF\nexit " << status << "\n";
    fs::permissions(p, fs::perms::owner_all);
  }
  std::string calls() const {
    std::ifstream in(log_);
    return {std::istreambuf_iterator<char>(in), {}};
  }

 private:
  fs::path bin_, log_;
  std::string old_path_;
};

std::string spec_file(const TempDir& dir, const std::string& model, const std::string& methods) {
  const std::string path = (dir / ("spec-" + std::to_string(methods.size()) + ".yaml")).string();
  std::ofstream(path) << "name: slurm_unit\nmodel: " << model
                      << "\ntask: niah\ntask_options: {s_len: 300, e_len: 400, step: 100, depths: 2, chat: true}\n"
                         "methods: ["
                      << methods << "]\nbudgets: [64]\nout: " << (dir / "single.jsonl").string() << "\n";
  return path;
}

}  // namespace

TEST_CASE("submit, status and resume through stand-in Slurm commands and refusals naming the directory", "[slurm]") {
  const auto model = model_file(kDefaultModel);
  if (!model || !setup_data("PaulGrahamEssays")) return;
  const TempDir dir("slurm");
  const FakeSlurm slurm(dir);
  const std::string spec = spec_file(dir, *model, "fullkv, snapkv");
  const std::string runs = (dir / "runs").string();
  SlurmOptions o;
  o.array = 3;

  // No sbatch anywhere: a clear refusal, and nothing written.
  {
    const char* path = std::getenv("PATH");
    const std::string saved = path;
    setenv("PATH", (dir / "bin").c_str(), 1);
    require_error([&] { slurm_submit(spec, runs, o, KVBENCH_CLI, false); }, {"sbatch not found on PATH", "--dry-run"});
    setenv("PATH", saved.c_str(), 1);
    CHECK_FALSE(fs::exists(runs));
  }
  // sbatch rejects the job: its own message comes through.
  slurm.program("sbatch", "sbatch: error: invalid partition specified: nope", 1);
  require_error([&] { slurm_submit(spec, runs, o, KVBENCH_CLI, false); },
                {"sbatch rejected", "job.sbatch", "invalid partition specified: nope"});
  CHECK_FALSE(fs::exists(fs::path(runs) / "submit.json"));

  slurm.program("sbatch", "42");
  slurm_submit(spec, runs, o, KVBENCH_CLI, false);
  CHECK(slurm.calls().find("sbatch --parsable " + runs + "/job.sbatch") != std::string::npos);
  const auto m = nlohmann::json::parse(std::ifstream(fs::path(runs) / "submit.json"));
  CHECK(m["shards"] == 3);
  CHECK(m["cells"] == 8);  // 4 samples x 2 configurations
  CHECK(m["version"] == code_version());
  REQUIRE(m["jobs"].size() == 1);
  CHECK(m["jobs"][0]["id"] == "42");
  CHECK(fs::exists(fs::path(runs) / "spec.yaml"));

  // The same spec again, another spec, and results files without a manifest: refused.
  require_error([&] { slurm_submit(spec, runs, o, KVBENCH_CLI, false); }, {"already holds this sweep", "--resume"});
  const std::string other = spec_file(dir, *model, "fullkv, streamingllm, snapkv");
  require_error([&] { slurm_submit(other, runs, o, KVBENCH_CLI, false); },
                {runs, "holds the results of another sweep", "another --dir"});
  fs::create_directories(dir / "stray");
  std::ofstream(dir / "stray" / "old.jsonl") << "";
  require_error([&] { slurm_submit(spec, (dir / "stray").string(), o, KVBENCH_CLI, false); },
                {"old.jsonl", "no submit.json"});
  fs::create_directories(dir / "stray_gz");
  std::ofstream(dir / "stray_gz" / "old.jsonl.gz") << "";
  require_error([&] { slurm_submit(spec, (dir / "stray_gz").string(), o, KVBENCH_CLI, false); },
                {"old.jsonl.gz", "no submit.json"});

  // Shard 1 ran to completion (its cells recorded as the real task would), task 2 was cancelled,
  // task 0 still runs: resume resubmits shard 2 alone.
  ExperimentSpec part = load_experiment(spec);
  part.out = (fs::path(runs) / "shard-1.jsonl").string();
  const SweepOutcome done = Sweep(part, parse_shard("1/3")).run(false);
  CHECK(done.run > 0);
  // Found by an audit: Slurm not answering counted every task as ended, so resume would submit running
  // shards a second time.
  slurm.program("scontrol", "slurm_load_jobs error: Unable to contact slurm controller (connect failure)", 1);
  require_error([&] { slurm_resume(runs, false); }, {"cannot ask Slurm", "no answer"});
  // A job scontrol has forgotten, on a cluster without accounting (sacct fails on every job): ended.
  slurm.program("scontrol", "slurm_load_jobs error: Invalid job id specified", 1);
  slurm.program("sacct", "sacct: error: Slurm accounting storage is disabled", 1);
  CHECK_NOTHROW(slurm_resume(runs, true));
  fs::remove(dir / "bin" / "sacct");
  slurm.program("scontrol",
                "JobId=43 ArrayJobId=42 ArrayTaskId=0 JobState=RUNNING\n"
                "JobId=44 ArrayJobId=42 ArrayTaskId=1 JobState=COMPLETED\n"
                "JobId=45 ArrayJobId=42 ArrayTaskId=2 JobState=CANCELLED");
  slurm.program("sbatch", "46");
  slurm_status(runs);  // prints; what it concluded shows in what resume does
  slurm_resume(runs, false);
  CHECK(slurm.calls().find("sbatch --parsable --array=2 " + runs + "/job.sbatch") != std::string::npos);
  const auto m2 = nlohmann::json::parse(std::ifstream(fs::path(runs) / "submit.json"));
  REQUIRE(m2["jobs"].size() == 2);
  CHECK(m2["jobs"][1]["tasks"] == nlohmann::json::array({2}));
}

TEST_CASE("a results file has one writer at a time", "[slurm]") {
  const TempDir dir("lock");
  const std::string path = (dir / "r.jsonl").string();
  auto first = std::make_unique<ResultsFile>(path);
  require_error([&] { ResultsFile second(path); }, {path, "another kvbench process is writing"});
  first.reset();
  ResultsFile again(path);  // free once the first closes
}

TEST_CASE("run_process: arguments as given, both outputs, exit status", "[slurm]") {
  const auto r = run_process({"sh", "-c", "printf '%s|' \"$@\"; echo oops >&2; exit 3", "sh", "a b", "'c'"});
  CHECK(r.out == "a b|'c'|");
  CHECK(r.err == "oops\n");
  CHECK(r.exit_code == 3);
  CHECK(run_process({"cat"}, std::string(200000, 'x')).out.size() == 200000);  // more than a pipe holds
  require_error([] { run_process({"kvbench-no-such-program"}); }, {"kvbench-no-such-program", "not found on PATH"});
}
