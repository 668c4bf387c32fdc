#!/usr/bin/env python3
"""Independent reference for KVCrush's kept sets on top of SnapKV.

Written in numpy float64 from the KVCrush paper (Alg. 1-2), the method's README.md (§1-§7), and a reading of OpenVINO
GenAI's KVCrush logic (its stride picks are the `floor_stride` variant here), not from kvbench's C++.
For real prompts of the default model, `kvbench dump-prefill` writes each chosen layer's K and window
queries with the positions kvbench's kvcrush kept per KV head; this script recomputes SnapKV's scores,
the budget split, the per-head fingerprints, the anchor, the distance order and the picks from the
tensors alone, and counts agreements. It writes methods/kvcrush/fixtures/reference.json: per (prompt,
layer, variant, budget, head) an FNV-1a hash of the reference's widths, which the C++ test compares
with a fresh kvbench run.

    python3 methods/kvcrush/reference.py --kvbench build/kvbench \
        --model models/SmolLM2-135M-Instruct.Q4_1.gguf --work /tmp/kvcrush_ref
"""
import argparse
import json
import math
import os
import sys

import numpy as np

# The prefill-dump helpers the reference scripts share.
sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
from prefill_dump import add_arguments, dump_niah, load_layer, row_hashes  # noqa: E402

LENGTHS = [1000, 2000, 3000, 4000, 6000, 8000]  # NIAH prompts, needle at 50% depth, chat template
LAYERS = [0, 5, 10, 15, 20, 25, 29]
BUDGETS = [64, 128]
WINDOW = 8
RATIO = 0.25
BITS = 0.5
# (anchor, group): the default (README.md §4, §6), the paper's mean anchor, and OpenVINO's stride picks.
VARIANTS = [("alternate", "sorted_stride"), ("mean", "sorted_stride"), ("alternate", "floor_stride")]


def snapkv_scores(k, qw, window):
    """Per query head: window attention (causal inside the window), mean over the window rows, max-pooled
    with kernel 7 (padding ignored), over the prefix."""
    n, n_kv, d = k.shape
    hq = qw.shape[1]
    g = hq // n_kv
    prefix = n - window
    q_pos = np.arange(n - window, n)
    out = np.zeros((hq, prefix))
    for h in range(hq):
        z = qw[:, h, :].astype(np.float64) @ k[:, h // g, :].astype(np.float64).T / math.sqrt(d)
        z[np.arange(n)[None, :] > q_pos[:, None]] = -np.inf
        z -= z.max(axis=1, keepdims=True)
        p = np.exp(z)
        p /= p.sum(axis=1, keepdims=True)
        a = p.mean(axis=0)[:prefix]
        padded = np.concatenate([np.full(3, -np.inf), a, np.full(3, -np.inf)])
        out[h] = np.max([padded[j:j + prefix] for j in range(7)], axis=0)
    return out


def top(score, k):
    """Positions of the k best scores, ties to the lower position."""
    return set(np.argsort(-score, kind="stable")[:k].tolist())


def rank_round(num, den):
    """round(num / den) half to even, exactly."""
    q, r = divmod(num, den)
    return q + 1 if 2 * r > den or (2 * r == den and q % 2 == 1) else q


def kvcrush_widths(k, qw, window, budget, anchor_mode, group):
    n, n_kv, d = k.shape
    hq = qw.shape[1]
    g = hq // n_kv
    prefix = n - window
    qs = snapkv_scores(k, qw, window)
    # Fingerprints over the evictable prefix: head h marks its top ceil(q E) scores and ties.
    rank = max(1, math.ceil(BITS * prefix))
    bits = np.zeros((prefix, hq), dtype=bool)
    for h in range(hq):
        theta = np.sort(qs[h])[::-1][rank - 1]
        bits[:, h] = qs[h] >= theta
    out = np.zeros((n_kv, n), dtype=int)
    for kv in range(n_kv):
        s = qs[kv * g:(kv + 1) * g].mean(axis=0)
        reps = min(round(RATIO * budget), budget - window)  # Python's round is half to even
        base = top(s, budget - reps - window)
        cand = [j for j in range(prefix) if j not in base]
        if anchor_mode == "alternate":
            a = np.array([i % 2 == 1 for i in range(hq)])
        else:  # mean: majority over the candidates
            a = bits[cand].sum(axis=0) * 2 > len(cand)
        dist = (bits[cand] != a[None, :]).sum(axis=1)
        order = [j for _, j in sorted(zip(dist.tolist(), cand))]
        C = len(order)
        if C <= reps:
            picks = order
        elif group == "sorted_stride":
            picks = [order[0 if reps == 1 else rank_round(i * (C - 1), reps - 1)] for i in range(reps)]
        else:  # floor_stride: OpenVINO's picks at i * floor(C / reps) from the nearest
            picks = [order[i * (C // reps)] for i in range(reps)]
        kept = base | set(picks) | set(range(prefix, n))
        out[kv, sorted(kept)] = d
    return out


def main():
    ap = argparse.ArgumentParser()
    add_arguments(ap, "/tmp/kvcrush_ref", "methods/kvcrush/fixtures", LENGTHS)
    args = ap.parse_args()
    os.makedirs(args.out, exist_ok=True)
    records, totals = [], {}
    for length in map(int, args.lengths.split(",")):
        for anchor_mode, group in VARIANTS:
            for budget in BUDGETS:
                work = os.path.join(args.work, f"L{length}_{anchor_mode}_{group}_T{budget}")
                params = {"anchor": anchor_mode, "group": group, "base.window": str(WINDOW)}
                meta = dump_niah(args, work, length, LAYERS, WINDOW, "kvcrush", budget, params)
                for layer in LAYERS:
                    k, _, qw, got = load_layer(work, layer)
                    want = kvcrush_widths(k, qw, WINDOW, budget, anchor_mode, group)
                    key = (anchor_mode, group, budget)
                    same, heads, slots, same_slots = totals.get(key, (0, 0, 0, 0))
                    totals[key] = (same + int((got == want).all(axis=1).sum()), heads + got.shape[0],
                                   slots + got.size, same_slots + int((got == want).sum()))
                    records.append({"length": length, "method": "kvcrush", "params": params, "budget": budget,
                                    "layer": layer, "n_tokens": meta["n_tokens"],
                                    "heads": row_hashes(want)})
                print(f"L={length} {anchor_mode}/{group} T={budget}: {totals[key]}", flush=True)
    with open(os.path.join(args.out, "reference.json"), "w") as f:
        json.dump({"note": "KVCrush over SnapKV (native GQA) by methods/kvcrush/reference.py; heads hold "
                           "fnv1a-64 of the comma-joined widths per token (0 evicted, head_dim kept)",
                   "window": WINDOW, "ratio": RATIO, "bits": BITS, "records": records,
                   "agreement": {f"{a}/{g} T={b}": {"identical_heads": s, "heads": h, "identical_slots": ss,
                                                    "slots": sl}
                                 for (a, g, b), (s, h, sl, ss) in totals.items()}}, f, indent=1)
    for (a, g, b), (s, h, sl, ss) in totals.items():
        print(f"{a}/{g} T={b}: {s} of {h} (prompt, layer, KV head) kept sets identical; {ss} of {sl} slots")


if __name__ == "__main__":
    main()
