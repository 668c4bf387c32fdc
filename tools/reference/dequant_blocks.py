#!/usr/bin/env python3
"""Golden dequantization of random blocks of every type kvbench dequantizes, by the gguf package.

The default model only contains F32, Q4_1 and Q8_0 tensors; this covers the other formats. Blocks
are random bytes except for the fp16 scale fields, which are drawn as finite, moderate values so
that outputs are ordinary numbers. Output: tests/fixtures/gguf/dequant_blocks.jsonl, one line per
type: {"type", "n_blocks", "hex": block bytes, "bits": expected fp32 values as uint32 bit patterns}.

    python3 tools/reference/dequant_blocks.py
"""
import json
import pathlib

import numpy as np
from gguf import GGMLQuantizationType as T
from gguf.constants import GGML_QUANT_SIZES
from gguf.quants import dequantize

# Byte offsets of the fp16 scale fields inside each block (ggml block layouts).
SCALE_FIELDS = {
    "F16": None, "BF16": None,
    "Q4_0": [0], "Q4_1": [0, 2], "Q5_0": [0], "Q5_1": [0, 2], "Q8_0": [0],
    "Q4_K": [0, 2], "Q5_K": [0, 2], "Q6_K": [208],
}
N_BLOCKS = 4


def main():
    rng = np.random.default_rng(20251122)
    out = pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/gguf/dequant_blocks.jsonl"
    lines = []
    for name, scales in SCALE_FIELDS.items():
        qtype = T[name]
        block_elems, block_bytes = GGML_QUANT_SIZES[qtype]
        if name in ("F16", "BF16"):
            n = 64
            vals = rng.normal(0, 3, n).astype(np.float32)
            raw = vals.astype(np.float16).view(np.uint8) if name == "F16" else \
                (vals.view(np.uint32) >> 16).astype(np.uint16).view(np.uint8)
            data = np.frombuffer(raw.tobytes(), dtype=np.uint8)
        else:
            n = N_BLOCKS * block_elems
            data = rng.integers(0, 256, N_BLOCKS * block_bytes, dtype=np.uint8)
            for b in range(N_BLOCKS):
                for off in scales:
                    h = np.float16(rng.uniform(-0.2, 0.2) if off else rng.uniform(0.001, 0.2))
                    data[b * block_bytes + off: b * block_bytes + off + 2] = np.frombuffer(h.tobytes(), np.uint8)
        values = dequantize(data, qtype).astype(np.float32).reshape(-1)
        assert values.size == n and np.all(np.isfinite(values))
        lines.append(json.dumps({"type": name, "n": int(n), "hex": data.tobytes().hex(),
                                 "bits": [int(x) for x in values.view(np.uint32)]}))
    out.write_text("\n".join(lines) + "\n")
    print(f"wrote {out} ({len(lines)} types)")


if __name__ == "__main__":
    main()
