#!/usr/bin/env bash
# Every spec of experiments/papers/ on the default model: its --dry-run (first samples) lists its cells (its published
# rows checked against them), or fails with the error the spec must give here (a context the 8K model
# lacks, DynaKV weights not trained for it); then scripts/paper_tables.sh all --smoke runs every paper
# whose methods can run and writes each table's side-by-side report.
#   tests/papers/test_paper_specs.sh build/kvbench
set -euo pipefail
cd "$(dirname "$0")/../.."
ROOT=$(pwd)
KVBENCH=$(realpath "${1:?usage: test_paper_specs.sh KVBENCH}")
MODEL=${KVBENCH_MODELS:-$ROOT/models}/SmolLM2-135M-Instruct.Q4_1.gguf
DATA=${KVBENCH_DATA:-$ROOT/data}
if [[ ! -f $MODEL || ! -d $DATA/PaulGrahamEssays ]]; then
  [[ ${KVBENCH_REQUIRE_MODELS:-0} == 1 ]] && { echo "missing $MODEL or $DATA (run scripts/setup.sh)"; exit 1; }
  echo "skipped: $MODEL or $DATA/PaulGrahamEssays is absent (run scripts/setup.sh)"
  exit 0
fi
tmp=$(mktemp -d "${TMPDIR:-/tmp}/kvb_papers_XXXXXX")
trap 'rm -rf "$tmp"' EXIT
# The set-up's data (haystacks, word lists) with the tiny LongBench and RULER QA fixtures in place of
# the benchmark files, the mc and gsm8k tasks' made-up samples, and essay text for the perplexity files.
mkdir -p "$tmp/data/perplexity"
for e in "$DATA"/*; do
  case $(basename "$e") in longbench|ruler|mc|gsm8k|perplexity) ;; *) ln -s "$e" "$tmp/data/"; esac
done
ln -s "$ROOT/tests/fixtures/papers/data/longbench" "$ROOT/tests/fixtures/papers/data/ruler" "$tmp/data/"
ln -s "$ROOT/tasks/mc/fixtures" "$tmp/data/mc"
ln -s "$ROOT/tasks/gsm8k/fixtures" "$tmp/data/gsm8k"
# (head on a file: in a pipe it would stop cat early, and pipefail would end the script)
cat "$DATA"/PaulGrahamEssays/*.txt > "$tmp/essays.txt"
for text in wikitext2 c4 pg19; do head -c 30000 "$tmp/essays.txt" > "$tmp/data/perplexity/$text.txt"; done

fail=0
for spec in experiments/papers/*/*.yaml; do
  if out=$("$KVBENCH" run "$spec" --model "$MODEL" --set backend=cpu --set "data=$tmp/data" --set limit=1 --dry-run 2>&1); then
    cells=$(tail -1 <<< "$out")
    if [[ $cells =~ ^[0-9]+\ cells ]]; then echo "ok   $spec: ${cells%%:*}"; else echo "FAIL $spec: $cells"; fail=1; fi
  elif grep -q "has a context of 8192 tokens; this table needs a model with a longer context" <<< "$out"; then
    echo "ok   $spec: refused, needs more than the model's 8K context"
  elif grep -q "no such dynakv artifact" <<< "$out" && grep -q "name: dynakv" "$spec"; then
    echo "ok   $spec: refused, DynaKV weights are not trained for this model"
  elif grep -q "no field 'key_maps'" <<< "$out" && grep -q "approximate: keys" "$spec"; then
    echo "ok   $spec: refused, the model's VECTOR maps predate the key maps (kvbench calibrate vector)"
  elif grep -q "no such matryoshkakv artifact" <<< "$out" && grep -q "name: matryoshkakv" "$spec"; then
    echo "ok   $spec: refused, MatryoshkaKV projections are not trained for this model"
  elif grep -q "does not divide the 576 channels" <<< "$out" && grep -q "name: atom" "$spec"; then
    echo "ok   $spec: refused, Atom's groups of 128 do not divide the model's 576 channels (the smoke runs 64)"
  elif grep -q "no such palu basis" <<< "$out" && grep -q "name: palu" "$spec"; then
    echo "ok   $spec: refused, no Palu basis calibrated for this model (kvbench calibrate palu)"
  else
    echo "FAIL $spec: $(tail -1 <<< "$out")"
    fail=1
  fi
done

# The smoke calibrates its own Palu basis and Atom GPTQ weights and must leave the user's artifacts as they
# were: here an artifacts folder whose palu/ and atom-gptq/ hold only a marker file.
mkdir -p "$tmp/artifacts/palu" "$tmp/artifacts/atom-gptq"
for d in "${KVBENCH_ARTIFACTS:-$ROOT/artifacts}"/*; do
  case $(basename "$d") in palu|atom-gptq) ;; *) [[ -e $d ]] && ln -s "$(realpath "$d")" "$tmp/artifacts/" ;; esac
done
touch "$tmp/artifacts/palu/marker" "$tmp/artifacts/atom-gptq/marker"
KVBENCH_ARTIFACTS=$tmp/artifacts KVBENCH=$KVBENCH scripts/paper_tables.sh all --smoke --data "$tmp/data" \
  --out "$tmp/out" || fail=1
for own in palu atom-gptq; do
  if [[ $(ls "$tmp/artifacts/$own") == marker ]]; then
    echo "ok   smoke: the user's artifacts/$own is untouched"
  else
    echo "FAIL smoke: wrote into the user's artifacts/$own: $(ls "$tmp/artifacts/$own" | tr '\n' ' ')"
    fail=1
  fi
done
for spec in experiments/papers/*/*.yaml; do
  grep -q 'name: dynakv' "$spec" && continue
  grep -q 'approximate: keys' "$spec" && continue
  paper=$(basename "$(dirname "$spec")") table=$(basename "$spec" .yaml)
  report=$tmp/out/reports/papers-smoke/$paper/$table/compare-$table.md
  if [[ -s $report ]] && grep -q ", published |" "$report"; then
    echo "ok   smoke $paper/$table: $(grep -c "" "$tmp/out/runs/papers-smoke/$paper/$table.jsonl") cells, report written"
  else
    echo "FAIL smoke $paper/$table: no side-by-side report at $report"
    fail=1
  fi
done
exit $fail
