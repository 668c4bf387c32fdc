"""Shared plumbing of the reference scripts that check kvbench's kept widths on real NIAH prompts:
the command-line arguments, `kvbench dump-prefill` for one prompt and method, its per-layer tensors,
and the FNV-1a 64 hash the C++ fixture tests compare."""
import json
import os
import subprocess

import numpy as np


def fnv1a(text):
    h = 0xCBF29CE484222325
    for b in text.encode():
        h = ((h ^ b) * 0x100000001B3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def row_hashes(widths):
    """One hash per head of its comma-joined widths."""
    return [fnv1a(",".join(map(str, row))) for row in widths.tolist()]


def add_arguments(ap, work, out, lengths):
    ap.add_argument("--kvbench", default="build/kvbench")
    ap.add_argument("--model", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--work", default=work)
    ap.add_argument("--out", default=out)
    ap.add_argument("--lengths", default=",".join(map(str, lengths)), help="NIAH prompt lengths")


def dump_niah(args, work, length, layers, window, method, budget, params):
    """Sample 1 of NIAH at `length` tokens (needle at 50%, chat template), dumped at `layers` with the
    widths `method` kept at KV size `budget`; returns meta.json."""
    cmd = [args.kvbench, "dump-prefill", "niah", "-m", args.model, "-o", f"s_len={length}", "-o", f"e_len={length}",
           "-o", "depths=3", "-o", "chat=true", "-i", "1", "--layers", ",".join(map(str, layers)),
           "--window", str(window), "--method", method, "--budget", str(budget), "--out", work]
    for kv in params.items():
        cmd += ["--param", "=".join(kv)]
    subprocess.run(cmd, check=True, capture_output=True)
    with open(os.path.join(work, "meta.json")) as f:
        return json.load(f)


def load_layer(work, layer):
    """k, v, window queries and kvbench's widths of one dumped layer."""
    return tuple(np.load(os.path.join(work, f"layer{layer}.{n}.npy")) for n in ("k", "v", "q_window", "widths"))
