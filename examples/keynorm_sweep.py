"""A small Needle-in-a-Haystack sweep of the Python key-norm method beside SnapKV and StreamingLLM on
the default model, then the report's tables and heatmaps:

    PYTHONPATH=build/python:examples python3 examples/keynorm_sweep.py [OUT_DIR]
"""
import os
import subprocess
import sys

import kvbench

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
out = sys.argv[1] if len(sys.argv) > 1 else os.path.join(root, "runs", "keynorm")
spec = {
    "name": "keynorm_niah",
    "model": os.path.join(root, "models", "SmolLM2-135M-Instruct.Q4_1.gguf"),
    "task": "niah",
    "task_options": {"s_len": 1000, "e_len": 2000, "step": 1000, "depths": 3, "chat": True},
    "methods": ["fullkv", "python:keynorm.KeyNorm", "snapkv", "streamingllm"],
    "budgets": [64, 128],
    "out": os.path.join(out, "records.jsonl"),
}
r = kvbench.run(spec)
print(f"{r['run']} cells run, {r['already']} already recorded, {r['failed']} failed")
df = kvbench.load_results(spec["out"])
print(df.groupby(["config.method", "config.budget"])["score"].mean().mul(100).round(1).to_string())
cli = os.path.join(root, "build", "kvbench")
if os.path.exists(cli):
    subprocess.run([cli, "report", spec["out"], "--out-dir", os.path.join(out, "report")], check=True)
