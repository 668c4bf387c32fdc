#!/usr/bin/env python3
"""Palu's whitened low-rank K/V projections on SmolLM2-135M-Instruct in float64: golden logits for kvbench's palu.

Palu (Chang et al., ICLR 2025; code shadowpa0327/Palu), the path of its compress script with the
`whiten` decomposition and the `uniform` rank search, written again here from its description (its
code is not imported or copied):
  1. Calibration windows (palu/data_utils.py get_calib_data): random.seed(3); the training text is
     joined by "\\n\\n"; for each of nsamples windows i = random.randint(0, len(text) - seqlen - 1),
     the characters text[i : i + 10 seqlen] are tokenized (the tokenizer's default special tokens)
     and cut to the first seqlen ids. --make-ids applies this to set-up's data/python-docs (the files
     sorted by name; the paper's WikiText-2 cannot be fetched here), nsamples 8, seqlen 256.
  2. Whitening (palu/decomposition.py get_whiten_scale_matrix): per layer, X^T X of the inputs of
     k_proj and v_proj over every calibration token (one matrix: both read the same input), summed
     in float64 here (Palu sums float32 products of fp16 activations); S = cholesky(X^T X), lower; if
     that fails, X^T X + (1e-3 - lambda_min) I, as Palu does.
  3. Decomposition (palu/model/modules/svd_linear.py _per_head_whiten_decomposition_from_weight)
     with one group holding all KV heads (J-LRD): W S = U diag(s) V^T, R = sqrt(s_r) V_r^T S^-1,
     L = U_r sqrt(s_r); the layer's k_proj (v_proj) becomes x -> L (R x), so the cache holds R x and
     the keys are rebuilt, then rotated, at attention time.
  4. Rank (palu/rank_search.py, uniform then rounding_search_result): r = 32 max(1, round(ratio d /
     32)) with Python's round, d = n_kv_heads x head_dim = 192: ratio 0.4 keeps 64.
Model: grad_reference.py's (transformers' LlamaForCausalLM from the GGUF, checked bit for bit against
gguf-py's dequantization, then float64 with its float64 RMSNorm / softmax / rotary patches; eager
attention, eval(), 2 threads). Singular values do not depend on the order of k_proj's rows, so the
HF / GGUF row orders of attn_k need no mapping.

Evaluation: the first --n (64) ids of tests/fixtures/engine/grad_ids_256.json, one forward without a
cache (the ids as given, no BOS), once with the model's own k_proj / v_proj and once with Palu's; the
logits of positions --prefill - 1 .. n - 1 (a prefill of --prefill ids and forced decode steps).

Fixture (--fixture, default methods/palu/fixtures/palu_r64_f64.json; ASCII JSON, the same bytes on
every run, timings on stdout): model_sha256, versions, settings, calibration_tokens, rank,
ids (evaluation), prefill, eigenvalues: for layers 0, 1, 14, 29 and K, V the first rank + 1 values of
s^2 / calibration_tokens (the eigenvalues of the keys' (values') uncentred second moment, which
kvbench's calibration computes), kept_energy per layer and kind (sum of the kept s^2 over all),
sample_ids (64 vocabulary ids, numpy default_rng(20261206)), and per evaluated position: top8 [[id,
logit]], the logits at sample_ids, logsumexp, for Palu (`palu`) and the unmodified model (`full`).

Usage (from the repo root; needs torch, transformers 5.x, gguf, numpy):
    python3 methods/palu/reference.py --make-ids      # methods/palu/fixtures/palu_calib_ids.json
    python3 methods/palu/reference.py                 # the fixture
"""

import argparse
import glob
import json
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
import grad_reference as gr  # noqa: E402  (model loading, checks, float64 mode, JSON writing)

FIXTURE_LAYERS = (0, 1, 14, 29)
SAMPLE_SEED = 20261206
N_SAMPLE_IDS = 64


def palu_rank(ratio, d, block=32):
    return min(d, max(1, round(ratio * d / block)) * block)


def make_ids(args):
    """Palu's get_calib_data on set-up's python-docs."""
    from transformers import AutoTokenizer
    gdir, gname = os.path.split(os.path.abspath(args.gguf))
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    files = sorted(glob.glob(os.path.join(gr.REPO_ROOT, "data", "python-docs", "*.txt")))
    assert files, "data/python-docs is missing (scripts/setup.sh fetches it)"
    texts = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            texts.append(fh.read())
    tot_text = "\n\n".join(texts)
    random.seed(3)
    seqs = []
    for _ in range(args.nsamples):
        i = random.randint(0, len(tot_text) - args.seqlen - 1)
        ids = tok(tot_text[i:i + args.seqlen * 10])["input_ids"][:args.seqlen]
        assert len(ids) == args.seqlen
        seqs.append([int(t) for t in ids])
    doc = {"description": "Palu's get_calib_data windows (seed 3) over data/python-docs, SmolLM2's tokenizer",
           "nsamples": args.nsamples, "seqlen": args.seqlen, "sequences": seqs}
    gr.write_json(args.calib_ids, doc)
    print(json.dumps({"calib_ids": args.calib_ids, "sequences": len(seqs), "tokens": sum(map(len, seqs))}))


def whitened_factors(W, XtX, rank):
    """Palu's whitened SVD of one projection W [out, in]: (L [out, r], R [r, in], s)."""
    import torch
    try:
        S = torch.linalg.cholesky(XtX)
        shifted = False
    except RuntimeError:
        lam = torch.linalg.eigvalsh(XtX)[0]
        S = torch.linalg.cholesky(XtX + (1e-3 - lam) * torch.eye(XtX.shape[0], dtype=XtX.dtype))
        shifted = True
    U, s, Vt = torch.linalg.svd(W @ S, full_matrices=False)
    V = Vt @ torch.linalg.inv(S)
    root = torch.diag(torch.sqrt(s[:rank]))
    return U[:, :rank] @ root, root @ V[:rank, :], s, shifted


def position_summary(row, sample_ids):
    row = row.astype(np.float64)
    top = np.argsort(-row, kind="stable")[:8]
    m = row.max()
    return {"top8": [[int(i), float(row[i])] for i in top],
            "samples": [float(row[i]) for i in sample_ids],
            "logsumexp": float(m + np.log(np.sum(np.exp(row - m))))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(gr.REPO_ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--make-ids", action="store_true", help="write the calibration windows and stop")
    ap.add_argument("--calib-ids", default=os.path.join(gr.REPO_ROOT, "methods/palu/fixtures/palu_calib_ids.json"))
    ap.add_argument("--nsamples", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--ids", default=os.path.join(gr.REPO_ROOT, "tests/fixtures/engine/grad_ids_256.json"))
    ap.add_argument("--n", type=int, default=64, help="evaluate the first N ids")
    ap.add_argument("--prefill", type=int, default=48, help="positions before the first compared one")
    ap.add_argument("--rank-ratio", type=float, default=0.4)
    ap.add_argument("--fixture", default=os.path.join(gr.REPO_ROOT, "methods/palu/fixtures/palu_r64_f64.json"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    if args.make_ids:
        make_ids(args)
        return

    import torch

    with open(args.calib_ids, encoding="utf-8") as f:
        calib = json.load(f)["sequences"]
    with open(args.ids, encoding="utf-8") as f:
        ids = [int(i) for i in json.load(f)][:args.n]
    assert len(ids) == args.n and 1 <= args.prefill < args.n

    t0 = time.perf_counter()
    model, _, model_sha = gr.frozen_float64_model(args.gguf, args.threads)
    cfg = model.config
    layers = model.model.layers
    d = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    rank = palu_rank(args.rank_ratio, d)
    assert all(0 <= t < cfg.vocab_size for s in calib for t in s)

    # Step 2: X^T X of every layer's k_proj / v_proj input under the unmodified model.
    xtx = [torch.zeros(cfg.hidden_size, cfg.hidden_size, dtype=torch.float64) for _ in layers]

    def tap(l):
        def hook(mod, inp):
            x = inp[0].reshape(-1, inp[0].shape[-1])
            xtx[l].add_(x.T @ x)
        return hook

    handles = [layer.self_attn.k_proj.register_forward_pre_hook(tap(l)) for l, layer in enumerate(layers)]
    n_tokens = 0
    with torch.no_grad():
        for s in calib:
            model(torch.tensor([s]), use_cache=False)
            n_tokens += len(s)
    for h in handles:
        h.remove()
    with torch.no_grad():
        full_logits = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    t_calib = time.perf_counter() - t0

    # Steps 3-4: the factored projections, rank r for every layer, K and V.
    eigen, energy, shifted_any = {}, {"K": [], "V": []}, False
    for l, layer in enumerate(layers):
        for kind, proj in (("K", layer.self_attn.k_proj), ("V", layer.self_attn.v_proj)):
            L, R, s, shifted = whitened_factors(proj.weight.data, xtx[l], rank)
            shifted_any |= shifted
            s2 = (s ** 2).numpy()
            energy[kind].append(float(s2[:rank].sum() / s2.sum()))
            if l in FIXTURE_LAYERS:
                eigen.setdefault(str(l), {})[kind] = [float(v) for v in s2[:rank + 1] / n_tokens]
            proj.weight.data = L @ R
    with torch.no_grad():
        palu_logits = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    t_done = time.perf_counter() - t0

    sample_ids = sorted(int(i) for i in np.random.default_rng(SAMPLE_SEED).choice(cfg.vocab_size, N_SAMPLE_IDS,
                                                                                   replace=False))
    positions = list(range(args.prefill - 1, args.n))
    doc = {
        "description": "Palu (whitened SVD of k_proj and v_proj, J-LRD, uniform rank) against the unmodified "
                       "model, SmolLM2-135M-Instruct in float64 (methods/palu/reference.py)",
        "model_sha256": model_sha,
        "versions": gr.versions(),
        "settings": {"dtype": "float64", "attn_implementation": "eager", "rank_ratio": args.rank_ratio,
                     "rank_block": 32, "calib_ids": os.path.relpath(args.calib_ids, gr.REPO_ROOT),
                     "cholesky_shifted": shifted_any},
        "calibration_tokens": n_tokens,
        "rank": rank,
        "ids": ids,
        "prefill": args.prefill,
        "eigenvalues": eigen,
        "kept_energy": energy,
        "sample_ids": sample_ids,
        "positions": positions,
        "palu": [position_summary(palu_logits[p], sample_ids) for p in positions],
        "full": [position_summary(full_logits[p], sample_ids) for p in positions],
    }
    gr.write_json(args.fixture, doc)
    diff = np.abs(palu_logits[positions] - full_logits[positions]).max()
    agree = np.mean(palu_logits[positions].argmax(-1) == full_logits[positions].argmax(-1))
    print(json.dumps({"fixture": args.fixture, "rank": rank, "calibration_tokens": n_tokens,
                      "cholesky_shifted": shifted_any, "max_abs_palu_vs_full": float(diff),
                      "argmax_agreement_palu_vs_full": float(agree),
                      "kept_energy_min": {k: min(v) for k, v in energy.items()},
                      "seconds": {"calibration": round(t_calib, 1), "total": round(t_done, 1)}}))


if __name__ == "__main__":
    main()
