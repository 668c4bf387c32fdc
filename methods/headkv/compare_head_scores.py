#!/usr/bin/env python3
"""Compares two head-importance files (kvbench calibrate headkv, or the HeadKV repository's layout):
Spearman rank correlation of the per-head mean scores and the overlap of their top-k heads.

    python3 methods/headkv/compare_head_scores.py A.json B.json [--top 20]
"""
import argparse
import json

import numpy as np


def means(path):
    body = json.load(open(path))
    return {k: float(np.mean(v)) for k, v in body.items() if k != "header"}


def ranks(x):
    order = np.argsort(x, kind="stable")
    r = np.empty(len(x))
    r[order] = np.arange(len(x))
    for value in np.unique(x):  # average ranks of ties
        tie = x == value
        r[tie] = r[tie].mean()
    return r


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("a")
    ap.add_argument("b")
    ap.add_argument("--top", type=int, default=20)
    args = ap.parse_args()
    a, b = means(args.a), means(args.b)
    if set(a) != set(b):
        raise SystemExit(f"the files score different heads ({len(a)} vs {len(b)})")
    keys = sorted(a)
    xa, xb = np.array([a[k] for k in keys]), np.array([b[k] for k in keys])
    rho = np.corrcoef(ranks(xa), ranks(xb))[0, 1]
    top_a = set(sorted(keys, key=lambda k: -a[k])[: args.top])
    top_b = set(sorted(keys, key=lambda k: -b[k])[: args.top])
    print(json.dumps({"heads": len(keys), "spearman": round(float(rho), 4),
                      f"top{args.top}_overlap": len(top_a & top_b),
                      "top_a": sorted(top_a, key=lambda k: -a[k])[:10],
                      "top_b": sorted(top_b, key=lambda k: -b[k])[:10]}, indent=1))


if __name__ == "__main__":
    main()
