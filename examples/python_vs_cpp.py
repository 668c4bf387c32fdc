"""What a method written in Python costs against the same method in C++: StreamingLLM in numpy
(kept sets identical to the C++ one, tested) and the C++ streamingllm, each in a sweep of its own over
the same Needle-in-a-Haystack cells of the default model. Prints cells/s of each sweep and the time in
compress() per layer (records' compress_seconds / layers), and writes them as Markdown.

    PYTHONPATH=build/python python3 examples/python_vs_cpp.py [OUT.md]

(StreamingLLM in numpy is examples/streaming.py.)
"""
import os
import platform
import sys
import tempfile
import time

import kvbench

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from streaming import Streaming  # noqa: E402

root = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))
model = os.path.join(root, "models", "SmolLM2-135M-Instruct.Q4_1.gguf")


kvbench.register(Streaming, name="numpy_streaming")
layers = kvbench.Model(model).config["n_layers"]
rows = []
with tempfile.TemporaryDirectory() as d:
    for method in ("streamingllm", "numpy_streaming"):
        spec = {"name": method, "model": model, "task": "niah",
                "task_options": {"s_len": 1000, "e_len": 4000, "step": 1500, "depths": 5, "chat": True},
                "methods": [method], "budgets": [64, 128], "out": os.path.join(d, f"{method}.jsonl")}
        t = time.perf_counter()
        r = kvbench.run(spec, progress=False)
        wall = time.perf_counter() - t
        df = kvbench.load_results(spec["out"])
        per_layer = df["compress_seconds"].mean() / layers
        rows.append((method, r["run"], wall, r["run"] / wall, 1e3 * per_layer, df["score"].mean() * 100))

lines = ["| method | cells | wall s | cells/s | compress ms per layer | score |", "| --- | --- | --- | --- | --- | --- |"]
lines += [f"| {m} | {n} | {w:.1f} | {c:.3f} | {p:.3f} | {s:.2f} |" for m, n, w, c, p, s in rows]
(_, _, _, c_cpp, p_cpp, _), (_, _, _, c_py, p_py, _) = rows
lines += ["", f"Python method vs C++: {c_py / c_cpp:.3f}x the cells/s; {p_py - p_cpp:.3f} ms more per layer "
              f"({layers} layers, {platform.processor() or platform.machine()}, {os.cpu_count()} cores)."]
text = "\n".join(lines)
print(text)
if len(sys.argv) > 1:
    with open(sys.argv[1], "w") as f:
        f.write(text + "\n")
