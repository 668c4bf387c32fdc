#!/usr/bin/env bash
# The CUDA checks and the GPU benchmarks of results/gpu/, on a machine with an NVIDIA GPU:
#   scripts/gpu_bench.sh [BIN_DIR] [OUT_DIR] [LAYERS]
# BIN_DIR holds kvbench and kvbench_tests (default build/, build/tests/); OUT_DIR receives the test
# log and the bench tables (default results/gpu/run); LAYERS keeps that many of Llama-3.1-8B's 32
# layers in the random-weight model (default 32: the whole model, 16 GB of bf16 weights).
# A baseline binary at BIN_DIR/kvbench_base, when present, is benchmarked on the same model and card.
set -euo pipefail
bin=${1:-build}
out=${2:-results/gpu/run}
layers=${3:-32}
kvbench=$bin/kvbench
tests=$bin/kvbench_tests
[[ -x $tests ]] || tests=$bin/tests/kvbench_tests
mkdir -p "$out"
model=${TMPDIR:-/tmp}/kvbench-l8b-${layers}l.gguf

nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader | tee "$out/gpu.txt"
echo "== CUDA tests"
KVBENCH_REQUIRE_GPU=1 "$tests" "[cuda]" 2>&1 | tee "$out/tests.txt" | tail -5
echo "== model: Llama-3.1-8B shapes, $layers layers, random bf16 weights"
[[ -f $model ]] || "$kvbench" make-model llama3-8b --type bf16 --layers "$layers" -o "$model"
bench() {
  local name=$1
  shift
  echo "== $name: kvbench bench $*"
  "$@" | tee "$out/$name.md"
}
bench l8b_bench "$kvbench" bench "$model" --backend cuda -c 4096 -c 32768 -r 3 --decode-tokens 32 \
  --method snapkv --budget 128
# 128K: the model's whole context less room for a few decode steps.
bench l8b_128k "$kvbench" bench "$model" --backend cuda -c 130944 -r 1 --decode-tokens 8
if [[ -x $bin/kvbench_base ]]; then
  bench l8b_bench_base "$bin/kvbench_base" bench "$model" --backend cuda -c 4096 -c 32768 -r 3 --decode-tokens 32
fi
