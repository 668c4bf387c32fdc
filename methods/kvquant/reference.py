#!/usr/bin/env python3
"""KVQuant's own calibration and quantizer on fixed activations, for test_kvquant.cpp.

Runs the functions of SqueezeAILab/KVQuant's quant/kvquant/simquant_module_quantizer.py (commit
57a2383) as quant/llama_simquant.py calls them for "nuq3-1%" (--abits 3 --nuq --include_sparse
--sparsity-threshold 0.99 --fisher DIR):
- calibration, SimQuant.quantize: keys (k_proj outputs, pre-RoPE) per channel, values (v_proj outputs)
  per token; thresholds at the 0.5 and 99.5 percentiles, values beyond them outliers; a codebook of
  2^bits signposts by scikit-learn's k-means over the normalised non-outliers, weighted by the Fisher
  information (squared gradients of the loss at those activations);
- inference, QuantLinearSim.forward: keys against the fp16 calibration thresholds (get_outliers),
  values against thresholds computed per token (get_outliers_dynamic), both through quant_fn_nuq_recon,
  the result cast to fp16.

The activations and Fisher weights come from a generator that test_kvquant.cpp repeats exactly
(splitmix64 uniforms, sums of four for a bell shape, a heavy tail, two outlier key channels; every
number rounded to float32 and the activations to fp16), so the fixture holds only the reference's
results: thresholds, codebooks, the k-means objective, and the fp16 bits of the quantized test rows.

Output methods/kvquant/fixtures/kvquant_reference.json.

    python3 methods/kvquant/reference.py --kvquant DIR   (a checkout of SqueezeAILab/KVQuant; needs
                                                          torch, numpy, scikit-learn)
"""
import argparse
import importlib.util
import json
import pathlib

import numpy as np
import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "methods/kvquant/fixtures/kvquant_reference.json"
N, C, M = 512, 64, 48  # calibration tokens, channels, test rows
BITS, THRESHOLD = 3, 0.99
MASK = (1 << 64) - 1


def uniform(seed, i):
    """splitmix64 of seed + (i + 1) * golden, top 53 bits in [0, 1)."""
    z = (seed + (i + 1) * 0x9E3779B97F4A7C15) & MASK
    z = ((z ^ (z >> 30)) * 0xBF58476D1CE4E5B9) & MASK
    z = ((z ^ (z >> 27)) * 0x94D049BB133111EB) & MASK
    z ^= z >> 31
    return (z >> 11) * 2.0**-53


def activations(channel_seed, seed, rows, outlier_channels):
    """[rows, C] float16-valued float32: per-channel scale and shift (from channel_seed), bell-shaped,
    a 1/64 heavy tail."""
    out = np.empty((rows, C), dtype=np.float32)
    for c in range(C):
        scale = 0.5 + 3.0 * uniform(channel_seed + 1, c)
        if c in outlier_channels:
            scale *= 10.0
        shift = 2.0 * uniform(channel_seed + 2, c) - 1.0
        for n in range(rows):
            i = n * C + c
            bell = sum(uniform(seed, 4 * i + j) for j in range(4)) - 2.0
            if uniform(seed + 3, i) < 1.0 / 64:
                bell *= 6.0
            out[n, c] = np.float32(shift + scale * bell)
    return out.astype(np.float16).astype(np.float32)


def fisher(seed, rows):
    out = np.empty((rows, C), dtype=np.float32)
    for i in range(rows * C):
        u = uniform(seed, i)
        out[i // C, i % C] = np.float32((0.1 + u) * (0.1 + u))
    return out


def load(path):
    spec = importlib.util.spec_from_file_location("simquant", pathlib.Path(path) / "quant/kvquant/simquant_module_quantizer.py")
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


def inertia(mod, data, weights, qchannel, centroids):
    """The weighted k-means objective over the normalised non-outliers, as SimQuant.quantize forms them."""
    t = 1 - ((1 - THRESHOLD) / 2)
    upper = np.expand_dims(np.percentile(data, t * 100, axis=qchannel), qchannel)
    lower = np.expand_dims(np.percentile(data, (1 - t) * 100, axis=qchannel), qchannel)
    x = (data - (upper + lower) / 2) / ((upper - lower) / 2)
    keep = ~((x > 1) | (x < -1))
    x, w = x[keep].astype(np.float64), weights[keep].astype(np.float64)
    c = np.asarray(centroids, dtype=np.float64).reshape(-1)
    return float((w * np.min((x[:, None] - c[None, :]) ** 2, axis=1)).sum())


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--kvquant", required=True, help="checkout of SqueezeAILab/KVQuant")
    args = ap.parse_args()
    mod = load(args.kvquant)

    k_cal, v_cal = activations(11, 11, N, {5, 40}), activations(21, 21, N, set())
    k_fisher, v_fisher = fisher(31, N), fisher(41, N)
    k_test, v_test = activations(11, 51, M, {5, 40}), activations(21, 61, M, set())

    result = {"n": N, "channels": C, "rows": M, "bits": BITS, "threshold": THRESHOLD,
              "seeds": {"k": 11, "v": 21, "k_fisher": 31, "v_fisher": 41, "k_test": 51, "v_test": 61}}
    quantizers = {}
    for kind, data, weights, qchannel in (("k", k_cal, k_fisher, 0), ("v", v_cal, v_fisher, -1)):
        sq = mod.SimQuant(torch.nn.Linear(8, C, bias=False), BITS, perchannel=True, qchannel=qchannel)
        sq.add_batch(None, torch.from_numpy(data))
        upper, lower, centroids = sq.quantize(include_sparse=True, sparsity_threshold=THRESHOLD, nuq=True,
                                              fisher=torch.from_numpy(weights), norm=False, cap_outliers=False,
                                              first_few_fp16=-1)
        quantizers[kind] = (upper, lower, centroids)
        result[f"{kind}_codebook"] = sorted(float(c) for c in np.asarray(centroids[0]).reshape(-1))
        result[f"{kind}_inertia"] = inertia(mod, data, weights, qchannel, centroids[0])
        if kind == "k":
            result["k_upper"] = [float(x) for x in upper.reshape(-1)]
            result["k_lower"] = [float(x) for x in lower.reshape(-1)]

    # Inference as QuantLinearSim.forward runs it: keys static per channel, values dynamic per token.
    upper, lower, centroids = quantizers["k"]
    u = upper.flatten().half()
    lo = lower.flatten().half()
    y = torch.from_numpy(k_test)
    mask = mod.get_outliers(y, channel=0, outlier_threshold_upper=u, outlier_threshold_lower=lo, cap_outliers=-1,
                            first_few_fp16=-1)
    k_out = mod.quant_fn_nuq_recon(y, bits=BITS, qchannel=0, maxval=u, minval=lo, include_sparse=True,
                                   outlier_mask=mask, dynamicquantization=False, lut=centroids).half()
    result["k_outliers"] = int(mask.sum())
    upper, lower, centroids = quantizers["v"]
    y = torch.from_numpy(v_test)
    mask = mod.get_outliers_dynamic(y, channel=-1, thresh=THRESHOLD, first_few_fp16=-1)
    v_out = mod.quant_fn_nuq_recon(y, bits=BITS, qchannel=-1, include_sparse=True, outlier_mask=mask,
                                   dynamicquantization=True, lut=centroids).half()
    result["v_outliers"] = int(mask.sum())
    result["k_out_fp16"] = [int(b) for b in k_out.view(torch.int16).numpy().astype(np.uint16).reshape(-1)]
    result["v_out_fp16"] = [int(b) for b in v_out.view(torch.int16).numpy().astype(np.uint16).reshape(-1)]
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(result) + "\n")
    print(f"wrote {OUT}: key outliers {result['k_outliers']} of {M * C}, value outliers {result['v_outliers']}")


if __name__ == "__main__":
    main()
