#!/usr/bin/env bash
# Builds the libFuzzer targets (clang, ASan + UBSan) and runs each for SECONDS (default 120) from the
# seeds make_fuzz_seeds writes, keeping what each run found in fuzz/corpus/<target>/. Prints the runs
# per target; a crash, sanitizer report, leak or hang stops that target and leaves its input in
# fuzz/crash-*, to be added as a regression test.
#   fuzz/run.sh [SECONDS] [TARGET...]
set -euo pipefail
cd "$(dirname "$0")/.."
seconds=${1:-120}
shift || true
targets=("$@")
[ ${#targets[@]} -gt 0 ] || targets=(gguf safetensors spec results tokenizer_json config longbench longbench_pred ruler)

if [ ! -f build-fuzz/build.ninja ]; then
  cmake -S . -B build-fuzz -G Ninja -DCMAKE_BUILD_TYPE=RelWithDebInfo -DCMAKE_CXX_COMPILER=clang++ \
    -DCMAKE_C_COMPILER=clang -DKVBENCH_FUZZ=ON -DKVBENCH_TESTS=OFF -DKVBENCH_CUDA=OFF >/dev/null
fi
ninja -C build-fuzz make_fuzz_seeds "${targets[@]/%/_fuzz}"
seeds=$(mktemp -d)
trap 'rm -rf "$seeds"' EXIT
build-fuzz/fuzz/make_fuzz_seeds "$seeds"

export LSAN_OPTIONS=suppressions=$PWD/fuzz/lsan.supp
status=0
for t in "${targets[@]}"; do
  mkdir -p "fuzz/corpus/$t"
  [ -d "$seeds/$t" ] || { echo "$t: no seeds (the safetensors target starts from nothing)"; mkdir -p "$seeds/$t"; }
  log=$(mktemp)
  # -close_fd_mask=1: the report target prints tables to stdout.
  if build-fuzz/fuzz/${t}_fuzz "fuzz/corpus/$t" "$seeds/$t" -max_total_time="$seconds" -timeout=30 \
      -rss_limit_mb=4096 -max_len=65536 -close_fd_mask=1 -artifact_prefix="fuzz/crash-$t-" >"$log" 2>&1; then
    printf '%-15s %s\n' "$t" "$(grep -o 'Done [0-9]* runs in [0-9]* second(s)' "$log" || tail -1 "$log")"
  else
    status=1
    printf '%-15s FAILED, log kept at %s:\n' "$t" "$log"
    grep -m1 -A12 'ERROR\|==ERROR\|runtime error\|deadly signal\|timeout' "$log" || tail -20 "$log"
    continue
  fi
  rm -f "$log"
done
exit $status
