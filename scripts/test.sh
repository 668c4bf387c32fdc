#!/usr/bin/env bash
# The test command: set-up (idempotent: packages, build, model files), then every test through ctest.
# Tests that need the model files fail rather than skip here, since set-up has just fetched them.
set -euo pipefail
cd "$(dirname "$0")/.."
scripts/setup.sh
export KVBENCH_REQUIRE_MODELS=1
# Serial: every test process already uses all cores (OpenMP, BLAS); running several at once
# oversubscribes them and spinning threads make the model tests many times slower.
ctest --test-dir "${KVBENCH_BUILD:-build}" --output-on-failure "$@"
