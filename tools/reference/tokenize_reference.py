#!/usr/bin/env python3
"""Produce golden token ids for the tokenizer corpus from reference libraries.

Three tokenizers are run over every corpus string (no BOS/EOS added):

  (a) transformers AutoTokenizer loaded straight from the SmolLM2 GGUF
      (transformers' own GGUF -> tokenizers conversion);
  (b) a tokenizers.Tokenizer assembled here from the GGUF vocab and merges
      (read with the `gguf` package) with the pre-tokenizer that SmolLM2's
      own Hugging Face tokenizer.json uses:
          Sequence[Digits(individual_digits=True),
                   ByteLevel(add_prefix_space=False, use_regex=True)]
      (llama.cpp calls this pre-tokenizer "smollm").  This is the reference
      for SmolLM2; control tokens (token_type 3) are special added tokens;
  (c) the Llama-3 tokenizer.json via tokenizers.Tokenizer.from_file.

Special-token strings in the text are matched as special tokens (the library
default); add_special_tokens=False only stops BOS/EOS insertion.

Outputs (in --outdir, default tests/fixtures/tokenizer/):
  smollm2_ids.jsonl         {"text", "ids"} per corpus line, from (b)
  llama3_ids.jsonl          {"text", "ids"} per corpus line, from (c)
      Either file gets an extra "decoded" key on a line only where decoding
      the ids (skip_special_tokens=False) does not give back the text.
  smollm2_hf_gguf_diffs.jsonl   every corpus line where (a) != (b)
  smollm2_chat.jsonl        apply_chat_template(tokenize=False) renderings for
                            5 conversations, plus "ids" of the text from (b)
  summary.json              counts, versions, side-experiment results

Usage (from the repo root):
    python3 tools/reference/tokenize_reference.py \
        [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf] \
        [--llama3 models/llama3-tokenizer/tokenizer.json] \
        [--corpus tests/fixtures/tokenizer/corpus.jsonl] [--outdir tests/fixtures/tokenizer]
"""

import argparse
import hashlib
import json
import os
import sys
from importlib.metadata import version as pkg_version

import gguf
from tokenizers import AddedToken, Tokenizer, decoders, models, pre_tokenizers

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
import make_tokenizer_corpus as corpus_mod  # noqa: E402  (chat conversations + hand renderer)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))

# gguf token_type values (llama.cpp's llama_token_type / gguf.TokenType).
TOKEN_TYPE_CONTROL = int(gguf.TokenType.CONTROL)            # 3
TOKEN_TYPE_USER_DEFINED = int(gguf.TokenType.USER_DEFINED)  # 4


def read_gguf_vocab(path):
    """Return (tokens, token_types, merges) from the GGUF tokenizer metadata."""
    reader = gguf.GGUFReader(path)
    model = reader.fields["tokenizer.ggml.model"].contents()
    if model != "gpt2":
        sys.exit("expected a byte-level BPE ('gpt2') GGUF tokenizer, got %r" % model)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = [int(t) for t in reader.fields["tokenizer.ggml.token_type"].contents()]
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    pre = reader.fields["tokenizer.ggml.pre"].contents() if "tokenizer.ggml.pre" in reader.fields else None
    return tokens, types, merges, pre


def build_reference_smollm2(tokens, types, merges, ignore_merges=False):
    """Tokenizer (b): SmolLM2's tokenizer.json layout rebuilt from GGUF data."""
    vocab = {tok: i for i, tok in enumerate(tokens)}
    if len(vocab) != len(tokens):
        sys.exit("duplicate token strings in GGUF vocab")
    # GGUF stores merges as "left right"; byte-level tokens never contain a
    # literal space (space is mapped to U+0120), so one split is unambiguous.
    merge_pairs = []
    for m in merges:
        left, right = m.split(" ")
        merge_pairs.append((left, right))
    bpe = models.BPE(vocab=vocab, merges=merge_pairs, unk_token=None, fuse_unk=False,
                     byte_fallback=False, ignore_merges=ignore_merges)
    tk = Tokenizer(bpe)
    tk.normalizer = None
    tk.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
    ])
    tk.decoder = decoders.ByteLevel()
    # Control tokens are special; user-defined ones are plain added tokens.
    # normalized=False / no strip: they match the raw text exactly.
    specials = [AddedToken(tokens[i], special=True, normalized=False, lstrip=False,
                           rstrip=False, single_word=False)
                for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL]
    user = [AddedToken(tokens[i], special=False, normalized=False)
            for i, t in enumerate(types) if t == TOKEN_TYPE_USER_DEFINED]
    tk.add_special_tokens(specials)
    if user:
        tk.add_tokens(user)
    # Adding tokens that already exist in the vocab must not renumber them.
    for i, t in enumerate(types):
        if t in (TOKEN_TYPE_CONTROL, TOKEN_TYPE_USER_DEFINED):
            assert tk.token_to_id(tokens[i]) == i, tokens[i]
    return tk


def load_hf_gguf_tokenizer(gguf_path):
    """Tokenizer (a): transformers' own GGUF conversion."""
    from transformers import AutoTokenizer
    d, name = os.path.split(os.path.abspath(gguf_path))
    return AutoTokenizer.from_pretrained(d, gguf_file=name)


def first_diff(a, b):
    for i, (x, y) in enumerate(zip(a, b)):
        if x != y:
            return i
    return min(len(a), len(b))


def write_jsonl(path, rows):
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True) + "\n")


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        h.update(f.read())
    return h.hexdigest()


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--llama3", default="models/llama3-tokenizer/tokenizer.json")
    ap.add_argument("--corpus", default=os.path.join(REPO_ROOT, "tests/fixtures/tokenizer/corpus.jsonl"))
    ap.add_argument("--outdir", default=os.path.join(REPO_ROOT, "tests/fixtures/tokenizer"))
    args = ap.parse_args()

    with open(args.corpus, encoding="ascii") as f:
        texts = [json.loads(line)["text"] for line in f]
    print("corpus: %d strings" % len(texts))

    # ---- SmolLM2: (a) transformers GGUF conversion vs (b) rebuilt reference ----
    tokens, types, merges, pre = read_gguf_vocab(args.gguf)
    ref = build_reference_smollm2(tokens, types, merges)
    hf = load_hf_gguf_tokenizer(args.gguf)

    ids_b = [e.ids for e in ref.encode_batch(texts, add_special_tokens=False)]
    ids_a = [hf(t, add_special_tokens=False)["input_ids"] for t in texts]

    diffs = []
    for text, a, b in zip(texts, ids_a, ids_b):
        if a != b:
            k = first_diff(a, b)
            diffs.append({
                "text": text,
                "ids_reference": b,
                "ids_transformers_gguf": a,
                "first_diff": k,
                # Token strings near the first difference, for a human reader.
                "tokens_reference": [tokens[i] for i in b[max(0, k - 2):k + 4]],
                "tokens_transformers_gguf": [tokens[i] for i in a[max(0, k - 2):k + 4]],
            })
    print("SmolLM2 (a) transformers-GGUF vs (b) reference: %d / %d strings differ"
          % (len(diffs), len(texts)))

    # Decode round trips.  Byte-level BPE is lossless, so decode(encode(x)) == x
    # is expected for every string; anything else is recorded.
    smol_rows, smol_rt_fail, hf_rt_fail = [], 0, 0
    for text, b, a in zip(texts, ids_b, ids_a):
        row = {"text": text, "ids": b}
        dec = ref.decode(b, skip_special_tokens=False)
        if dec != text:
            row["decoded"] = dec
            smol_rt_fail += 1
        if hf.decode(a, skip_special_tokens=False) != text:
            hf_rt_fail += 1
        smol_rows.append(row)
    write_jsonl(os.path.join(args.outdir, "smollm2_ids.jsonl"), smol_rows)
    write_jsonl(os.path.join(args.outdir, "smollm2_hf_gguf_diffs.jsonl"), diffs)

    # Side experiment: does BPE ignore_merges (whole-word vocab lookup first,
    # as Llama-3's tokenizer.json enables) change SmolLM2 results?
    ref_im = build_reference_smollm2(tokens, types, merges, ignore_merges=True)
    smol_ignore_merges_diff = sum(
        1 for t, b in zip(texts, ids_b)
        if ref_im.encode(t, add_special_tokens=False).ids != b)

    # ---- Llama-3 (c) ----
    l3 = Tokenizer.from_file(args.llama3)
    ids_c = [e.ids for e in l3.encode_batch(texts, add_special_tokens=False)]
    l3_rows, l3_rt_fail = [], 0
    for text, c in zip(texts, ids_c):
        row = {"text": text, "ids": c}
        dec = l3.decode(c, skip_special_tokens=False)
        if dec != text:
            row["decoded"] = dec
            l3_rt_fail += 1
        l3_rows.append(row)
    write_jsonl(os.path.join(args.outdir, "llama3_ids.jsonl"), l3_rows)

    # Side experiment: the same tokenizer with ignore_merges turned off.
    with open(args.llama3, encoding="utf-8") as f:
        l3_json = json.load(f)
    l3_ignore_merges = bool(l3_json["model"].get("ignore_merges", False))
    l3_json["model"]["ignore_merges"] = not l3_ignore_merges
    l3_flip = Tokenizer.from_str(json.dumps(l3_json))
    l3_flip_diff = [t for t, c in zip(texts, ids_c)
                    if l3_flip.encode(t, add_special_tokens=False).ids != c]

    # ---- Chat template renderings (transformers + GGUF's Jinja template) ----
    chat_rows, chat_mismatch = [], 0
    for conv_idx, agp in corpus_mod.CHAT_FIXTURE_CASES:
        msgs = corpus_mod.CHAT_CONVERSATIONS[conv_idx]
        text = hf.apply_chat_template(msgs, tokenize=False, add_generation_prompt=agp)
        # The corpus contains a hand-rendered copy; make sure it is faithful.
        if text != corpus_mod.render_smollm2_chat(msgs, agp):
            chat_mismatch += 1
            print("WARNING: hand-rendered chat differs from apply_chat_template for case %d" % conv_idx)
        chat_rows.append({"messages": msgs, "add_generation_prompt": agp, "text": text,
                          "ids": ref.encode(text, add_special_tokens=False).ids})
    write_jsonl(os.path.join(args.outdir, "smollm2_chat.jsonl"), chat_rows)

    summary = {
        "corpus_lines": len(texts),
        "corpus_sha256": sha256_file(args.corpus),
        "smollm2": {
            "gguf_file": os.path.basename(args.gguf),
            "gguf_tokenizer_pre": pre,
            "vocab_size": len(tokens),
            "merges": len(merges),
            "control_tokens": [tokens[i] for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL],
            "ids_lines": len(smol_rows),
            "total_tokens": sum(len(x) for x in ids_b),
            "decode_roundtrip_failures_reference": smol_rt_fail,
            "decode_roundtrip_failures_transformers_gguf": hf_rt_fail,
            "transformers_gguf_vs_reference_differing_lines": len(diffs),
            "ignore_merges_true_differing_lines": smol_ignore_merges_diff,
            "chat_cases": len(chat_rows),
            "chat_hand_render_mismatches": chat_mismatch,
        },
        "llama3": {
            "tokenizer_file": os.path.basename(args.llama3),
            "tokenizer_sha256": sha256_file(args.llama3),
            "ignore_merges": l3_ignore_merges,
            "ids_lines": len(l3_rows),
            "total_tokens": sum(len(x) for x in ids_c),
            "decode_roundtrip_failures": l3_rt_fail,
            "ignore_merges_flipped_differing_lines": len(l3_flip_diff),
        },
        "versions": {p: pkg_version(p) for p in
                     ("gguf", "tokenizers", "transformers", "torch", "numpy", "sentencepiece")},
    }
    with open(os.path.join(args.outdir, "summary.json"), "w", encoding="ascii") as f:
        json.dump(summary, f, indent=2, ensure_ascii=True)
        f.write("\n")
    print(json.dumps(summary, indent=2))
    if l3_flip_diff:
        print("llama3 lines that change when ignore_merges is flipped (first 5):")
        for t in l3_flip_diff[:5]:
            print("  ", repr(t)[:120])


if __name__ == "__main__":
    main()
