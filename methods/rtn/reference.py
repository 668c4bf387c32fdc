#!/usr/bin/env python3
"""KIVI's SymQuantizer on fixed keys and values, for test_rtn.cpp.

jy-yuan/KIVI's models/utils_quant.py (commit 876b4d2) `SymQuantizer.apply(x, clip_val, bits, layerwise=False)`
quantizes each row of its last dimension: s = (2^(b-1) - 1) / (max |x| + 1e-6), round(x s) / (s + 1e-6). Rows are
a token's channels of one head, or groups of them (the input viewed as [tokens, groups, group]). Written per case
(bits, group): the signed codes round(x s) (int8, base64) and SymQuantizer's output (float32, base64), for keys
and values of one head (float32 inputs, base64).

    python3 methods/rtn/reference.py --kivi DIR   (a checkout of jy-yuan/KIVI; needs torch)
"""
import argparse
import base64
import importlib.util
import json
import pathlib

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "methods/rtn/fixtures/rtn_reference.json"
D, T = 64, 40
CASES = [(2, 64), (4, 64), (4, 16), (8, 32)]  # bits, channels per group


def b64(t, dtype):
    return base64.b64encode(t.contiguous().numpy().astype(dtype).tobytes()).decode()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kivi", required=True, type=pathlib.Path)
    args = ap.parse_args()
    spec = importlib.util.spec_from_file_location("utils_quant", args.kivi / "models/utils_quant.py")
    uq = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(uq)

    g = torch.Generator().manual_seed(11)
    k = torch.randn(T, D, generator=g) * torch.linspace(0.2, 3.0, D)  # channels of different ranges, as keys
    v = torch.randn(T, D, generator=g)
    k[5, 7] = 40.0  # an outlier sets its token's scale
    v[9] = 0.0      # an all-zero token: max 0, every code 0
    out = {"head_dim": D, "tokens": T, "k": b64(k, "<f4"), "v": b64(v, "<f4"), "cases": []}
    clip = torch.tensor([-2.0, 2.0])
    for bits, group in CASES:
        case = {"bits": bits, "group": group}
        for name, x in (("k", k), ("v", v)):
            rows = x.view(T, D // group, group)
            deq = uq.SymQuantizer.apply(rows, clip, bits, False).view(T, D)
            s = (2 ** (bits - 1) - 1) / (rows.abs().amax(dim=-1, keepdim=True) + 1e-6)
            codes = torch.round(rows * s).view(T, D)
            case[name + "_codes"] = b64(codes, "i1")
            case[name + "_dequant"] = b64(deq, "<f4")
        out["cases"].append(case)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT} ({len(CASES)} cases)")


if __name__ == "__main__":
    main()
