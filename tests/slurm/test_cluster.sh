#!/usr/bin/env bash
# The Slurm path end to end on a real cluster: a private single-node Slurm (cluster.sh) started and
# stopped here, a small sweep of the default model submitted as a 4-task array, waited for and
# merged, then compared record for record with a single-process run of the same spec; one task
# cancelled mid-run, seen by `kvbench status` and finished by `submit --resume`; and the refusals
# (no sbatch, an sbatch rejection, a directory of another spec).
#   tests/slurm/test_cluster.sh KVBENCH     (from the repository root; exit 77: skipped)
set -euo pipefail
KVBENCH=$(realpath "${1:?usage: test_cluster.sh KVBENCH}")
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
HERE=$ROOT/tests/slurm
MODEL=${KVBENCH_MODELS:-$ROOT/models}/SmolLM2-135M-Instruct.Q4_1.gguf

skip() { echo "SKIP: $*"; exit 77; }
say() { printf '[slurm test %s] %s\n' "$(date +%T)" "$*"; }
die() { printf '[slurm test] FAILED: %s\n' "$*" >&2; exit 1; }
export PATH=$PATH:/usr/sbin
for p in sbatch scontrol slurmctld slurmd munged jq; do
  command -v "$p" >/dev/null || skip "$p not installed (scripts/setup.sh installs slurm-wlm, munge and jq)"
done
[[ -f $MODEL ]] || skip "$MODEL absent (scripts/setup.sh)"

T=$(mktemp -d /tmp/kvb_slurm_cluster_XXXXXX)
trap '"$HERE/cluster.sh" stop "$T/cluster" || true; rm -rf "$T"' EXIT
SLURM_CONF=$("$HERE/cluster.sh" start "$T/cluster") || die "the cluster did not start"
export SLURM_CONF
say "cluster up ($SLURM_CONF)"

cat > "$T/spec.yaml" <<EOF
name: slurm_e2e
model: $MODEL
task: niah
task_options: {s_len: 400, e_len: 800, step: 400, depths: 3, chat: true}
methods: [fullkv, streamingllm, snapkv]
budgets: [64]
threads: 1
out: $T/single.jsonl
EOF

# Waits until no task of the cluster is queued or running (at most 10 minutes).
wait_idle() {
  for _ in $(seq 1200); do
    [[ -z $(squeue -h -o %i) ]] && return 0
    sleep 0.5
  done
  squeue; die "jobs still queued or running after 10 minutes"
}
# A record without what differs between two runs of the same cell: times and the process's peak memory.
normalized() { jq -c 'del(.prefill_seconds, .decode_seconds, .compress_seconds, .wall_seconds, .peak_memory_bytes)' "$@" | sort; }

# 1. The sweep as a 4-task array, merged, equals one process's run cell for cell.
t0=$(date +%s.%N)
"$KVBENCH" submit --slurm "$T/spec.yaml" --dir "$T/run" --array 4
wait_idle
t1=$(date +%s.%N)
"$KVBENCH" status "$T/run" | tee "$T/status.txt"
grep -q '^complete' "$T/status.txt" || die "status does not call the finished sweep complete"
"$KVBENCH" report "$T/run" --out-dir "$T/report" 2> "$T/report.err" || { cat "$T/report.err"; die "report failed"; }
grep -q "repeat a cell" "$T/report.err" && die "the merged shards repeat cells"
# The same four shards as four local processes at once: what the Slurm path adds on top.
t2=$(date +%s.%N)
for i in 0 1 2 3; do "$KVBENCH" run "$T/spec.yaml" --shard "$i/4" --out "$T/local-$i.jsonl" 2>/dev/null >/dev/null & done
wait
t3=$(date +%s.%N)
"$KVBENCH" run "$T/spec.yaml" 2>/dev/null
normalized "$T"/run/shard-*.jsonl > "$T/merged.txt"
normalized "$T/single.jsonl" > "$T/single.txt"
[[ $(wc -l < "$T/single.txt") == 18 ]] || die "the single-process run has $(wc -l < "$T/single.txt") records, not 18"
cmp -s "$T/merged.txt" "$T/single.txt" || { diff "$T/merged.txt" "$T/single.txt" | head -5; die "merged shards differ from the single-process run"; }
say "4-task array == single process, 18 cells: slurm $(awk "BEGIN{printf \"%.1f\", $t1 - $t0}") s, the same 4 shards as local processes $(awk "BEGIN{printf \"%.1f\", $t3 - $t2}") s"

# 2. A task cancelled mid-run: status shows it, resume finishes it, the report has each cell once.
"$KVBENCH" submit --slurm "$T/spec.yaml" --dir "$T/run2" --array 4 | tee "$T/submit.txt"
job=$(grep -o 'submitted job [0-9]*' "$T/submit.txt" | awk '{print $3}')
for _ in $(seq 600); do [[ -s $T/run2/shard-1.jsonl ]] && break; sleep 0.2; done
[[ -s $T/run2/shard-1.jsonl ]] || die "shard 1 recorded nothing in 2 minutes"
scancel "${job}_1"
for _ in $(seq 100); do scontrol -o show job "$job" | grep -q 'ArrayTaskId=1 .*JobState=CANCELLED' && break; sleep 0.1; done
"$KVBENCH" status "$T/run2" | tee "$T/status2.txt"
grep -Eq '^ +1 +6 +[0-9]+ +0 +[1-5] +CANCELLED' "$T/status2.txt" || die "status does not show shard 1 cancelled with cells failed"
"$KVBENCH" submit --slurm --resume "$T/run2" | tee "$T/resume.txt"
grep -q "shards 1 of 4" "$T/resume.txt" || die "resume did not resubmit shard 1 alone"
wait_idle
"$KVBENCH" status "$T/run2" | grep -q '^complete' || die "not complete after resume"
[[ -z $(cat "$T"/run2/shard-*.jsonl | jq -r .key | sort | uniq -d) ]] || die "a cell is recorded twice"
normalized "$T"/run2/shard-*.jsonl | cmp -s - "$T/single.txt" || die "the resumed sweep differs from the single-process run"
"$KVBENCH" report "$T/run2" --out-dir "$T/report2" 2> "$T/report2.err"
grep -q "repeat a cell" "$T/report2.err" && die "the resumed shards repeat cells"
say "cancelled task seen by status and finished by resume; 18 cells, each once"

# 3. A dry run submits nothing: its shards are pending, not failed.
"$KVBENCH" submit --slurm "$T/spec.yaml" --dir "$T/dry" --dry-run > /dev/null
"$KVBENCH" status "$T/dry" | tee "$T/status3.txt"
grep -q "cells failed" "$T/status3.txt" && die "status calls a dry run's cells failed"
grep -q "in shards never submitted" "$T/status3.txt" || die "status does not say the dry run's shards were never submitted"
say "a dry run's shards: pending, never submitted"

# 4. Refusals, each naming what is wrong.
expect_error() {  # expect_error FRAGMENT COMMAND...
  local frag=$1; shift
  if "$@" > "$T/out.txt" 2>&1; then die "expected an error from: $*"; fi
  grep -q -- "$frag" "$T/out.txt" || { cat "$T/out.txt"; die "the error does not say '$frag'"; }
}
expect_error "sbatch not found on PATH" env PATH=/nonexistent "$KVBENCH" submit --slurm "$T/spec.yaml" --dir "$T/e1"
expect_error "invalid partition" "$KVBENCH" submit --slurm "$T/spec.yaml" --dir "$T/e2" --partition no-such-partition
sed 's/budgets: \[64\]/budgets: [32]/' "$T/spec.yaml" > "$T/other.yaml"
expect_error "holds the results of another sweep" "$KVBENCH" submit --slurm "$T/other.yaml" --dir "$T/run"
say "refusals: no sbatch, sbatch rejection, another spec's directory"
say "passed in $(( $(date +%s) - ${t0%.*} )) s"
