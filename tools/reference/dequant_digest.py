#!/usr/bin/env python3
"""Write a compact digest of every dequantized tensor in a GGUF file.

Reference implementation: the `gguf` Python package (GGUFReader +
gguf.quants.dequantize), independent of llama.cpp's C code.

Output: tests/fixtures/gguf/smollm2_dequant_digest.jsonl, one line per tensor,
in file order:
  name     tensor name
  type     ggml type name as spelled by gguf-py's GGMLQuantizationType ("Q4_1", "F32", ...)
  type_id  numeric ggml_type
  shape    dimensions in GGUF order: [ne0, ne1, ...], ne0 = fastest-varying (row length)
  n        element count
  offset   tensor data offset relative to the start of the data section (as stored in the file)
  nbytes   size of the tensor data in bytes
  sum      sum of the dequantized fp32 values, computed exactly and rounded once
           to float64 (math.fsum), so it does not depend on summation order
  sumsq    sum of squares, same method (squares of fp32 values are exact in float64)
  samples  [[flat_index, fp32 bit pattern as uint32], ...] for 16 indices: 0, n-1 and
           14 pseudo-random ones (sorted).  flat_index = i0 + ne0*(i1 + ne1*(i2 + ne2*i3)),
           i.e. row-major over the reversed GGUF shape, ne0 fastest -- the order the
           values are laid out in memory after dequantizing row by row.

A second file, smollm2_gguf_meta.json, records the header counts, alignment,
data-section offset and every metadata key with its value type (arrays: element
type and length; scalars/strings: the value, long strings truncated).

Usage (from the repo root):
    python3 tools/reference/dequant_digest.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--out tests/fixtures/gguf/smollm2_dequant_digest.jsonl]
        [--meta-out tests/fixtures/gguf/smollm2_gguf_meta.json]
"""

import argparse
import itertools
import json
import math
import os
import random
import sys

import numpy as np
import gguf
from gguf import GGMLQuantizationType as QT

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
N_SAMPLES = 16
CHUNK = 1 << 20


def exact_sum(x64):
    """Correctly rounded sum of a float64 array, streamed in chunks so a
    28M-element tensor never becomes one giant Python list."""
    return math.fsum(itertools.chain.from_iterable(
        x64[i:i + CHUNK].tolist() for i in range(0, x64.size, CHUNK)))


def sample_indices(name, n):
    # Seeding random.Random with a str is deterministic (SHA-512 based) and
    # independent of PYTHONHASHSEED; the indices are written to the file anyway.
    rng = random.Random("kvbench-dequant-digest:" + name)
    k = min(N_SAMPLES, n)
    idx = {0, n - 1}
    while len(idx) < k:
        idx.add(rng.randrange(n))
    return sorted(idx)


def independent_check(tensor, values):
    """Recompute Q4_1 / Q8_0 in float64 straight from the block bytes and
    compare bit-for-bit with gguf-py.  For these formats d (an fp16) times a
    small integer is exact in fp32, so the only rounding is the final one and a
    C/C++ implementation gets identical bits with or without FMA contraction.
    Returns the number of mismatching elements (None for other types)."""
    raw = np.asarray(tensor.data).reshape(-1)
    if tensor.tensor_type == QT.Q8_0:
        blocks = raw.reshape(-1, 34)
        d = blocks[:, :2].copy().view(np.float16).astype(np.float64)
        q = blocks[:, 2:].copy().view(np.int8).astype(np.float64)
        ref = (d * q).astype(np.float32)
    elif tensor.tensor_type == QT.Q4_1:
        blocks = raw.reshape(-1, 20)
        d = blocks[:, 0:2].copy().view(np.float16).astype(np.float64)
        m = blocks[:, 2:4].copy().view(np.float16).astype(np.float64)
        qs = blocks[:, 4:]
        # Element j (0..15) is the low nibble of byte j, element j+16 the high nibble.
        q = np.concatenate([qs & 0x0F, qs >> 4], axis=1).astype(np.float64)
        ref = (d * q + m).astype(np.float32)
    else:
        return None
    return int(np.count_nonzero(ref.reshape(-1).view(np.uint32) != values.view(np.uint32)))


def field_summary(field):
    """JSON-able description of one metadata key/value."""
    vtype = field.types[0]
    if vtype == gguf.GGUFValueType.ARRAY:
        etype = field.types[1] if len(field.types) > 1 else None
        return {"type": "ARRAY", "elem_type": etype.name if etype is not None else None,
                "len": len(field.data)}
    v = field.contents()
    if isinstance(v, str) and len(v) > 200:
        return {"type": vtype.name, "len": len(v), "value_prefix": v[:200]}
    if isinstance(v, (np.generic,)):
        v = v.item()
    return {"type": vtype.name, "value": v}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "tests/fixtures/gguf/smollm2_dequant_digest.jsonl"))
    ap.add_argument("--meta-out", default=os.path.join(REPO_ROOT, "tests/fixtures/gguf/smollm2_gguf_meta.json"))
    args = ap.parse_args()

    reader = gguf.GGUFReader(args.gguf)
    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)

    mismatches = 0
    with open(args.out, "w", encoding="ascii", newline="\n") as f:
        for t in reader.tensors:
            shape = [int(x) for x in t.shape]           # GGUF order, ne0 first
            n = int(t.n_elements)
            assert n == math.prod(shape)
            # gguf-py returns an array shaped like the reversed GGUF shape
            # (numpy row-major), so reshape(-1) is exactly ne0-fastest order.
            values = np.ascontiguousarray(
                gguf.quants.dequantize(t.data, t.tensor_type), dtype=np.float32).reshape(-1)
            assert values.size == n
            bad = independent_check(t, values)
            if bad:
                mismatches += bad
                print("MISMATCH %s: %d elements differ from independent recompute" % (t.name, bad))
            x64 = values.astype(np.float64)
            bits = values.view(np.uint32)
            row = {
                "name": t.name,
                "type": t.tensor_type.name,
                "type_id": int(t.tensor_type),
                "shape": shape,
                "n": n,
                "offset": int(t.data_offset - reader.data_offset),
                "nbytes": int(t.n_bytes),
                "sum": exact_sum(x64),
                "sumsq": exact_sum(x64 * x64),
                "samples": [[i, int(bits[i])] for i in sample_indices(t.name, n)],
            }
            f.write(json.dumps(row, separators=(",", ":")) + "\n")

    meta = {
        "gguf_version": int(reader.fields["GGUF.version"].contents()),
        "tensor_count": len(reader.tensors),
        "kv_count": int(reader.fields["GGUF.kv_count"].contents()),
        "alignment": int(reader.alignment),
        "data_offset": int(reader.data_offset),
        "file_size": os.path.getsize(args.gguf),
        "kv": {k: field_summary(fld) for k, fld in reader.fields.items()
               if not k.startswith("GGUF.")},
    }
    with open(args.meta_out, "w", encoding="ascii") as f:
        json.dump(meta, f, indent=1, ensure_ascii=True)
        f.write("\n")

    print("wrote %d tensor digests to %s (%d bytes)" % (
        len(reader.tensors), args.out, os.path.getsize(args.out)))
    print("independent Q4_1/Q8_0 recompute mismatches: %d" % mismatches)
    if mismatches:
        sys.exit(1)


if __name__ == "__main__":
    main()
