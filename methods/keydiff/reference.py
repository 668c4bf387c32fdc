#!/usr/bin/env python3
"""KeyDiff's kept sets and greedy tokens from kvpress's own KeyDiffPress, for test_keydiff.cpp.

Runs transformers (float32) on the default GGUF under kvpress's KeyDiffPress (kvpress 0.5.2, the
package of commit 91773cb that the VECTOR paper used; its presses and pipeline are that commit's
files), the way kvpress's pipeline runs a prefill press: the prompt is prefilled inside the press's
context manager, which compresses each layer's cache in a forward hook; then greedy decoding
continues outside it, positions counting on from the uncompressed length. The kept positions are
read from the press's own scores with its own rule (scores.topk(int(S (1 - ratio)))), recorded by
wrapping KeyDiffPress.score.

Output methods/keydiff/fixtures/kvpress_keydiff.json: per prompt its ids and, per compression ratio,
per layer and KV head the FNV-1a 64-bit hash of the sorted kept positions (int32 little-endian),
and the greedy tokens.

    python3 methods/keydiff/reference.py --data DIR [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
    (needs: pip install kvpress==0.5.2 gguf)
"""
import argparse
import glob
import json
import pathlib
import sys
from importlib.metadata import version

import torch
from kvpress import KeyDiffPress
from transformers import AutoModelForCausalLM, AutoTokenizer, DynamicCache

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools/reference"))
from kv_selection import fnv1a  # noqa: E402  (kept sets hashed as the other reference scripts do)

RATIOS = [0.25, 0.5, 0.75]
GREEDY = 12



def prompts(tok, data):
    """Six prompts of 600-2600 tokens: essays and LongBench contexts, each with a question."""
    out = []
    essays = sorted(glob.glob(str(data / "PaulGrahamEssays/*.txt")))
    text = " ".join(open(p).read() for p in essays[:8])
    q = tok("\n\nQuestion: What is the main point of the essay?\nAnswer:", add_special_tokens=False)["input_ids"]
    for n in (600, 1100, 1700):
        out.append(tok(text, add_special_tokens=False)["input_ids"][: n - len(q)] + q)
    for name, line, n in (("multi_news", 0, 1400), ("multi_news", 1, 2000), ("multifieldqa_zh", 0, 2600)):
        with open(data / f"longbench/{name}.jsonl") as f:
            row = json.loads(f.readlines()[line])
        ids = tok(row["context"], add_special_tokens=False)["input_ids"]
        qq = tok("\n\n" + row["input"] + "\nAnswer:", add_special_tokens=False)["input_ids"]
        out.append(ids[-(n - len(qq)):] + qq)
    return out


def run(model, ids, ratio):
    kept = {}
    press = KeyDiffPress(compression_ratio=ratio)
    score = press.score

    def recording_score(module, hidden_states, keys, values, attentions, kwargs):
        s = score(module, hidden_states, keys, values, attentions, kwargs)
        n_kept = int(keys.shape[2] * (1 - ratio))  # ScorerPress.compress's count
        idx = s.topk(n_kept, dim=-1).indices[0]
        kept[module.layer_idx] = [sorted(h.tolist()) for h in idx]
        return s

    press.score = recording_score
    cache = DynamicCache()
    S = len(ids)
    with torch.no_grad():
        with press(model):
            out = model(torch.tensor([ids]), past_key_values=cache, use_cache=True)
        tokens = [int(out.logits[0, -1].argmax())]
        for i in range(GREEDY - 1):
            out = model(torch.tensor([[tokens[-1]]]), past_key_values=cache, position_ids=torch.tensor([[S + i]]),
                        use_cache=True)
            tokens.append(int(out.logits[0, -1].argmax()))
    layers = [kept[l] for l in sorted(kept)]
    return {"compression_ratio": ratio, "hash": [[fnv1a(h) for h in heads] for heads in layers], "greedy": tokens}


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--data", required=True,
                    help="a directory with PaulGrahamEssays/ and longbench/{multi_news,multifieldqa_zh}.jsonl")
    ap.add_argument("--out", default=str(ROOT / "methods/keydiff/fixtures/kvpress_keydiff.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    path = pathlib.Path(args.gguf)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    import transformers
    out = {"model": path.name, "ratios": RATIOS,
           "versions": {"kvpress": version("kvpress"),
                        "torch": torch.__version__, "transformers": transformers.__version__},
           "prompts": []}
    for ids in prompts(tok, pathlib.Path(args.data)):
        out["prompts"].append({"ids": ids, "runs": [run(model, ids, r) for r in RATIOS]})
        print(len(ids), [r["greedy"][:4] for r in out["prompts"][-1]["runs"]], flush=True)
    pathlib.Path(args.out).write_text(json.dumps(out, separators=(",", ":")) + "\n")


if __name__ == "__main__":
    main()
