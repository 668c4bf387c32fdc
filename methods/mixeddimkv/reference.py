#!/usr/bin/env python3
"""Independent reference for MixedDimKV's width allocation and HeadKV's capacities and kept sets.

Written from the MixedDimKV paper (Algorithm 1, Eq. 1-3) and the methods' READMEs
(methods/mixeddimkv/README.md, methods/headkv/README.md), in numpy float64, not from kvbench's C++.
For real prompts of the default model, `kvbench dump-prefill` writes each chosen
layer's K, V and window queries together with the width kvbench kept every (head, token) at; this
script recomputes the allocation from the tensors alone and counts agreements. It then writes
methods/mixeddimkv/fixtures/reference.json: per (prompt, layer, method, budget, head) a hash of the
reference's widths, which the C++ test compares against a fresh kvbench run (no Python needed there).

    python3 methods/mixeddimkv/reference.py --kvbench build/kvbench \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --work /tmp/mdkv_ref
"""
import argparse
import json
import os
import subprocess
import sys

import numpy as np

# The prefill-dump helpers the reference scripts share.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
from prefill_dump import add_arguments, dump_niah, load_layer, row_hashes  # noqa: E402

LENGTHS = [1000, 2000, 3000, 4000, 6000, 8000]  # NIAH prompts, needle at 50% depth, chat template
LAYERS = [0, 5, 10, 15, 20, 25, 29]
BUDGETS = [64, 128]
WIDTHS = [0.0, 0.125, 0.25, 1.0]
WINDOW = 8  # MixedDimKV and HeadKV default observation window
HEADKV_BETA = 1.1
SEED = 7


def attention(q, k, q_pos):
    """Softmax rows of q k^T / sqrt(d); row i sees keys 0..q_pos[i]."""
    z = q @ k.T / np.sqrt(k.shape[1])
    z[np.arange(k.shape[0])[None, :] > q_pos[:, None]] = -np.inf
    z -= z.max(axis=1, keepdims=True)
    p = np.exp(z)
    return p / p.sum(axis=1, keepdims=True)


def pca(x, r):
    """Top-r eigenvectors of the uncentered second moment x^T x / n."""
    vals, vecs = np.linalg.eigh(x.T @ x / x.shape[0])
    return vecs[:, np.argsort(-vals, kind="stable")[:r]]


def dims_of(d):
    return [d if r == 1 else int(np.floor(r * d / 8)) * 8 for r in WIDTHS]


def head_losses(k, v, q, q_pos, window, dims):
    """Loss[t, j] for the prefix tokens (Algorithm 1)."""
    n, d = k.shape
    prefix = n - window
    p = attention(q, k, q_pos)
    vn = np.linalg.norm(v, axis=1)
    r_max = max(x for x in dims if 0 < x < d)
    pk, pv = pca(k, r_max), pca(v, r_max)
    out = np.zeros((prefix, len(dims)))
    for j, r in enumerate(dims):
        if r == 0:
            e = 2 * p * vn[None, :]
        elif r == d:
            continue
        else:
            kr = k @ pk[:, :r] @ pk[:, :r].T
            vr = v @ pv[:, :r] @ pv[:, :r].T
            pr = attention(q, kr, q_pos)
            e = np.abs(pr - p) * vn[None, :] + p * np.linalg.norm(v - vr, axis=1)[None, :]
        out[:, j] = e.sum(axis=0)[:prefix]
    return out, r_max


def allocate(loss, rho, budget):
    """Lagrangian relaxation, bisection on lambda, greedy top-up (README.md §5)."""
    rho = np.asarray(rho)

    def choose(lam):
        return np.argmin(loss + lam * rho[None, :], axis=1)  # first index on ties: the smaller width

    def cost(lam):
        return rho[choose(lam)].sum()

    if cost(0.0) <= budget:
        c = choose(0.0)
        return c, loss[np.arange(len(c)), c].sum()
    slopes = (loss[:, :1] - loss[:, 1:]) / rho[None, 1:]
    lo, hi = 0.0, max(0.0, slopes.max()) * (1 + 1e-9) + 5e-324
    while hi - lo > 1e-9 * hi:
        mid = (lo + hi) / 2
        if cost(mid) <= budget:
            hi = mid
        else:
            lo = mid
    c, c_lo = choose(hi), choose(lo)
    spent = rho[c].sum()
    idx = np.arange(len(c))
    flips = [i for i in idx[c_lo != c] if rho[c_lo[i]] > rho[c[i]]]
    gain = {i: (loss[i, c[i]] - loss[i, c_lo[i]]) / (rho[c_lo[i]] - rho[c[i]]) for i in flips}
    for i in sorted(flips, key=lambda i: -gain[i]):  # stable: ties keep item order
        step = rho[c_lo[i]] - rho[c[i]]
        if spent + step <= budget + 1e-9:
            c[i] = c_lo[i]
            spent += step
    return c, loss[idx, c].sum()


def mixeddimkv_widths(k, v, qw, n_kv, window, budget):
    """Widths (in dimensions) per KV head for the whole prompt: one problem per layer."""
    n, _, d = k.shape
    g = qw.shape[1] // n_kv
    dims = dims_of(d)
    rho = np.array(dims) / d
    q_pos = np.tile(np.arange(n - window, n), g)
    losses = []
    for h in range(n_kv):
        q = np.concatenate([qw[:, h * g + i, :] for i in range(g)]).astype(np.float64)
        l, r_max = head_losses(k[:, h, :].astype(np.float64), v[:, h, :].astype(np.float64), q, q_pos, window, dims)
        losses.append(l)
    table = np.concatenate(losses)
    evict = table[:, [0, len(dims) - 1]]
    c_ev, loss_ev = allocate(evict, [0.0, 1.0], n_kv * (budget - window))
    choice = np.where(c_ev == 1, len(dims) - 1, 0)
    full_budget = n_kv * (budget - window - r_max)
    if full_budget >= 0:
        c_full, loss_full = allocate(table, rho, full_budget)
        if loss_full < loss_ev:
            choice = c_full
    prefix = n - window
    out = np.full((n_kv, n), d)
    for h in range(n_kv):
        out[h, :prefix] = np.array(dims)[choice[h * prefix:(h + 1) * prefix]]
    return out


def headkv_widths(k, qw, n_kv, window, budget, scores, layer):
    """HeadKV kept sets (native GQA): group-summed scores, exact-total capacities, SnapKV selection."""
    n, _, d = k.shape
    g = qw.shape[1] // n_kv
    prefix = n - window
    b = budget - window
    s = scores.reshape(scores.shape[0], n_kv, g).sum(axis=2)
    s = s / s.sum()
    pool = np.floor(b / HEADKV_BETA) * s.size
    raw = s * pool + (b - np.floor(b / HEADKV_BETA))
    caps = np.floor(raw).astype(int).ravel()
    frac = (raw - np.floor(raw)).ravel()
    missing = s.size * b - caps.sum()
    for i in np.argsort(-frac, kind="stable")[:missing]:  # largest remainders, ties to the earlier head
        caps[i] += 1
    caps = caps.reshape(s.shape)
    q_pos = np.arange(n - window, n)
    out = np.zeros((n_kv, n), dtype=int)
    for h in range(n_kv):
        pooled = []
        for i in range(g):
            p = attention(qw[:, h * g + i, :].astype(np.float64), k[:, h, :].astype(np.float64), q_pos)
            a = p.mean(axis=0)[:prefix]
            padded = np.concatenate([np.full(3, -np.inf), a, np.full(3, -np.inf)])
            pooled.append(np.max([padded[j:j + prefix] for j in range(7)], axis=0))
        score = np.mean(pooled, axis=0)
        kept = np.argsort(-score, kind="stable")[: caps[layer, h]]  # ties to the lower position
        out[h, kept] = d
        out[h, prefix:] = d
    return out


def main():
    ap = argparse.ArgumentParser()
    add_arguments(ap, "/tmp/mdkv_ref", "methods/mixeddimkv/fixtures", LENGTHS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    meta0 = json.loads(subprocess.run([args.kvbench, "info", args.model, "--json"], check=True,
                                      capture_output=True, text=True).stdout)
    n_layers, n_heads = meta0["layers"], meta0["heads"]
    rng = np.random.default_rng(SEED)
    scores = rng.exponential(1.0, size=(n_layers, n_heads))
    scores_path = os.path.join(args.out, "headkv_scores.json")
    with open(scores_path, "w") as f:
        json.dump({f"{l}-{h}": [round(float(scores[l, h]), 6)] for l in range(n_layers) for h in range(n_heads)}, f)
    scores = np.array([[round(float(scores[l, h]), 6) for h in range(n_heads)] for l in range(n_layers)])

    records, totals = [], {}
    for length in map(int, args.lengths.split(",")):
        for method in ["mixeddimkv", "headkv"]:
            for budget in BUDGETS:
                work = os.path.join(args.work, f"{method}_L{length}_T{budget}")
                params = {"scores": scores_path} if method == "headkv" else {}
                meta = dump_niah(args, work, length, LAYERS, WINDOW, method, budget, params)
                for layer in LAYERS:
                    k, v, qw, got = load_layer(work, layer)
                    if method == "mixeddimkv":
                        want = mixeddimkv_widths(k, v, qw, meta["n_kv_heads"], WINDOW, budget)
                    else:
                        want = headkv_widths(k, qw, meta["n_kv_heads"], WINDOW, budget, scores, layer)
                    key = (method, budget)
                    same, total = totals.get(key, (0, 0))
                    totals[key] = (same + int((got == want).sum()), total + got.size)
                    records.append({"length": length, "method": method, "budget": budget, "layer": layer,
                                    "n_tokens": meta["n_tokens"],
                                    "heads": row_hashes(want),
                                    "histogram": {str(x): int((want == x).sum()) for x in np.unique(want)}})
                print(f"L={length} {method} T={budget}: {totals[(method, budget)]}", flush=True)
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"note": "widths per (head, token) by methods/mixeddimkv/reference.py; heads hold "
                           "fnv1a-64 of the comma-joined widths",
                   "window": WINDOW, "widths": WIDTHS, "headkv_beta": HEADKV_BETA, "records": records,
                   "agreement": {f"{m} T={b}": {"same": s, "total": t} for (m, b), (s, t) in totals.items()}},
                  f, indent=1)
    for (m, b), (s, t) in totals.items():
        print(f"{m} T={b}: {s} of {t} (head, token) widths identical")


if __name__ == "__main__":
    main()
