#!/usr/bin/env bash
# The main job on the default model: Needle-in-a-Haystack at 1K and 2K tokens x 5 depths with the full
# cache and with SnapKV at KV size 128, then the heatmaps. Results resume if interrupted.
set -euo pipefail
cd "$(dirname "$0")/.."
MODEL=${MODEL:-models/SmolLM2-135M-Instruct.Q4_1.gguf}
GRID=(-o s_len=1000 -o e_len=2000 -o step=1000 -o depths=5 -o chat=true)
build/kvbench run-task niah --model "$MODEL" "${GRID[@]}" --out runs/quickstart-niah.jsonl
build/kvbench run-task niah --model "$MODEL" "${GRID[@]}" --method snapkv --budget 128 --out runs/quickstart-niah.jsonl
build/kvbench report niah runs/quickstart-niah.jsonl --out-dir reports/quickstart
