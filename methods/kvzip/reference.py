#!/usr/bin/env python3
"""KVzip's kept sets and greedy tokens from kvpress's own KVzipPress, for test_kvzip.cpp.

Runs transformers (float32, sdpa attention) on the default GGUF under kvpress's KVzipPress (kvpress
0.5.2, the package of commit 91773cb that the VECTOR paper used), as kvpress's pipeline runs it: the
context (the chat template's head and the context, cut where the context ends) is prefilled inside
the press's context manager, which then asks the model to repeat the context, scores every cached
token and masks the evicted ones head by head (its attention patch); the question, the rest of the
template and the greedy tokens follow over the masked cache. The kept positions are the complement
of each layer's `masked_key_indices`.

KVzipPress loads its tokenizer with AutoTokenizer.from_pretrained(config.name_or_path), which cannot
read a GGUF file; the script hands it the GGUF's tokenizer instead.

Output methods/kvzip/fixtures/kvpress_kvzip.json: per prompt its prefill ids and the ids fed after
compression and, per compression ratio, per layer and KV head the FNV-1a 64-bit hash of the sorted
kept positions (int32 little-endian), their count, and the greedy tokens.

    python3 methods/kvzip/reference.py --data DIR [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
    (needs: pip install kvpress==0.5.2 transformers==4.57.1 gguf)
"""
import argparse
import glob
import json
import pathlib
import sys
from importlib.metadata import version

import torch
import kvpress.presses.kvzip_press as kvzip_module
from kvpress import KVzipPress
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools/reference"))
from kv_selection import fnv1a  # noqa: E402  (kept sets hashed as the other reference scripts do)

RATIOS = [0.25, 0.5, 0.75]
GREEDY = 12



def split_prompt(tok, context, question):
    """kvpress's pipeline: the template over context + separator, cut at the separator."""
    sep = "#" * (len(context) + 10)
    text = tok.apply_chat_template([{"role": "user", "content": context + sep}], add_generation_prompt=True,
                                   tokenize=False)
    head, tail = text.split(sep)
    return (tok(head, add_special_tokens=False)["input_ids"], tok(question + tail, add_special_tokens=False)["input_ids"])


def prompts(tok, data):
    """Six contexts of about 600-2,200 tokens (the third over two of KVzip's 2,048-token chunks)."""
    out = []
    essays = sorted(glob.glob(str(data / "PaulGrahamEssays/*.txt")))
    text = " ".join(open(p).read() for p in essays[:8])
    words = text.split(" ")
    for n in (400, 800, 1500):
        out.append(split_prompt(tok, " ".join(words[:n]), "\n\nQuestion: What is the main point of the essay?"))
    for name, line, chars in (("multi_news", 0, 5000), ("multi_news", 1, 7000), ("multifieldqa_zh", 0, 1200)):
        with open(data / f"longbench/{name}.jsonl") as f:
            row = json.loads(f.readlines()[line])
        out.append(split_prompt(tok, row["context"][:chars], "\n\nQuestion: " + row["input"]))
    return out


def run(model, ids, after, ratio):
    press = KVzipPress(compression_ratio=ratio)
    cache = DynamicCache()
    with torch.no_grad():
        with press(model):
            model(input_ids=torch.tensor([ids]), past_key_values=cache, use_cache=True)
        S = len(ids)
        hashes, counts = [], []
        for layer in model.model.layers:
            _, heads, seq = layer.self_attn.masked_key_indices
            masked = [set() for _ in range(model.config.num_key_value_heads)]
            for h, j in zip(heads.tolist(), seq.tolist()):
                masked[h].add(j)
            kept = [[j for j in range(S) if j not in m] for m in masked]
            hashes.append([fnv1a(k) for k in kept])
            counts.append([len(k) for k in kept])
        out = model(input_ids=torch.tensor([after]), past_key_values=cache, use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        for _ in range(GREEDY - 1):
            out = model(input_ids=torch.tensor([[tokens[-1]]]), past_key_values=cache, use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
        for layer in model.model.layers:
            layer.self_attn.masked_key_indices = None
    return {"compression_ratio": ratio, "hash": hashes, "kept": counts, "greedy": tokens}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--data", required=True,
                    help="a directory with PaulGrahamEssays/ and longbench/{multi_news,multifieldqa_zh}.jsonl")
    ap.add_argument("--out", default=str(ROOT / "methods/kvzip/fixtures/kvpress_kvzip.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    path = pathlib.Path(args.gguf)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    kvzip_module.AutoTokenizer = type("GgufTokenizer", (), {"from_pretrained": staticmethod(lambda *a, **k: tok)})
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="sdpa").eval()
    import transformers
    out = {"model": path.name, "ratios": RATIOS,
           "versions": {"kvpress": version("kvpress"), "torch": torch.__version__, "transformers": transformers.__version__},
           "prompts": []}
    for ids, after in prompts(tok, pathlib.Path(args.data)):
        out["prompts"].append({"ids": ids, "after": after, "runs": [run(model, ids, after, r) for r in RATIOS]})
        print(len(ids), [r["greedy"][:4] for r in out["prompts"][-1]["runs"]], flush=True)
    pathlib.Path(args.out).parent.mkdir(parents=True, exist_ok=True)
    pathlib.Path(args.out).write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
