#!/usr/bin/env python3
"""Independent reference for the token sets SnapKV, PyramidKV and H2O keep, on Hugging Face.

Runs transformers on the default GGUF (float32, eager attention), captures every layer's post-RoPE
queries and keys (patching the eager attention function, before K/V are repeated for GQA), and
re-implements the selection rules of the reference repositories (KVCache-Factory @ffac160 /
FasterDecoding SnapKV, as methods/h2o/README.md, methods/snapkv/README.md and methods/pyramidkv/README.md
restate them):

  window scores: last w queries, logits q.k/sqrt(D) over all S keys, causal inside the window,
                 softmax in float32, summed over the window rows, prefix [0, S-w) only;
  SnapKV:        max pool (kernel 7, stride 1, padding 3) per query head; repeat mode keeps, per
                 query head, the top T-w prefix tokens plus the window; native mode averages the
                 pooled scores over each KV head's query heads first;
  PyramidKV:     SnapKV scores, per-layer count from the floored schedule (beta 20);
  H2O:           column sums of the causal attention of all S queries, no pooling, top T-w + window.
Ties go to the lower position. Kept positions are sorted.

Output tests/fixtures/methods/selection.json: per prompt its ids and, per configuration, per layer
and stored head the FNV-1a 64-bit hash of the kept positions (int32 little-endian bytes), with the
full lists for layers 0, 10, 20 and 29.

    python3 tools/reference/kv_selection.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
"""
import argparse
import glob
import json
import math
import os
import pathlib
import struct

import numpy as np
import torch
import torch.nn.functional as F
import transformers.models.llama.modeling_llama as ml
from transformers import AutoModelForCausalLM, AutoTokenizer

ROOT = pathlib.Path(__file__).resolve().parents[2]
# Set-up's data, or $KVBENCH_DATA: PaulGrahamEssays/ and longbench/{multi_news,multifieldqa_zh}.jsonl.
DATA = pathlib.Path(os.environ.get("KVBENCH_DATA", ROOT / "data"))
W, T, KERNEL, BETA = 8, 64, 7, 20
FULL_LAYERS = [0, 10, 20, 29]
CONFIGS = ["snapkv_repeat", "snapkv_native", "pyramidkv_repeat", "h2o_repeat"]


def fnv1a(positions):
    h = 14695981039346656037
    for b in struct.pack("<%di" % len(positions), *positions):
        h = ((h ^ b) * 1099511628211) & 0xFFFFFFFFFFFFFFFF
    return str(h)


def topk_sorted(scores, k):
    # Largest first, ties to the lower position; then ascending positions.
    order = np.lexsort((np.arange(len(scores)), -scores.astype(np.float64)))
    return sorted(order[:k].tolist())


def window_scores(q, k, w):
    """q [Hq, S, D], k [Hkv, S, D] -> [Hq, S-w] summed window attention."""
    hq, S, D = q.shape
    G = hq // k.shape[0]
    kk = k.repeat_interleave(G, dim=0)
    z = torch.einsum("hid,hjd->hij", q[:, S - w:], kk) / math.sqrt(D)
    mask = torch.arange(S)[None, :] > (S - w + torch.arange(w))[:, None]
    z = z.masked_fill(mask[None], float("-inf"))
    p = torch.softmax(z.float(), dim=-1)
    return p.sum(dim=1)[:, : S - w]


def accumulated_scores(q, k, w):
    hq, S, D = q.shape
    G = hq // k.shape[0]
    out = torch.zeros(hq, S)
    causal = torch.triu(torch.ones(S, S, dtype=torch.bool), diagonal=1)
    for h in range(hq):
        z = (q[h] @ k[h // G].T) / math.sqrt(D)
        z = z.masked_fill(causal, float("-inf"))
        out[h] = torch.softmax(z.float(), dim=-1).sum(dim=0)
    return out[:, : S - w]


def pyramid_caps(S, L):
    b = T - W
    if S < 2 * b:
        return [b] * L
    min_num = b // BETA
    max_num = 2 * b - min_num
    if max_num >= S - W:
        max_num = S - W
        min_num = 2 * b - max_num
    steps = (max_num - min_num) // (L - 1)
    return [max_num - l * steps for l in range(L)]


def select(scores, k, S):
    window = list(range(S - W, S))
    return [topk_sorted(s.numpy(), k) + window for s in scores]


def prompts(tok):
    texts = []
    essays = sorted(glob.glob(str(DATA / "PaulGrahamEssays/*.txt")))
    essay_text = " ".join(open(p).read() for p in essays[:12])
    for n in (1000, 1200, 1500, 1800, 2000, 2500, 3000, 4000):
        ids = tok(essay_text, add_special_tokens=False)["input_ids"][: n - 20]
        q = tok("\n\nQuestion: What is the main point of the essay?\nAnswer:", add_special_tokens=False)["input_ids"]
        texts.append(ids + q)
    for name, n in (("multi_news", 2200), ("multifieldqa_zh", 3500)):
        row = json.loads(open(DATA / f"longbench/{name}.jsonl").readline())
        ids = tok(row["context"], add_special_tokens=False)["input_ids"]
        q = tok("\n\n" + row["input"] + "\nAnswer:", add_special_tokens=False)["input_ids"]
        texts.append(ids[-(n - len(q)):] + q)
    return texts


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--out", default=str(ROOT / "tests/fixtures/methods/selection.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    path = pathlib.Path(args.gguf)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    L = model.config.num_hidden_layers
    captured = {}
    original = ml.eager_attention_forward

    def capture(module, query, key, value, *a, **kw):
        captured[module.layer_idx] = (query[0].detach().clone(), key[0].detach().clone())
        return original(module, query, key, value, *a, **kw)

    ml.eager_attention_forward = capture
    out = {"model": path.name, "window": W, "budget": T, "kernel": KERNEL, "beta": BETA,
           "versions": {"torch": torch.__version__, "transformers": __import__("transformers").__version__},
           "full_layers": FULL_LAYERS, "prompts": []}
    for ids in prompts(tok):
        captured.clear()
        with torch.no_grad():
            model(torch.tensor([ids]), use_cache=False)
        S = len(ids)
        caps = pyramid_caps(S, L)
        entry = {"ids": ids, "configs": {c: {"hash": [], "count": [], "full": {}} for c in CONFIGS}}
        for l in range(L):
            q, k = captured[l]
            G = q.shape[0] // k.shape[0]
            pooled = F.max_pool1d(window_scores(q, k, W)[:, None], KERNEL, 1, KERNEL // 2)[:, 0]
            native = pooled.view(k.shape[0], G, -1).mean(dim=1)
            kept = {
                "snapkv_repeat": select(pooled, T - W, S),
                "snapkv_native": select(native, T - W, S),
                "pyramidkv_repeat": select(pooled, caps[l], S),
                "h2o_repeat": select(accumulated_scores(q, k, W), T - W, S),
            }
            for c in CONFIGS:
                e = entry["configs"][c]
                e["hash"].append([fnv1a(p) for p in kept[c]])
                e["count"].append([len(p) for p in kept[c]])
                if l in FULL_LAYERS:
                    e["full"][str(l)] = kept[c]
        out["prompts"].append(entry)
        print(f"prompt of {S} tokens done", flush=True)
    pathlib.Path(args.out).write_text(json.dumps(out, separators=(",", ":")))
    print("wrote", args.out)


if __name__ == "__main__":
    main()
