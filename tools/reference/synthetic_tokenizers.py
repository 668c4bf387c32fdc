#!/usr/bin/env python3
"""Make synthetic tokenizer.json files and their golden ids with HF `tokenizers`.

The goal is to test the C++ tokenizer.json loader on normalizer and
pre-tokenizer settings that no small real tokenizer file we have uses. All
five files share one REDUCED byte-level BPE vocabulary made from the SmolLM2
GGUF. This keeps the fixtures small:

  * every vocab token that is a single GPT-2 byte stand-in character (SmolLM2
    has 235 of the 256),
  * every token made by the first --merges merges (default 6000),
  * the control tokens (token_type 3), which are also added as special tokens.

Ids are renumbered 0..N-1 in the original id order. A merge is kept only if
both of its sides and its result are in the kept set. Merges keep their
original order.

Files written to --outdir (default tests/fixtures/tokenizer/synthetic/). Each
<name>.json is written by tokenizers.Tokenizer.save, so it is a real HF file:

  qwen2.json           NFC + Sequence[Split(Regex qwen2, Isolated),
                                      ByteLevel(add_prefix_space=False, use_regex=False)]
  gpt2_prefix.json     ByteLevel(add_prefix_space=True, use_regex=True)
  digits_grouped.json  Sequence[Digits(individual_digits=False),
                                ByteLevel(add_prefix_space=False, use_regex=True)],
                       BPE ignore_merges=True
  split_removed.json   Sequence[Split(String " ", Removed),
                                ByteLevel(add_prefix_space=False, use_regex=False)]
  split_invert.json    Sequence[Split(Regex \\p{L}+, Isolated, invert=True),
                                ByteLevel(add_prefix_space=True (the default),
                                          use_regex=False)]
  falcon.json          Falcon-7B's pre-tokenizer: Sequence[Punctuation(Contiguous),
                                ByteLevel(add_prefix_space=False, use_regex=True),
                                Digits(individual_digits=False),
                                Split(Regex [0-9][0-9][0-9], Isolated)]; the last two
                       see the byte-level text (FALCON_EXTRA probes where that matters)
  manifest.json        line/token counts per file, package versions, corpus sha256

Every file has a ByteLevel decoder, no post-processor, and the control tokens
as special added tokens. For each <name>.json there is also <name>_ids.jsonl,
with one {"text", "ids"} line per corpus string used. The ids come from
encode(text, add_special_tokens=False). A line also has a "decoded" key when
decode(ids, skip_special_tokens=False) != text. After the corpus lines,
every file has the hand-written PROBE_EXTRA strings (falcon also FALCON_EXTRA) (special tokens,
non-ASCII numerals and whitespace, and so on), each marked "extra": true.
qwen2_ids.jsonl then has more strings that NFC changes, also marked
"extra": true. These are the corpus lines after the first --lines that NFC
changes, then the hand-written NFC_EXTRA strings. Duplicates are skipped.

Usage (from the repo root):
    python3 tools/reference/synthetic_tokenizers.py \
        [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf] \
        [--corpus tests/fixtures/tokenizer/corpus.jsonl] \
        [--outdir tests/fixtures/tokenizer/synthetic] [--merges 6000] [--lines 1500]
"""

import argparse
import hashlib
import json
import os
import sys
import unicodedata
from importlib.metadata import version as pkg_version

import gguf
from tokenizers import (AddedToken, Regex, Tokenizer, decoders, models, normalizers,
                        pre_tokenizers)

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
TOKEN_TYPE_CONTROL = int(gguf.TokenType.CONTROL)  # 3

QWEN2_PATTERN = (r"(?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}"
                 r"| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+")

# Extra strings whose NFC form differs from the input. They go into
# qwen2_ids.jsonl only, because qwen2 is the only config with a normalizer.
# The corpus lines used may have few or no such strings (the first 1,500 lines
# have none).
NFC_EXTRA = [
    "e\u0301",                          # e + combining acute -> U+00E9
    "caf\u0065\u0301 au lait",          # composed inside a word
    "A\u030A",                          # A + ring -> U+00C5
    "\u212B ngstr\u00F6m",              # ANGSTROM SIGN -> U+00C5 (singleton)
    "\u1100\u1161\u11A8",               # Hangul jamo L V T -> U+AC01
    "\u1112\u1161\u11AB\u1100\u1173\u11AF",  # jamo spelling of the Korean word for "Korean script"
    "\u1100\u1161 \u1100\u1161\u11A8!",  # LV and LVT syllables with a space
    "o\u0323\u0302",                    # dot below + circumflex -> U+1ED9
    "o\u0302\u0323",                    # same marks in the other order -> U+1ED9
    "q\u0307\u0323",                    # no composite: marks reordered only
    "n\u0303o",                         # -> U+00F1 o
    "\u0041\u0308\u0304",               # A + diaeresis + macron -> U+01DE
    "x \u2000 y",                       # EN QUAD -> EN SPACE (singleton)
    "\u2126 = 5",                       # OHM SIGN -> GREEK CAPITAL OMEGA
    "I\u0307stanbul",                   # I + dot above -> U+0130
    "\u0958 \u0915\u093C",              # DEVANAGARI QA is composition-excluded: NFC decomposes it
    "it\u2019s e\u0301te\u0301 1\u0301",  # combining mark after a digit
    "e\u0301e\u0301e\u0301 e\u0301",    # several composed letters
    "\u00E9 vs e\u0301",                # already NFC next to decomposed
    "\u1100\u1161\u11A8\u1100\u1161",   # two syllables, jamo only
]

# Short probe strings for ALL five files. The first 1,500 corpus lines have no
# special-token text, no non-ASCII numerals and almost no Unicode whitespace,
# so without these the configs' handling of those inputs would go untested.
PROBE_EXTRA = [
    "<|im_start|>user\nHello there<|im_end|>\n",
    "a<|im_end|> b",
    "text<|im_end|>text",
    "  <|im_start|>  hi  ",
    "<|endoftext|><|endoftext|>x",
    "\tindented line",
    "\n\nx",
    "\u00a0nbsp first",
    "\u3000ideographic space",
    "x \u2000 y\u2003z",
    "\u0661\u0662\u0663\u0664 \u00bd \u2163 \uff12\uff10\uff12\uff15 x\u00b2",
    "room 12345 and 3.14159, v1.2.3-rc4",
    "a1b22c333d4444",
    "   42 and\t\t7",
    "It's I'LL we'Ve THEY'RE",
    "Hello, world! How's it going?",
    "a  b   c    d",
    " leading",
    "trailing ",
    "mixed\r\nlines\rand\u0085next\u2028",
    "\u65e5\u672c\u8a9e\u306e\u30c6\u30ad\u30b9\u30c8 abc",
    "emoji \U0001F600\U0001F44D\U0001F3FD ok",
    "\u00e9t\u00e9 caf\u00e9 na\u00efve",
]


# Falcon only: digit runs and punctuation next to multi-byte characters whose UTF-8 bytes stand for
# numerals or punctuation at the byte level (C2 B2 -> 'Â²', D0 BC -> 'Ð¼'), digit triples, and ASCII
# symbols that Unicode does not call punctuation ($+<=>^`|~).
FALCON_EXTRA = [
    "x\u00b2y and \u00bd6789 and 12\u00bd3456",
    "\u043c and \u043c\u0438\u0440 999",
    "\u0663\u0664\u0665 1234567",
    "price: $12,345.67 (~3%) <a href=\"x\">|^`+=</a>",
    "(555) 123-4567 ext. 89!!! ...ok",
    "\u00bfQu\u00e9? \u00a1S\u00ed! \u2014 \u201cquoted\u201d \u00ab\u00bb",
    "a  12 ,,, ;; :: 3.14159265",
]


def read_gguf_vocab(path):
    reader = gguf.GGUFReader(path)
    model = reader.fields["tokenizer.ggml.model"].contents()
    if model != "gpt2":
        sys.exit("expected a byte-level BPE ('gpt2') GGUF tokenizer, got %r" % model)
    tokens = reader.fields["tokenizer.ggml.tokens"].contents()
    types = [int(t) for t in reader.fields["tokenizer.ggml.token_type"].contents()]
    merges = reader.fields["tokenizer.ggml.merges"].contents()
    return tokens, types, merges


def gpt2_byte_chars():
    """The 256 GPT-2 byte stand-in characters (byte -> printable code point)."""
    keep = list(range(0x21, 0x7F)) + list(range(0xA1, 0xAD)) + list(range(0xAE, 0x100))
    out, extra = {}, 0
    for b in range(256):
        if b in keep:
            out[b] = chr(b)
        else:
            out[b] = chr(256 + extra)
            extra += 1
    return out


def reduce_vocab(tokens, types, merges, n_merges):
    """Return (vocab dict token->new id, merge pairs, control token strings, stats)."""
    orig_id = {t: i for i, t in enumerate(tokens)}
    if len(orig_id) != len(tokens):
        sys.exit("duplicate token strings in GGUF vocab")
    byte_chars = set(gpt2_byte_chars().values())
    kept = {t for t in tokens if len(t) == 1 and t in byte_chars}
    n_bytes = len(kept)
    pairs = [tuple(m.split(" ")) for m in merges[:n_merges]]
    for left, right in pairs:
        if left + right in orig_id:
            kept.add(left + right)
    controls = [tokens[i] for i, t in enumerate(types) if t == TOKEN_TYPE_CONTROL]
    kept.update(controls)
    kept_merges = [(l, r) for l, r in pairs if l in kept and r in kept and l + r in kept]
    ordered = sorted(kept, key=lambda t: orig_id[t])
    vocab = {t: i for i, t in enumerate(ordered)}
    stats = {"byte_tokens": n_bytes, "merges_considered": len(pairs),
             "merges_kept": len(kept_merges), "controls": len(controls), "vocab": len(vocab)}
    return vocab, kept_merges, controls, stats


def make_tokenizer(vocab, merges, controls, pre_tokenizer, normalizer=None, ignore_merges=False):
    bpe = models.BPE(vocab=dict(vocab), merges=list(merges), unk_token=None, fuse_unk=False,
                     byte_fallback=False, ignore_merges=ignore_merges)
    tk = Tokenizer(bpe)
    tk.normalizer = normalizer
    tk.pre_tokenizer = pre_tokenizer
    tk.decoder = decoders.ByteLevel()
    tk.add_special_tokens([AddedToken(c, special=True, normalized=False, lstrip=False,
                                      rstrip=False, single_word=False) for c in controls])
    for c in controls:
        assert tk.token_to_id(c) == vocab[c], c
    return tk


def configs():
    return [
        ("qwen2", dict(
            normalizer=normalizers.NFC(),
            pre_tokenizer=pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(QWEN2_PATTERN), behavior="isolated", invert=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]))),
        ("gpt2_prefix", dict(
            pre_tokenizer=pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=True))),
        ("digits_grouped", dict(
            pre_tokenizer=pre_tokenizers.Sequence([
                pre_tokenizers.Digits(individual_digits=False),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
            ]),
            ignore_merges=True)),
        ("split_removed", dict(
            pre_tokenizer=pre_tokenizers.Sequence([
                pre_tokenizers.Split(" ", behavior="removed"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=False),
            ]))),
        ("split_invert", dict(
            pre_tokenizer=pre_tokenizers.Sequence([
                pre_tokenizers.Split(Regex(r"\p{L}+"), behavior="isolated", invert=True),
                # add_prefix_space is left at its default (True) on purpose.
                pre_tokenizers.ByteLevel(add_prefix_space=True, use_regex=False),
            ]))),
        ("falcon", dict(
            pre_tokenizer=pre_tokenizers.Sequence([
                pre_tokenizers.Punctuation(behavior="contiguous"),
                pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True),
                pre_tokenizers.Digits(individual_digits=False),
                pre_tokenizers.Split(Regex("[0-9][0-9][0-9]"), behavior="isolated", invert=False),
            ]))),
    ]


def sha256_file(path):
    with open(path, "rb") as f:
        return hashlib.sha256(f.read()).hexdigest()


def write_jsonl(path, rows):
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True, separators=(",", ":")) + "\n")


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(REPO_ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--corpus", default=os.path.join(REPO_ROOT, "tests/fixtures/tokenizer/corpus.jsonl"))
    ap.add_argument("--outdir", default=os.path.join(REPO_ROOT, "tests/fixtures/tokenizer/synthetic"))
    ap.add_argument("--merges", type=int, default=6000, help="how many leading GGUF merges to use")
    ap.add_argument("--lines", type=int, default=1500,
                    help="use the first N corpus lines (0 = all)")
    args = ap.parse_args()

    with open(args.corpus, encoding="ascii") as f:
        all_texts = [json.loads(line)["text"] for line in f]
    texts = all_texts[:args.lines] if args.lines else all_texts
    probes = [t for t in PROBE_EXTRA if t not in set(texts)]
    # Extra strings for qwen2 (the only config with a normalizer): first the
    # corpus lines left out by --lines that NFC changes, then NFC_EXTRA, each
    # only once and only if it is not already among the lines used.
    seen = set(texts) | set(probes)
    nfc_extra = []
    for t in all_texts[len(texts):] + NFC_EXTRA:
        if t not in seen and unicodedata.normalize("NFC", t) != t:
            seen.add(t)
            nfc_extra.append(t)
    tokens, types, merges = read_gguf_vocab(args.gguf)
    vocab, kept_merges, controls, stats = reduce_vocab(tokens, types, merges, args.merges)
    print("reduced vocab:", json.dumps(stats))
    print("corpus strings used: %d" % len(texts))
    n_nfc = sum(1 for t in texts if unicodedata.normalize("NFC", t) != t)
    print("corpus strings changed by NFC: %d; probe strings (all files): %d; "
          "extra NFC strings (qwen2 only): %d" % (n_nfc, len(probes), len(nfc_extra)))
    for t in NFC_EXTRA:
        assert unicodedata.normalize("NFC", t) != t, ascii(t)

    os.makedirs(args.outdir, exist_ok=True)
    manifest = {
        "generator": "tools/reference/synthetic_tokenizers.py",
        "versions": {"tokenizers": pkg_version("tokenizers"), "gguf": pkg_version("gguf"),
                     "python": sys.version.split()[0]},
        "corpus_sha256": sha256_file(args.corpus),
        "corpus_lines_used": "first %d" % len(texts) if args.lines else "all %d" % len(texts),
        "reduced_vocab": stats,
        "files": [],
    }
    for name, cfg in configs():
        tk = make_tokenizer(vocab, kept_merges, controls, **cfg)
        tk_path = os.path.join(args.outdir, name + ".json")
        tk.save(tk_path, pretty=False)
        # Reload the saved file and use that, so the ids belong to the file on disk.
        tk = Tokenizer.from_file(tk_path)
        items = [(t, False) for t in texts] + [(t, True) for t in probes]
        if name == "qwen2":
            items += [(t, True) for t in nfc_extra]
        if name == "falcon":
            items += [(t, True) for t in FALCON_EXTRA if t not in seen]
        encs = tk.encode_batch([t for t, _ in items], add_special_tokens=False)
        rows, n_dec, n_tok = [], 0, 0
        for (text, extra), e in zip(items, encs):
            row = {"text": text, "ids": e.ids}
            n_tok += len(e.ids)
            dec = tk.decode(e.ids, skip_special_tokens=False)
            if dec != text:
                row["decoded"] = dec
                n_dec += 1
            if extra:
                row["extra"] = True
            rows.append(row)
        ids_path = os.path.join(args.outdir, name + "_ids.jsonl")
        write_jsonl(ids_path, rows)
        manifest["files"].append({
            "name": name, "tokenizer_file": name + ".json", "ids_file": name + "_ids.jsonl",
            "lines": len(rows), "corpus_lines": len(texts),
            "extra_lines": len(rows) - len(texts), "tokens": n_tok, "decoded_lines": n_dec})
        print("%-15s %7d bytes json, %7d bytes ids, %d lines, %d tokens, %d with decoded"
              % (name, os.path.getsize(tk_path), os.path.getsize(ids_path), len(rows), n_tok, n_dec))

    with open(os.path.join(args.outdir, "manifest.json"), "w", encoding="ascii", newline="\n") as f:
        f.write(json.dumps(manifest, ensure_ascii=True, indent=1) + "\n")


if __name__ == "__main__":
    main()
