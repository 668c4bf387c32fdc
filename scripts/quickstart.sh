#!/usr/bin/env bash
# The main job on the default model: experiments/quickstart.yaml (Needle-in-a-Haystack, the full cache
# and the baseline methods at two KV sizes), then its tables and heatmaps. Rerunning resumes.
set -euo pipefail
cd "$(dirname "$0")/.."
build/kvbench run experiments/quickstart.yaml
build/kvbench report runs/quickstart.jsonl --out-dir reports/quickstart --format md,csv,tex
echo "tables: reports/quickstart/summary.md, niah-method-budget.md (and .csv, .tex); heatmaps: reports/quickstart/niah-*.png (.svg, .csv)"
