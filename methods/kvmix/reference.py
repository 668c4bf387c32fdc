#!/usr/bin/env python3
"""Independent torch autograd reference of KVmix's gradient profile, checked against kvbench's artifact.

KVmix's profile (the paper's procedure): for each prompt p, L_p = mean next-token cross-entropy over
the prompt's own tokens (no padding, no BOS added: the ids are used as given, n_p - 1 targets); one
backward; s_k[l,p] = ||dL_p/dW_k[l]||_F and s_v[l,p] = ||dL_p/dW_v[l]||_F for the k_proj / v_proj
weight of layer l. s_k[l] and s_v[l] are the means over the prompts. The high-bit layers are the top
floor(f L) layers by s_k (keys) and by s_v (values), f = header.profile.high_fraction, ties to the
lower layer, reported ascending. floor(f L) is taken on the decimal value of f as written in the
artifact (Fraction(repr(f)) * L), so 0.2 x 30 is exactly 6.

The Frobenius norm does not depend on the order of the rows, so the GGUF / HF row permutation of
attn_k does not matter here. Norms: float64 sum of squares of the gradient entries, then sqrt.

Reference model: grad_reference.py's (imported from it, not copied): transformers' LlamaForCausalLM
from the GGUF, dequantized to float32, eager attention, eval mode, use_cache=False, its weights
checked bit for bit against gguf-py's dequantization; with --float64 converted to float64 with
transformers' three internal float32 casts replaced (RMSNorm, eager softmax, rotary cos/sin; RoPE
angles stay the float32 product position x inv_freq) and hooks asserting that the whole forward is
float64. Only the 2 L k_proj / v_proj weights require grad (the others are frozen), which leaves
their gradients unchanged and saves the other parameter gradients.

Input: kvbench's profile artifact (--artifact): s_k, s_v (per-layer means), per_prompt {s_k, s_v}
([prompt][layer]), high_k, high_v, header.profile.{prompt_tokens, high_fraction, losses, prompts}.

Output: a per-layer table and per-prompt losses on stdout, and with --summary OUT.json (ASCII,
sorted keys, shortest float repr, no timings, so two runs give the same bytes):
  per prompt: loss (reference, kvbench, |diff|), max over layers of the relative norm differences;
  per layer: reference s_k / s_v and rel = |kvbench - ref| / ref of the means;
  max_rel_s_k / max_rel_s_v (means) and over all (prompt, layer) entries;
  high_k / high_v: the reference's set, kvbench's set, identical or not, and the margin of the choice
  (the last layer in and the first layer out of the reference ranking, and the relative gap
  (s_in - s_out) / s_in of their norms; a choice is robust when the gap is much larger than the
  norm differences); kvbench's own artifact is also checked for consistency (its means against its
  per-prompt values, its sets against its means).

Usage (from the repo root):
    python3 methods/kvmix/reference.py --artifact /tmp/kvmix_small.json \\
        --float64 --summary /tmp/kvmix_small_ref.json
  --gguf defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf, --threads to 2.
"""

import argparse
import json
import math
import os
import sys
import time
from fractions import Fraction

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
from grad_reference import (F64_CALLS, REPO_ROOT, check_float64_calls, check_model,  # noqa: E402
                            forward_backward, load_model, read_gguf_tensors, to_float64, versions)
from hf_logits import sha256_file  # noqa: E402


def high_count(fraction, layers):
    return int(math.floor(Fraction(repr(float(fraction))) * layers))


def ranking(score):
    """Layers by descending score, ties to the lower layer."""
    return sorted(range(len(score)), key=lambda l: (-score[l], l))


def top_layers(score, count):
    return sorted(ranking(score)[:count])


def margin(score, count):
    r = ranking(score)
    if count <= 0 or count >= len(r):
        return None
    s_in, s_out = score[r[count - 1]], score[r[count]]
    return {"last_in": r[count - 1], "first_out": r[count], "s_in": s_in, "s_out": s_out,
            "rel_gap": (s_in - s_out) / s_in}


def rel(a, b):
    return abs(a - b) / abs(b) if b != 0 else (0.0 if a == b else float("inf"))


def fro(t):
    a = t.detach().numpy().astype(np.float64)
    return float(np.sqrt(np.sum(np.square(a))))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--artifact", required=True, help="kvbench's KVmix profile JSON")
    ap.add_argument("--gguf", default=os.path.join(REPO_ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--float64", action="store_true", help="reference in float64 (default float32)")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--summary", metavar="OUT.json")
    args = ap.parse_args()

    with open(args.artifact, encoding="utf-8") as f:
        art = json.load(f)
    prof = art["header"]["profile"]
    prompts = [[int(i) for i in p] for p in prof["prompt_tokens"]]
    names = prof.get("prompts", [str(i) for i in range(len(prompts))])
    kv_losses = [float(x) for x in prof["losses"]]
    fraction = float(prof["high_fraction"])
    kv_sk, kv_sv = [float(x) for x in art["s_k"]], [float(x) for x in art["s_v"]]
    kv_pk = [[float(x) for x in r] for r in art["per_prompt"]["s_k"]]
    kv_pv = [[float(x) for x in r] for r in art["per_prompt"]["s_v"]]
    P = len(prompts)
    problems = []
    if art["header"].get("model", {}).get("file") not in (None, os.path.basename(args.gguf)):
        problems.append("artifact model %s, reference %s" % (art["header"]["model"]["file"],
                                                            os.path.basename(args.gguf)))
    assert P > 0 and len(kv_losses) == P and len(kv_pk) == P and len(kv_pv) == P
    assert all(len(p) >= 2 for p in prompts)

    import torch
    t0 = time.perf_counter()
    gg = read_gguf_tensors(args.gguf)
    model = load_model(args.gguf, args.threads)
    cfg = model.config
    L = cfg.num_hidden_layers
    assert len(kv_sk) == len(kv_sv) == L and all(len(r) == L for r in kv_pk + kv_pv)
    assert all(0 <= i < cfg.vocab_size for p in prompts for i in p)
    gnames = check_model(model, gg)
    dtype = torch.float32
    if args.float64:
        to_float64(model, gg, gnames, False, False)
        dtype = torch.float64
    del gg
    layers = model.model.layers
    wk = [layers[l].self_attn.k_proj.weight for l in range(L)]
    wv = [layers[l].self_attn.v_proj.weight for l in range(L)]
    keep = {id(w) for w in wk + wv}
    for p in model.parameters():
        p.requires_grad_(id(p) in keep)
    print("model loaded and checked in %.1f s (%s, %d threads)" % (
        time.perf_counter() - t0, str(dtype).replace("torch.", ""), torch.get_num_threads()),
        flush=True)

    ref_pk, ref_pv, ref_losses = [], [], []
    for pi, ids in enumerate(prompts):
        for k in F64_CALLS:
            F64_CALLS[k] = 0
        loss, _, t_f, t_b = forward_backward(model, ids, dtype)
        if args.float64:
            check_float64_calls(cfg, False)
        for w in wk + wv:
            assert w.grad is not None and w.grad.dtype == dtype
        ref_pk.append([fro(w.grad) for w in wk])
        ref_pv.append([fro(w.grad) for w in wv])
        ref_losses.append(loss)
        print("prompt %d (%d tokens): loss %.10f  kvbench %.10f  |diff| %.2e  (%.1f s)" % (
            pi, len(ids), loss, kv_losses[pi], abs(loss - kv_losses[pi]), t_f + t_b), flush=True)
    model.zero_grad(set_to_none=True)

    ref_sk = [math.fsum(r[l] for r in ref_pk) / P for l in range(L)]
    ref_sv = [math.fsum(r[l] for r in ref_pv) / P for l in range(L)]
    count = high_count(fraction, L)
    rel_k = [rel(kv_sk[l], ref_sk[l]) for l in range(L)]
    rel_v = [rel(kv_sv[l], ref_sv[l]) for l in range(L)]
    rel_pk = [[rel(kv_pk[p][l], ref_pk[p][l]) for l in range(L)] for p in range(P)]
    rel_pv = [[rel(kv_pv[p][l], ref_pv[p][l]) for l in range(L)] for p in range(P)]

    # kvbench's artifact against itself: means of its per-prompt values, sets from its means
    self_mean_k = max(rel(kv_sk[l], math.fsum(r[l] for r in kv_pk) / P) for l in range(L))
    self_mean_v = max(rel(kv_sv[l], math.fsum(r[l] for r in kv_pv) / P) for l in range(L))
    if self_mean_k > 1e-12 or self_mean_v > 1e-12:
        problems.append("artifact s_k/s_v are not the means of its per_prompt values (%.2e, %.2e)"
                        % (self_mean_k, self_mean_v))
    high = {}
    for key, ref_s, kv_s, kv_set in (("high_k", ref_sk, kv_sk, art["high_k"]),
                                     ("high_v", ref_sv, kv_sv, art["high_v"])):
        ref_set = top_layers(ref_s, count)
        kv_set = [int(x) for x in kv_set]
        if kv_set != top_layers(kv_s, count):
            problems.append("artifact %s %s is not the top %d of its own means %s"
                            % (key, kv_set, count, top_layers(kv_s, count)))
        high[key] = {"reference": ref_set, "kvbench": kv_set, "identical": ref_set == kv_set,
                     "margin_reference": margin(ref_s, count),
                     "margin_kvbench": margin(kv_s, count)}

    print()
    print("%5s | %12s %9s %4s | %12s %9s %4s" % ("layer", "s_k ref", "rel diff", "high",
                                                 "s_v ref", "rel diff", "high"))

    def mark(l, key):
        r, k = l in high[key]["reference"], l in high[key]["kvbench"]
        return "both" if r and k else ("ref" if r else ("kv" if k else ""))
    for l in range(L):
        print("%5d | %12.6e %9.2e %4s | %12.6e %9.2e %4s" % (
            l, ref_sk[l], rel_k[l], mark(l, "high_k"), ref_sv[l], rel_v[l], mark(l, "high_v")))
    print()
    print("max rel diff of the means: s_k %.3e (layer %d)  s_v %.3e (layer %d)" % (
        max(rel_k), int(np.argmax(rel_k)), max(rel_v), int(np.argmax(rel_v))))
    print("max rel diff per prompt:   s_k %.3e  s_v %.3e" % (
        max(map(max, rel_pk)), max(map(max, rel_pv))))
    print("max |loss diff| %.3e" % max(abs(a - b) for a, b in zip(ref_losses, kv_losses)))
    for key in ("high_k", "high_v"):
        h, m = high[key], high[key]["margin_reference"]
        print("%s: reference %s  kvbench %s  %s; margin: layer %d in (%.6e), layer %d out "
              "(%.6e), rel gap %.3e" % (key, h["reference"], h["kvbench"],
                                       "IDENTICAL" if h["identical"] else "DIFFERENT",
                                       m["last_in"], m["s_in"], m["first_out"], m["s_out"],
                                       m["rel_gap"]) if m else "%s: %s" % (key, h))
    for p in problems:
        print("PROBLEM: " + p)

    if args.summary:
        summary = {
            "artifact": os.path.abspath(args.artifact),
            "model_file": os.path.basename(args.gguf),
            "model_sha256": sha256_file(args.gguf),
            "reference": {"dtype": str(dtype).replace("torch.", ""), "torch_threads": args.threads,
                          "attn_implementation": "eager",
                          "loss": "mean over t=0..n-2 of cross_entropy(logits[t], ids[t+1])",
                          "norm": "sqrt of float64 sum of squares of the k_proj/v_proj gradient",
                          "rope_angles": "float32 product position x inv_freq"},
            "versions": versions(),
            "n_layers": L,
            "high_fraction": fraction,
            "high_count": count,
            "prompts": [{"name": names[p], "n_tokens": len(prompts[p]), "loss_reference": ref_losses[p],
                         "loss_kvbench": kv_losses[p], "loss_abs_diff": abs(ref_losses[p] - kv_losses[p]),
                         "max_rel_s_k": max(rel_pk[p]), "max_rel_s_v": max(rel_pv[p]),
                         "s_k_reference": ref_pk[p], "s_v_reference": ref_pv[p]} for p in range(P)],
            "s_k_reference": ref_sk,
            "s_v_reference": ref_sv,
            "rel_s_k": rel_k,
            "rel_s_v": rel_v,
            "max_rel_s_k": max(rel_k),
            "max_rel_s_v": max(rel_v),
            "max_rel_s_k_per_prompt": max(map(max, rel_pk)),
            "max_rel_s_v_per_prompt": max(map(max, rel_pv)),
            "max_loss_abs_diff": max(abs(a - b) for a, b in zip(ref_losses, kv_losses)),
            "high_k": high["high_k"],
            "high_v": high["high_v"],
            "identical_sets": high["high_k"]["identical"] and high["high_v"]["identical"],
            "problems": problems,
        }
        d = os.path.dirname(os.path.abspath(args.summary))
        os.makedirs(d, exist_ok=True)
        with open(args.summary + ".tmp", "w", encoding="ascii", newline="\n") as f:
            json.dump(summary, f, ensure_ascii=True, sort_keys=True, separators=(",", ":"))
            f.write("\n")
        os.replace(args.summary + ".tmp", args.summary)
        print("summary %s" % args.summary)
    if problems:
        sys.exit(1)


if __name__ == "__main__":
    main()
