#!/usr/bin/env python3
"""kvpress's question-after-compression protocol on the default model, for tests/test_protocol.cpp.

Runs kvpress's own pipeline ("kv-press-text-generation", kvpress 0.5.2 = commit 91773cb's
pipeline.py) on the default GGUF (transformers 4.57, float32): for each of six samples (a context,
a question and an answer prefix) its preprocess step gives the context ids (the chat template
rendered over the context and cut where it ends) and the question ids (question, the rest of the
rendering, answer prefix), and the pipeline answers with KeyDiffPress at three compression ratios
and with no press: prefill the context under the press, then the question over the compressed
cache, then greedy decoding to max_new_tokens or the end of generation.

Output tests/fixtures/kvpress_pipeline.json: per sample its parts, the ids, and per run the answer.

    python3 tools/reference/kvpress_pipeline.py   (needs: pip install kvpress==0.5.2 transformers==4.57.1 gguf)
"""
import argparse
import glob
import json
import os
import pathlib
from importlib.metadata import version

import torch
from kvpress import KeyDiffPress
from transformers import AutoModelForCausalLM, AutoTokenizer, pipeline

ROOT = pathlib.Path(__file__).resolve().parents[2]
RATIOS = [0.25, 0.5, 0.75]
MAX_NEW = 24


def samples(tok, data):
    """Six contexts of 500-1,600 tokens (essays, LongBench passages) with a question and a prefix."""
    essays = [open(p).read() for p in sorted(glob.glob(str(data / "PaulGrahamEssays/*.txt")))]
    out = []
    for i, n in enumerate((500, 900, 1300)):
        ids = tok(essays[i], add_special_tokens=False)["input_ids"][:n]
        out.append({"context": tok.decode(ids), "question": "What is the main point of the essay above?",
                    "answer_prefix": "Answer:"})
    with open(data / "longbench/multi_news.jsonl") as f:
        rows = [json.loads(next(f)) for _ in range(3)]
    for row, n in zip(rows, (700, 1100, 1600)):
        ids = tok(row["context"], add_special_tokens=False)["input_ids"][:n]
        out.append({"context": "News:\n" + tok.decode(ids) + "\n\n",
                    "question": "Now, write a one-sentence summary of the news.\n\n", "answer_prefix": "Summary:"})
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--data", default=os.environ.get("KVBENCH_DATA", str(ROOT / "data")))
    ap.add_argument("--out", default=str(ROOT / "tests/fixtures/kvpress_pipeline.json"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    path = pathlib.Path(args.gguf)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32).eval()
    pipe = pipeline("kv-press-text-generation", model=model, tokenizer=tok, device="cpu")
    import transformers
    out = {"model": path.name, "max_new_tokens": MAX_NEW, "press": "KeyDiffPress",
           "versions": {"kvpress": version("kvpress"), "torch": torch.__version__, "transformers": transformers.__version__},
           "samples": []}
    for s in samples(tok, pathlib.Path(args.data)):
        pre = pipe.preprocess(s["context"], [s["question"]], s["answer_prefix"], max_context_length=10**9)
        rec = dict(s, context_ids=pre["context_ids"][0].tolist(), question_ids=pre["questions_ids"][0][0].tolist(),
                   runs=[])
        for ratio in [0.0] + RATIOS:
            press = KeyDiffPress(compression_ratio=ratio) if ratio else None
            answer = pipe(s["context"], question=s["question"], answer_prefix=s["answer_prefix"], press=press,
                          max_new_tokens=MAX_NEW)["answer"]
            rec["runs"].append({"compression_ratio": ratio, "answer": answer})
        out["samples"].append(rec)
        print(len(rec["context_ids"]), len(rec["question_ids"]), [r["answer"][:30] for r in rec["runs"]], flush=True)
    pathlib.Path(args.out).write_text(json.dumps(out, indent=1) + "\n")


if __name__ == "__main__":
    main()
