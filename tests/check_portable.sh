#!/usr/bin/env bash
# The portable build's promise: outside the functions chosen at run time (multi-versioned clones,
# whose names carry their target, and the target-attributed AVX2 kernels named *_avx2), the binary
# uses no AVX registers, so it starts and runs on any x86-64-v2 processor. Lists the offenders.
#   check_portable.sh BINARY
set -euo pipefail
objdump -d --no-show-raw-insn -C "$1" | awk '
  /^[0-9a-f]+ <.*>:$/ { fn = substr($0, index($0, "<") + 1); sub(/>:$/, "", fn); next }
  /%[yz]mm[0-9]/ {
    if (fn ~ /avx2|avx512|\[clone \.(avx2|avx512f)/) next
    if (!(fn in seen)) { seen[fn] = 1; bad[++n] = fn }
  }
  END {
    for (i = 1; i <= n; ++i) print "uses AVX outside run-time dispatch: " bad[i]
    exit n > 0
  }'
