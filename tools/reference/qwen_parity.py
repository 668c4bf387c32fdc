#!/usr/bin/env python3
"""Golden tokenizer ids, logits and greedy continuations for Qwen2.5-Coder-0.5B-Instruct (AWQ Q4_K_M GGUF).

The second default model's counterpart of hf_logits.py (SmolLM2). Reference: Hugging Face
transformers running the GGUF itself. transformers' GGUF loader dequantizes every tensor (F32,
Q4_K, Q5_0, Q6_K, Q8_0) to float32 with gguf-py and builds a Qwen2ForCausalLM, so the reference
sees exactly the weights kvbench's default fp32 weight mode reads, and computes in float32.

Settings: dtype=torch.float32, attn_implementation="eager", model.eval(), torch.set_num_threads(2),
torch.no_grad(). No BOS is added (add_special_tokens=False; the GGUF says add_bos_token false).

Writes one file, tests/fixtures/engine/qwen_parity.json (compact ASCII JSON, ensure_ascii):
  tokenizer: 12 varied texts (English, Chinese, digits, code with tabs and indentation, emoji,
      whitespace runs, special-token text, NFD text, ...) with their ids (add_special_tokens=False;
      special-token text is matched as the special token, the library default). The ids come from a
      tokenizers.Tokenizer built here from the GGUF vocab and merges in the layout of Qwen2.5's own
      tokenizer.json (NFC normalizer, Split(Qwen2 regex, isolated), ByteLevel without regex, control
      tokens as special added tokens, user-defined ones as added tokens), and every text is also
      encoded by transformers' AutoTokenizer.from_pretrained(dir, gguf_file=name): "ref_tok_match"
      records whether the two agree, and where they do not, "hf_gguf_ids" holds transformers' ids.
      They differ only on the NFD line: transformers' GGUF tokenizer (5.24) has no normalizer,
      while Qwen2.5's tokenizer.json and transformers' own Qwen2Tokenizer class apply NFC.
      "decoded" is given where decoding the ids (specials kept) does not give the text back.
  probe_ids: 16 fixed ids (common tokens, a CJK token, specials, the last padding row 151935).
  prompts: 4 prompts:
      plain_code    plain text (a Python snippet), no template;
      chat_default  one user message through apply_chat_template(add_generation_prompt=True): the
                    template adds its default system message "You are Qwen, created by Alibaba
                    Cloud. You are a helpful assistant.";
      chat_system   a system message + a Chinese user message, add_generation_prompt=True;
      long_prose    ~1000 tokens of hf_logits.py's generated chronicle (plain text).
    Per prompt: name, kind, messages (chat ones), text (the rendered text that was tokenized), ids
    (the reference tokenizer's; ref_tok_match: transformers' are the same), n; top20 [[id, logit]] of the last position (ties to the lower id); max_abs_logit of the last
    position (over the whole vocabulary); probes: at positions {0, n // 2, n - 1}: pos, argmax,
    argmax_logit, margin (top1 - top2), max_abs_logit and the logits of probe_ids (all from one forward over the whole
    prompt, use_cache=False, logits_to_keep=those positions).
    Chat prompts also: greedy (16 ids: model.generate, do_sample=False, exactly 16 new tokens,
    eos_token_id=None so nothing stops or is masked), greedy_margins (top1 - top2 of each step's raw
    logits), greedy_text, and tf_greedy_agree / tf_max_abs_diff: the same 16 steps recomputed by
    one forward over prompt + greedy[:15] without a cache.
  Every logit is a float32 value written as the shortest float64 repr (reads back bit-exactly).
  Timings go to stdout only, so two runs give the same bytes.

Usage (from the repo root; torch, transformers 5.x, accelerate, gguf, tokenizers):
    python3 tools/reference/qwen_parity.py \
        [--gguf models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf] \
        [--out tests/fixtures/engine/qwen_parity.json]
About 3 minutes and 4 GB of memory on 2 cores (most of the time loading the tokenizer and the model).
"""

import argparse
import json
import os
import platform
import sys
import time
from importlib.metadata import version as pkg_version

import numpy as np

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import hf_logits as hl  # noqa: E402  (chronicle text, CODE_PY, sha256_file, f32, top_k, margin)

REPO_ROOT = hl.REPO_ROOT
MODEL_SHA256 = "1d9614638d18024d0fbb36575a15f1302a3adf044df10345688ec4f6e1c4ff32"
VOCAB = 151936
N_NEW = 16
TOP_K = 20

# Tokenizer texts: one line each of the kinds the Qwen2 pre-tokenizer treats differently.
TOKENIZER_TEXTS = [
    ("english", "The quick brown fox jumps over the lazy dog. It's 5 o'clock; isn't it? "
                "WE'LL see, they'd said, and I'M sure you've heard."),
    ("chinese", "你好，世界！今天天气很好，我们去公园散步吧。长城是中国古代最伟大的工程之一，全长两万多公里。"),
    ("digits", "12345 3.14159 1,000,000 2024-11-26 v1.2.3 0x1F3A -42e-7 ١٢٣ ½ ²"),
    ("code_python", "def add(a, b):\n    \"\"\"Sum.\"\"\"\n    if a is None:\n        return b\n"
                    "\treturn a + b  # tab-indented\n\n\nclass Foo:\n    pass\n"),
    ("code_c_tabs", "int main(void) {\n\tfor (int i = 0; i < 10; ++i) {\n\t\tprintf(\"%d\\n\", i);\n"
                    "\t}\n\treturn 0;\n}\r\n"),
    ("emoji", "I love 🍕 and 🚀! Family: 👨‍👩‍👧‍👦, thumbs 👍🏽, flag 🇯🇵, 😀😀😀"),
    ("whitespace", "a  b   c    d\n\n\n  \t  e\r\n\r\n   42 \t7\u00a0\u3000x   "),
    ("special_tokens", "<|im_start|>user\nhi<|im_end|>\n<|endoftext|><|fim_prefix|>def f():"
                       "<|fim_suffix|>\n<|fim_middle|> <|im_start <|IM_END|>"),
    ("mixed_scripts", "Привет, мир! Γειά σου κόσμε. مرحبا بالعالم. नमस्ते दुनिया. 日本語のテキスト、ｶﾀｶﾅ。한국어 문장."),
    ("nfd", "cafe\u0301 nai\u0308ve A\u030angstro\u0308m"),
    ("punct_url", "https://example.com/a/b?q=1&r=2#frag -- \u201cquoted\u201d \u2018x\u2019 \u2026 "
                  "!!! ??? ... ===> [[nested]] {\"k\": [1, 2]}"),
    ("long_run", "aaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaaa ================================ "
                 "0000000000 ____init____ supercalifragilisticexpialidocious"),
]

# Single-token strings whose logits are recorded at the probe positions, then fixed ids.
PROBE_STRINGS = ["\n", " ", ",", ".", " the", "The", " def", "    ", "(", " Paris", "的", "```"]
PROBE_FIXED = [151643, 151644, 151645]  # <|endoftext|>, <|im_start|>, <|im_end|>
PROBE_PADDING = 151935  # the last row of the padded vocabulary (no token string behind it)

CHAT_DEFAULT = [{"role": "user", "content": "Write a Python function that checks whether a number is prime."}]
CHAT_SYSTEM = [{"role": "system", "content": "You are a patient teacher. Answer in Chinese."},
               {"role": "user", "content": "请用三句话解释什么是递归，并举一个例子。"}]


def build_reference_qwen2(gguf_path):
    """A tokenizers.Tokenizer in Qwen2.5's tokenizer.json layout, built from the GGUF's vocab."""
    import gguf
    from tokenizers import AddedToken, Regex, Tokenizer, decoders, models, normalizers, pre_tokenizers
    from transformers.models.qwen2.tokenization_qwen2 import PRETOKENIZE_REGEX

    r = gguf.GGUFReader(gguf_path)
    tokens = r.fields["tokenizer.ggml.tokens"].contents()
    types = [int(t) for t in r.fields["tokenizer.ggml.token_type"].contents()]
    merges = [tuple(m.split(" ")) for m in r.fields["tokenizer.ggml.merges"].contents()]
    assert r.fields["tokenizer.ggml.pre"].contents() == "qwen2"
    vocab = {t: i for i, t in enumerate(tokens)}
    tk = Tokenizer(models.BPE(vocab=vocab, merges=merges, unk_token=None, fuse_unk=False,
                              byte_fallback=False, ignore_merges=False))
    tk.normalizer = normalizers.NFC()
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Split(Regex(PRETOKENIZE_REGEX), behavior="isolated", invert=False),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False)])
    tk.decoder = decoders.ByteLevel()
    control = int(gguf.TokenType.CONTROL)
    user = int(gguf.TokenType.USER_DEFINED)
    added = [AddedToken(tokens[i], special=types[i] == control, normalized=False)
             for i in range(len(tokens)) if types[i] in (control, user)]
    tk.add_special_tokens([a for a in added if a.special])
    tk.add_tokens([a for a in added if not a.special])
    return tk


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(REPO_ROOT, "models/qwen2.5-coder-0.5b-instruct-awq-q4_k_m.gguf"))
    ap.add_argument("--out", default=os.path.join(REPO_ROOT, "tests/fixtures/engine/qwen_parity.json"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gdir, gname = os.path.split(os.path.abspath(args.gguf))

    t0 = time.time()
    model_sha = hl.sha256_file(args.gguf)
    if model_sha != MODEL_SHA256:
        print("WARNING: model sha256 %s, expected %s" % (model_sha, MODEL_SHA256), file=sys.stderr)
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    ref = build_reference_qwen2(args.gguf)
    print("tokenizers loaded in %.1fs (%s)" % (time.time() - t0, type(tok).__name__), flush=True)

    def hf_ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    def ref_ids(text):
        return ref.encode(text, add_special_tokens=False).ids

    # (a) Tokenizer texts.
    tok_rows = []
    for name, text in TOKENIZER_TEXTS:
        ids, hf = ref_ids(text), hf_ids(text)
        row = {"name": name, "text": text, "ids": ids, "ref_tok_match": ids == hf}
        if hf != ids:
            row["hf_gguf_ids"] = hf
        dec = ref.decode(ids, skip_special_tokens=False)
        if dec != text:
            row["decoded"] = dec
        tok_rows.append(row)

    probe_ids = []
    for s in PROBE_STRINGS:
        ids = hf_ids(s)
        assert len(ids) == 1, (s, ids)
        probe_ids.append(ids[0])
    probe_ids += PROBE_FIXED + [PROBE_PADDING]
    assert len(probe_ids) == 16 and len(set(probe_ids)) == 16, probe_ids

    # (b) Prompts.
    def chat(msgs):
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    cursor = hl.ProseCursor(hl.chronicle())
    prompts = [
        {"name": "plain_code", "kind": "plain", "text": hl.CODE_PY},
        {"name": "chat_default", "kind": "chat", "messages": CHAT_DEFAULT, "text": chat(CHAT_DEFAULT)},
        {"name": "chat_system", "kind": "chat", "messages": CHAT_SYSTEM, "text": chat(CHAT_SYSTEM)},
        {"name": "long_prose", "kind": "plain", "text": cursor.take(lambda s: len(hf_ids(s)), 1000)},
    ]
    for p in prompts:
        p["ids"] = ref_ids(p["text"])
        p["n"] = len(p["ids"])
        p["ref_tok_match"] = p["ids"] == hf_ids(p["text"])

    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    print("model loaded in %.1fs (%s)" % (time.time() - t0, type(model).__name__), flush=True)
    assert model.config.vocab_size == VOCAB
    model.generation_config.eos_token_id = None

    with torch.no_grad():
        for p in prompts:
            ts = time.time()
            ids, n = p["ids"], p["n"]
            x = torch.tensor([ids], dtype=torch.long)
            positions = sorted({0, n // 2, n - 1})
            out = model(input_ids=x, use_cache=False, logits_to_keep=torch.tensor(positions))
            rows = out.logits[0].float().numpy().astype(np.float32)
            assert rows.shape == (len(positions), VOCAB)
            last = rows[-1]
            p["top20"] = hl.top_k(last, TOP_K)
            p["max_abs_logit"] = hl.f32(np.max(np.abs(last)))
            p["probes"] = []
            for pos, row in zip(positions, rows):
                a = int(np.argmax(row))
                p["probes"].append({"pos": pos, "argmax": a, "argmax_logit": hl.f32(row[a]),
                                    "margin": hl.margin(row), "max_abs_logit": hl.f32(np.max(np.abs(row))),
                                    "logits": [hl.f32(row[i]) for i in probe_ids]})
            if p["kind"] == "chat":
                g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                                   max_new_tokens=N_NEW, min_new_tokens=N_NEW, eos_token_id=None,
                                   pad_token_id=151643, output_logits=True, return_dict_in_generate=True,
                                   num_beams=1, temperature=None, top_p=None, top_k=None)
                new = g.sequences[0, n:].tolist()
                steps = [s[0].float().numpy().astype(np.float32) for s in g.logits]
                assert len(new) == N_NEW and len(steps) == N_NEW
                for i, s in enumerate(steps):
                    assert int(np.argmax(s)) == new[i], (p["name"], i)
                # Step 0 of the cached path is the prompt forward's last row.
                assert int(np.argmax(steps[0])) == int(np.argmax(last))
                xt = torch.tensor([ids + new[:-1]], dtype=torch.long)
                tf = model(input_ids=xt, use_cache=False, logits_to_keep=N_NEW).logits[0].float().numpy()
                p["greedy"] = new
                p["greedy_margins"] = [hl.margin(s) for s in steps]
                p["greedy_text"] = tok.decode(new, skip_special_tokens=False)
                p["tf_greedy_agree"] = [int(a) for a in tf.argmax(-1)] == new
                p["tf_max_abs_diff"] = max(float(np.max(np.abs(tf[i] - steps[i]))) for i in range(N_NEW))
            print("%-13s n=%5d %6.1fs top1=%d (%.4f) probes=%s %s" % (
                p["name"], n, time.time() - ts, p["top20"][0][0], p["top20"][0][1],
                [(q["argmax"], round(q["margin"], 4)) for q in p["probes"]],
                ("greedy min margin %.4f tf_agree=%s tf_diff=%.2e %r" % (
                    min(p["greedy_margins"]), p["tf_greedy_agree"], p["tf_max_abs_diff"], p["greedy_text"]))
                if "greedy" in p else ""), flush=True)

    versions = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "accelerate", "tokenizers", "gguf", "numpy"):
        try:
            versions[pkg] = pkg_version(pkg)
        except Exception:
            versions[pkg] = None
    order = ["name", "kind", "n", "top20", "max_abs_logit", "probes", "greedy", "greedy_margins",
             "greedy_text", "tf_greedy_agree", "tf_max_abs_diff", "ref_tok_match", "messages", "text", "ids"]
    doc = {
        "model_file": gname,
        "model_sha256": model_sha,
        "versions": versions,
        "settings": {
            "loader": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=...), dequantized to float32",
            "dtype": "float32", "attn_implementation": "eager", "torch_threads": args.threads,
            "add_special_tokens": False, "bos_added": False,
            "prompt_forward": "single forward over the prompt, use_cache=False, logits at positions "
                              "{0, n//2, n-1}",
            "generation": "greedy, exactly 16 new tokens, no EOS stop or masking, KV cache (DynamicCache)",
            "tokenizer": "ids from a tokenizers.Tokenizer in Qwen2.5's tokenizer.json layout (NFC, Qwen2 "
                         "split regex, ByteLevel) built from the GGUF; ref_tok_match: transformers' "
                         "AutoTokenizer from the GGUF gives the same ids (else hf_gguf_ids holds its ids)",
        },
        "probe_ids": probe_ids,
        "probe_tokens": [tok.convert_ids_to_tokens(i) for i in probe_ids],
        "tokenizer": tok_rows,
        "prompts": [{k: p[k] for k in order if k in p} for p in prompts],
    }
    with open(args.out + ".tmp", "w", encoding="ascii", newline="\n") as f:
        json.dump(doc, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")
    os.replace(args.out + ".tmp", args.out)

    bad_tok = [r["name"] for r in tok_rows if not r["ref_tok_match"]]
    bad_tok += [p["name"] for p in prompts if not p["ref_tok_match"]]
    if any(not p["ref_tok_match"] for p in prompts):
        print("WARNING: transformers' GGUF tokenizer differs on a prompt", file=sys.stderr)
    print(json.dumps({"model_sha256": model_sha, "bytes": os.path.getsize(args.out),
                      "lengths": [p["n"] for p in prompts], "probe_ids": probe_ids,
                      "ref_tok_mismatch": bad_tok, "not_round_trip": [r["name"] for r in tok_rows
                                                                       if "decoded" in r],
                      "versions": versions}, indent=1))


if __name__ == "__main__":
    main()
