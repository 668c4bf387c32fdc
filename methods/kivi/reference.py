#!/usr/bin/env python3
"""KIVI's own quantizer and residual rule on fixed keys and values, for test_kivi.cpp.

Replays the cache of one KV head as KIVI's attention (jy-yuan/KIVI, models/llama_kivi.py at commit
876b4d2) keeps it, with the quantizers of its quant/new_pack.py:
- prefill of n tokens: keys quantized in whole blocks of the residual length R (n - n % R tokens,
  per channel in groups of `group` tokens), the rest kept at full precision; values of all but the R
  most recent tokens quantized per token in groups of `group` channels, the R kept;
- each decode step: the token joins both buffers (attention reads it at full precision); then the key
  buffer, once it holds R tokens, is quantized whole and emptied, and the oldest value leaves the
  value buffer once it holds more than R.
KIVI's prefill and decode call the Triton form of the quantizer (triton_quantize_and_pack_along_last_dim,
on the transposed keys); the script calls the pure-torch quant_and_pack_kcache / quant_and_pack_vcache
of the same file, which compute the same min-max codes, on float32 inputs (KIVI's runs are float16; in
float32 kvbench's codes must equal these bit for bit). Triton is stubbed out to import the file.

Output methods/kivi/fixtures/kivi_reference.json: the inputs (float32, base64) and per case (bits,
residual, prefill length, decode steps) the quantized key and value codes (uint8, base64, keys
[tokens, head_dim] token-major, values [tokens, head_dim]), their scales and minimums (float32, base64,
keys [token group, channel], values [token, channel group]) and the full-precision buffer lengths.

    python3 methods/kivi/reference.py --kivi DIR   (a checkout of jy-yuan/KIVI; needs torch)
"""
import argparse
import base64
import json
import pathlib
import sys
import types

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "methods/kivi/fixtures/kivi_reference.json"
D, T = 32, 224  # head_dim; tokens of the inputs (prefill + decode)
GROUP = 32
CASES = [  # bits, residual, prefill tokens, decode steps
    (2, 64, 150, 70),
    (4, 64, 150, 70),
    (2, 128, 200, 24),
    (2, 64, 40, 60),
]


def b64(t, dtype):
    return base64.b64encode(t.contiguous().numpy().astype(dtype).tobytes()).decode()


def load_kivi(path):
    triton = types.ModuleType("triton")
    triton.jit = lambda f=None, **k: f if f is not None else (lambda g: g)
    triton.language = types.ModuleType("triton.language")
    triton.language.constexpr = int
    sys.modules["triton"], sys.modules["triton.language"] = triton, triton.language
    ns = {}
    exec(compile((path / "quant/new_pack.py").read_text(), str(path / "quant/new_pack.py"), "exec"), ns)
    return ns


def unpack(code, bits, n, dim):
    """Codes [1, 1, ...] packed along tokens (dim 0, quant_and_pack_kcache) or along channels (dim 1,
    quant_and_pack_vcache), back to [n, D]: code j of a word sits at bits * j."""
    per = 32 // bits
    c = (code[0, 0].to(torch.int64) & 0xFFFFFFFF).repeat_interleave(per, dim=dim)
    shift = bits * (torch.arange(c.shape[dim]) % per)
    shift = shift[:, None] if dim == 0 else shift[None, :]
    return ((c >> shift) & ((1 << bits) - 1))[:n]


def run(kivi, k, v, bits, R, n, steps):
    kq, ks, km, vq, vs, vm = [], [], [], [], [], []

    def quant_keys(x):  # x [m, D], m a multiple of the group
        code, scale, mn = kivi["quant_and_pack_kcache"](x[None, None].clone(), GROUP, bits)
        kq.append(unpack(code, bits, x.shape[0], 0))
        ks.append(scale[0, 0, :, 0, :])  # [groups, D]
        km.append(mn[0, 0, :, 0, :])

    def quant_values(x):  # x [m, D]
        code, scale, mn = kivi["quant_and_pack_vcache"](x[None, None].clone(), GROUP, bits)
        vq.append(unpack(code, bits, x.shape[0], 1))
        vs.append(scale[0, 0, :, :, 0])  # [m, groups]
        vm.append(mn[0, 0, :, :, 0])

    kp, vp = k[:n], v[:n]
    cut = n - n % R
    if cut:
        quant_keys(kp[:cut])
    k_full = kp[cut:]
    if n > R:
        quant_values(vp[:n - R])
        v_full = vp[n - R:]
    else:
        v_full = vp
    for t in range(n, n + steps):
        k_full = torch.cat([k_full, k[t:t + 1]])
        v_full = torch.cat([v_full, v[t:t + 1]])
        if k_full.shape[0] == R:
            quant_keys(k_full)
            k_full = k_full[:0]
        if v_full.shape[0] > R:
            quant_values(v_full[:1])
            v_full = v_full[1:]
    cat = lambda xs, shape: torch.cat(xs) if xs else torch.zeros(shape)
    return {"bits": bits, "residual": R, "prefill": n, "steps": steps,
            "k_codes": b64(cat(kq, (0, D)), "uint8"), "k_scale": b64(cat(ks, (0, D)), "float32"),
            "k_min": b64(cat(km, (0, D)), "float32"),
            "v_codes": b64(cat(vq, (0, D)), "uint8"), "v_scale": b64(cat(vs, (0, D // GROUP)), "float32"),
            "v_min": b64(cat(vm, (0, D // GROUP)), "float32"),
            "k_full": int(k_full.shape[0]), "v_full": int(v_full.shape[0])}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--kivi", required=True, type=pathlib.Path)
    args = ap.parse_args()
    kivi = load_kivi(args.kivi)
    g = torch.Generator().manual_seed(7)
    # Keys with outlier channels (KIVI's reason for per-channel keys), values without.
    k = torch.randn(T, D, generator=g) * (1 + 4 * (torch.arange(D) % 7 == 0))
    v = torch.randn(T, D, generator=g)
    out = {"kivi": "jy-yuan/KIVI 876b4d2", "head_dim": D, "group": GROUP, "tokens": T,
           "k": b64(k, "float32"), "v": b64(v, "float32"),
           "cases": [run(kivi, k, v, *c) for c in CASES]}
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    for c in out["cases"]:
        print(c["bits"], c["residual"], c["prefill"], c["steps"], "key buffer", c["k_full"], "value buffer", c["v_full"])


if __name__ == "__main__":
    main()
