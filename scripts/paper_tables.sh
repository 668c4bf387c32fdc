#!/usr/bin/env bash
# Regenerates the papers' tables: runs the specs of experiments/papers/<paper>/ (one per published table)
# and writes, per table, the report with our numbers beside the published ones.
#
#   scripts/paper_tables.sh PAPER|all --model PATH [--data DIR] [--backend cpu|cuda] [--shard i/N]
#   scripts/paper_tables.sh PAPER|all --smoke [--data DIR] [--out DIR]
#   scripts/paper_tables.sh coverage          (kvbench report --coverage: printed cells regenerable, blockers)
#
# PAPER is a directory of experiments/papers (mixeddimkv, headkv, pyramidkv, kvcrush, vector, kvmix, dynakv).
# Results go to runs/papers/<paper>/<table>.jsonl (resumable: rerun to finish), reports to
# reports/papers/<paper>/<table>/ (--out DIR: DIR/runs/... and DIR/reports/...) (compare-<table>.md/.csv/.tex/.png beside the usual tables). With
# --shard i/N only that share of each spec's cells runs (one job of N; run the reports once all are done
# with --report-only).
#
# --smoke proves every paper's pipeline end to end in minutes on the default model (SmolLM2-135M, CPU):
# the first sample of three of each LongBench table's datasets (its first, middle and last that --data
# holds), prompts cut to 1,024 tokens, four RULER tasks (single and multi-value needles, variable
# tracking, frequent words) at 1,024 tokens, NIAH at one length, one perplexity window of 256 tokens, at most
# 8 new tokens. Its numbers mean nothing; it writes to runs/papers-smoke/ and reports/papers-smoke/. DynaKV's
# specs need weights trained per model (kvbench train dynakv), so the smoke skips them, as it skips VECTOR's
# K-only table (the committed maps of the default model predate the key maps); Palu's rows get a basis
# calibrated on 8,192 tokens of set-up's text (kvbench calibrate palu), beside the artifacts the repository
# carries, and Atom's rows groups of 64 channels with GPTQ weights calibrated on as many tokens.
set -euo pipefail
cd "$(dirname "$0")/.."
ROOT=$(pwd)

die() { printf '\033[31m[paper_tables] error:\033[0m %s\n' "$*" >&2; exit 1; }
log() { printf '\033[1m[paper_tables]\033[0m %s\n' "$*"; }

paper="" model="" data="" backend="" shard="" smoke=0 report_only=0 out_root=
KVBENCH=${KVBENCH:-$ROOT/build/kvbench}
while (($#)); do
  case $1 in
    --model) model=${2:?--model needs a path}; shift 2 ;;
    --data) data=${2:?--data needs a directory}; shift 2 ;;
    --backend) backend=${2:?--backend needs cpu or cuda}; shift 2 ;;
    --shard) shard=${2:?--shard needs i/N}; shift 2 ;;
    --out) out_root=${2:?--out needs a directory}; shift 2 ;;
    --smoke) smoke=1; shift ;;
    --report-only) report_only=1; shift ;;
    -h|--help) sed -n '2,20p' "$0"; exit 0 ;;
    -*) die "unknown option $1 (see --help)" ;;
    *) [[ -z $paper ]] || die "one PAPER (or all), not '$paper' and '$1'"; paper=$1; shift ;;
  esac
done
[[ -n $paper ]] || die "name a paper (a directory of experiments/papers), all, or coverage"
[[ -x $KVBENCH ]] || die "$KVBENCH not found: build first (scripts/setup.sh)"
[[ $paper == coverage ]] && exec "$KVBENCH" report --coverage experiments/papers
if [[ $paper == all ]]; then
  papers=$(cd experiments/papers && ls -d */ | tr -d /)
else
  [[ -d experiments/papers/$paper ]] || die "no experiments/papers/$paper (papers: $(cd experiments/papers && ls -d */ | tr -d / | xargs))"
  papers=$paper
fi

runs=runs/papers reports=reports/papers
sets=()
if ((smoke)); then
  runs=runs/papers-smoke reports=reports/papers-smoke
  model=${model:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
  backend=${backend:-cpu}
  sets+=(--set limit=1 --set max_new_tokens=8)
fi
if [[ -n $out_root ]]; then runs=$out_root/$runs reports=$out_root/$reports; fi
[[ -n $model ]] || die "--model PATH is required (the model the tables run on; see the spec comments for the papers' models)"
[[ -e $model ]] || die "--model $model: not found"
export MODEL=$model
[[ -n $backend ]] && sets+=(--set "backend=$backend")
[[ -n $data ]] && sets+=(--set "data=$data")

# The LongBench datasets a smoke run can use: those of --data (or data/) that the spec lists, else the
# two small files the tests carry.
smoke_longbench() {
  local spec=$1 dir=${data:-${KVBENCH_DATA:-$ROOT/data}} have=()
  # The flow list after `dataset:` in task_options, over as many lines as it takes.
  for d in $(awk '/^  dataset:/ {on = 1; sub(/^  dataset:/, "")} on {print; if (/]/) exit}' "$spec" | tr '[],' '   '); do
    [[ -f $dir/longbench/$d.jsonl ]] && have+=("$d")
  done
  if ((${#have[@]} == 0)); then
    echo "--set data=$ROOT/tests/fixtures/longbench/data --set task_options.dataset=[qasper,trec]"
  elif ((${#have[@]} <= 3)); then
    echo "--set task_options.dataset=[$(IFS=,; echo "${have[*]}")]"
  else
    local n=${#have[@]}
    echo "--set task_options.dataset=[${have[0]},${have[n / 2]},${have[n - 1]}]"
  fi
}

# A smoke's artifacts: a copy of the artifacts directory (the other methods' files linked), which the runs
# then read. The folders the smoke calibrates into (palu/, atom-gptq/) are its own: linked, its small
# calibrations would replace the ones the user made.
smoke_artifacts() {
  [[ -n ${art_ready:-} ]] && return
  local art own
  art=$(dirname "$runs")/artifacts
  mkdir -p "$art"
  for own in palu atom-gptq; do
    [[ -L $art/$own ]] && rm "$art/$own"
    mkdir -p "$art/$own"
  done
  for d in "${KVBENCH_ARTIFACTS:-$ROOT/artifacts}"/*; do [[ -e $art/$(basename "$d") ]] || ln -s "$(realpath "$d")" "$art/"; done
  export KVBENCH_ARTIFACTS=$art
  art_ready=1
}

# A smoke's Palu basis, calibrated once (kvbench calibrate palu, 8,192 tokens).
smoke_palu_basis() {
  [[ -n ${palu_ready:-} ]] && return
  smoke_artifacts
  log "smoke: Palu basis for $(basename "$model") (kvbench calibrate palu, 8,192 tokens)"
  "$KVBENCH" calibrate palu "$model" -o tokens=8192 ${data:+--data "$data"} > /dev/null
  palu_ready=1
}

# Atom-4bit (KVmix Table 3) on the smoke's model: groups of 64 channels (the default model's 576 do not take
# the paper's 128) and GPTQ weights calibrated once on 8,192 tokens. Sets `atom` to the --set options of the
# spec's atom entries (by their indices in its block list of methods).
smoke_atom() {
  local spec=$1 i found
  found=$(awk '/^methods:/ {on = 1; next} on && /^[^ #]/ {exit} on && /^  - / {n++}
               on && n && /name: *atom *([,}]|$)/ {print n - 1}' "$spec")
  [[ -n $found ]] || die "$spec: no atom entry in its methods list (a block list, one '  - ' per method)"
  if [[ -z ${atom_ready:-} ]]; then
    smoke_artifacts
    log "smoke: Atom's GPTQ weights for $(basename "$model") (kvbench calibrate atom-gptq, 8,192 tokens)"
    "$KVBENCH" calibrate atom-gptq "$model" -o act_group_size=64 -o weight_group_size=64 -o tokens=8192 \
      ${data:+--data "$data"} > /dev/null
    atom_ready=1
  fi
  atom=()
  for i in $found; do
    atom+=(--set "methods.$i.params.act_group_size=64" --set "methods.$i.params.weight_group_size=64")
  done
}

status=0
for p in $papers; do
  for spec in experiments/papers/$p/*.yaml; do
    table=$(basename "$spec" .yaml)
    out=$runs/$p/$table.jsonl
    extra=()
    if ((smoke)); then
      if grep -q 'name: dynakv' "$spec"; then
        log "$p/$table: skipped by the smoke run (DynaKV needs weights trained for the model: kvbench train dynakv)"
        continue
      fi
      if grep -q 'approximate: keys' "$spec"; then
        log "$p/$table: skipped by the smoke run (VECTOR's K-only rows need maps calibrated with key maps)"
        continue
      fi
      grep -q 'name: palu' "$spec" && ((!report_only)) && smoke_palu_basis
      atom=()
      grep -q 'name: atom' "$spec" && ((!report_only)) && smoke_atom "$spec"
      case $(sed -n 's/^task: *//p' "$spec") in
        longbench|longbench-e) read -ra extra <<< "$(smoke_longbench "$spec") --set task_options.max_len=1024" ;;
        ruler) extra=(--set 'task_options.length=[1024]' --set 'task_options.samples=1'
                      --set 'task_options.task=[niah_single_1,niah_multivalue,vt,fwe]') ;;
        niah) extra=(--set task_options.s_len=1000 --set task_options.e_len=1000 --set task_options.depths=2) ;;
        perplexity) extra=(--set task_options.seq_len=256 --set task_options.windows=1) ;;
      esac
      extra+=("${atom[@]}")
    fi
    if ((!report_only)); then
      log "$p/$table: kvbench run $spec${shard:+ --shard $shard}"
      if ! "$KVBENCH" run "$spec" "${sets[@]}" "${extra[@]}" --set "out=$out" ${shard:+--shard "$shard"}; then
        log "$p/$table: failed (see above); going on with the next table"
        status=1
        continue
      fi
    fi
    [[ -n $shard && $report_only == 0 ]] && continue
    [[ -f $out ]] || { log "$p/$table: no results in $out yet"; status=1; continue; }
    log "$p/$table: report -> $reports/$p/$table/"
    mkdir -p "$reports/$p"
    "$KVBENCH" report "$out" --out-dir "$reports/$p/$table" --format md,csv,tex \
      --compare "experiments/papers/$p/published.csv" --table "$table" > "$reports/$p/$table.log" 2>&1 \
      || { cat "$reports/$p/$table.log" >&2; status=1; }
  done
done
exit $status
