#!/usr/bin/env python3
"""GPTQ-style perplexity of a text with transformers, for test_perplexity.cpp.

The text: the first three Paul Graham essays (file-name order) of the set-up data, joined by blank
lines and cut to 20,000 characters. It is tokenized once (transformers' tokenizer of the default GGUF,
with SmolLM2's own Digits + ByteLevel pre-tokenizer restored and no BOS, as the GGUF's
tokenizer.ggml.add_bos_token says), cut into consecutive windows of SEQ_LEN tokens, and each window's
mean next-token negative log-likelihood is computed as GPTQ's evaluation loop does (the model's logits
of the window, shifted by one, cross-entropy averaged over its SEQ_LEN - 1 targets); transformers
4.57.1, float32, eager attention, the GGUF dequantized.

Output tasks/perplexity/fixtures/transformers_nll.json: the text's length, the window length, the
token count, and per window its mean NLL and first ids.

    python3 tasks/perplexity/reference.py --data DIR [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
    (needs: pip install torch transformers==4.57.1 gguf)

Under transformers 5.25.0 (torch 2.15, numpy 2.4) the script gives the same tokens and windows and
window NLLs within 1e-6 of the fixture's (the test allows 2e-4).
"""
import argparse
import json
import pathlib
import sys
from importlib.metadata import version

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT / "tools/reference"))
import smollm2_hf  # noqa: E402  (the GGUF with SmolLM2's own tokenizer rules, as kvbench encodes)

OUT = ROOT / "tasks/perplexity/fixtures/transformers_nll.json"
SEQ_LEN = 256
CHARS = 20000


def text_of(data):
    files = sorted((data / "PaulGrahamEssays").glob("*.txt"))[:3]
    return "\n\n".join(f.read_text(encoding="utf-8") for f in files)[:CHARS]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, type=pathlib.Path)
    ap.add_argument("--gguf", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()
    path = pathlib.Path(args.gguf)
    tok, model = smollm2_hf.load(path)
    ids = tok(text_of(args.data), add_special_tokens=False, return_tensors="pt").input_ids
    windows = []
    with torch.no_grad():
        for w in range(ids.shape[1] // SEQ_LEN):
            x = ids[:, w * SEQ_LEN:(w + 1) * SEQ_LEN]
            logits = model(x).logits.float()
            nll = torch.nn.functional.cross_entropy(logits[0, :-1], x[0, 1:]).item()
            windows.append({"nll": nll, "first_ids": x[0, :8].tolist()})
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps({"transformers": version("transformers"), "model": path.name, "chars": CHARS, "seq_len": SEQ_LEN,
                               "tokens": int(ids.shape[1]), "windows": windows}, indent=1) + "\n")
    print(len(windows), "windows;", [round(w["nll"], 4) for w in windows])


if __name__ == "__main__":
    main()
