#!/usr/bin/env bash
# The checkout stays light enough to copy whole to a GPU machine with the built binaries and their
# libraries beside it: the tracked files within a budget, and committed result records compressed
# (gzip -9n; every reader takes .jsonl.gz). Skipped (exit 77) outside a git checkout.
set -euo pipefail
cd "$(dirname "$0")/.."
git rev-parse --is-inside-work-tree > /dev/null 2>&1 || { echo "not a git checkout; skipped"; exit 77; }
# 44 MiB: with the binaries and their libraries packed by scripts/gpu_bundle.sh (about 15 MB) the whole
# copy stays under the 64 MiB a lent GPU machine receives in one call.
budget_mib=${KVBENCH_TREE_BUDGET_MIB:-44}
plain=$(git ls-files 'results/*.jsonl' 'results/**/*.jsonl')
if [[ -n $plain ]]; then
  echo "committed records must be gzip-compressed (gzip -9n FILE, then commit FILE.gz):" >&2
  echo "$plain" >&2
  exit 1
fi
# (A file deleted in the working tree but not yet in the index counts nothing.)
bytes=$({ git ls-files -z | xargs -0 stat -c %s 2> /dev/null || true; } | awk '{s += $1} END {print s + 0}')
mib=$(awk -v b="$bytes" 'BEGIN {printf "%.1f", b / 1048576}')
if awk -v b="$bytes" -v m="$budget_mib" 'BEGIN {exit !(b > m * 1048576)}'; then
  echo "the tracked files hold $mib MiB, over the $budget_mib MiB budget; the largest:" >&2
  git ls-files -z | xargs -0 stat -c '%s %n' | sort -rn | head -10 >&2
  exit 1
fi
echo "tracked files: $mib MiB of $budget_mib; committed records compressed"
