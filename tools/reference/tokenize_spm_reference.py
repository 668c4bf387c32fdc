#!/usr/bin/env python3
"""Golden token ids for the Mistral-7B (v0.1) SentencePiece tokenizer.

Reference (A), written to the fixtures, is the sentencepiece package driven
with the same rules as the C++ tokenizer:

  encode: scan the text left to right for the control pieces "<s>" and "</s>"
          (leftmost match, longest first). Each control piece becomes its id.
          Every stretch of text between control pieces is encoded with plain
          SentencePieceProcessor.encode, which adds the dummy-prefix "\u2581"
          at the start of each stretch. Empty stretches give no ids. No
          BOS/EOS is added.
  decode: each run of ordinary ids is decoded with SentencePieceProcessor
          .decode; control ids are written as their piece text.

Hugging Face tokenizers run over the same strings for comparison (they do
not go into the fixture unless --with-hf-ids is given):

  with transformers >= 5:
    hf5_from_model   transformers.LlamaTokenizer.from_pretrained(<dir with
                     only tokenizer.model>, legacy=True)
    hf5_metaspace    transformers.LlamaTokenizer(vocab, merges, legacy=True),
                     with the merges ordered by piece score (what
                     transformers 5 builds when it loads a tokenizer.json)
  with transformers < 5:
    hf4_slow         transformers.LlamaTokenizer(tokenizer.model, legacy=True)
                     (sentencepiece-backed)
    hf4_fast         transformers.LlamaTokenizerFast(from_slow=True,
                     legacy=True)
  always:
    tk_legacy        a tokenizers.Tokenizer built here in the layout of the
                     transformers-4 legacy conversion: normalizer
                     Sequence[Prepend("\u2581"), Replace(" ", "\u2581")],
                     no pre-tokenizer, BPE(byte_fallback, fuse_unk) with
                     merges ordered by piece score, <unk>/<s>/</s> as special
                     added tokens.

Every HF variant is called with add_special_tokens=False.

Outputs (in --outdir, default tests/fixtures/tokenizer/):
  mistral_ids.jsonl    {"text", "ids"} per corpus line, in corpus order, from
                       (A). "decoded" is added only where the (A) decode of
                       the ids differs from the text.
  mistral_chat.jsonl   {"messages", "text", "ids"} for a few Mistral
                       "[INST]" chat renderings that contain <s> and </s>
                       (the corpus has none). "ids" come from (A), and
                       "decoded" follows the same rule.

A summary of the comparison is printed to stdout. Needs sentencepiece,
protobuf (to read the model proto), tokenizers and transformers. If the
mistral_common package can be imported, the chat ids are also checked
against its InstructTokenizerV1.

Usage (from the repo root):
    python3 tools/reference/tokenize_spm_reference.py \
        [--model models/mistral-tokenizer/tokenizer.model] \
        [--corpus tests/fixtures/tokenizer/corpus.jsonl] \
        [--outdir tests/fixtures/tokenizer] [--with-hf-ids]
"""

import argparse
import collections
import hashlib
import json
import os
import shutil
import sys
import tempfile
from importlib.metadata import PackageNotFoundError
from importlib.metadata import version as pkg_version

import sentencepiece as spm

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
EXPECTED_SHA256 = "dadfd56d766715c61d2ef780a525ab43b8e6da4de6865bda3d95fdef5e134055"
WS = "\u2581"  # SentencePiece's visible space

# Piece types in sentencepiece_model.proto (ModelProto.SentencePiece.Type).
PIECE_TYPE_NAMES = {1: "NORMAL", 2: "UNKNOWN", 3: "CONTROL", 4: "USER_DEFINED",
                    5: "UNUSED", 6: "BYTE"}


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            h.update(block)
    return h.hexdigest()


def load_proto(path):
    # sentencepiece ships the generated protobuf module; it needs `protobuf`.
    from sentencepiece import sentencepiece_model_pb2 as model_pb2
    proto = model_pb2.ModelProto()
    with open(path, "rb") as f:
        proto.ParseFromString(f.read())
    return proto


class SpmReference:
    """Reference (A): the C++ tokenizer's rules on top of sentencepiece."""

    def __init__(self, sp, proto):
        self.sp = sp
        self.control = {}
        for i, piece in enumerate(proto.pieces):
            if piece.type == 3:  # CONTROL
                self.control[piece.piece] = i
        # Longest first, so that at one position the longer piece wins.
        self.control_by_len = sorted(self.control, key=lambda p: (-len(p), p))
        self.control_ids = {i: p for p, i in self.control.items()}

    def encode(self, text):
        ids = []
        start = 0
        pos = 0
        while pos < len(text):
            hit = None
            for piece in self.control_by_len:
                if text.startswith(piece, pos):
                    hit = piece
                    break
            if hit is None:
                pos += 1
                continue
            if start < pos:
                ids.extend(self.sp.encode(text[start:pos]))
            ids.append(self.control[hit])
            pos += len(hit)
            start = pos
        if start < len(text):
            ids.extend(self.sp.encode(text[start:]))
        return ids

    def decode(self, ids):
        out = []
        run = []
        for i in ids:
            if i in self.control_ids:
                if run:
                    out.append(self.sp.decode(run))
                    run = []
                out.append(self.control_ids[i])
            else:
                run.append(i)
        if run:
            out.append(self.sp.decode(run))
        return "".join(out)


def score_ordered_merges(sp):
    """BPE merges for the vocab, ranked by the score of the merged piece.

    This is transformers' own generate_merges() with vocab_scores, the ranking
    the transformers-4 slow->fast converter uses.
    """
    try:  # transformers 5
        from transformers.tokenization_utils_base import generate_merges
    except ImportError:  # transformers 4
        from transformers.convert_slow_tokenizer import generate_merges
    vocab = {sp.id_to_piece(i): i for i in range(sp.get_piece_size())}
    scores = {sp.id_to_piece(i): sp.get_score(i) for i in range(sp.get_piece_size())}
    return vocab, generate_merges(vocab, scores)


def build_tk_legacy(sp, proto, vocab, merges):
    from tokenizers import AddedToken, Tokenizer, decoders, normalizers
    from tokenizers.models import BPE
    unk = proto.trainer_spec.unk_piece
    tok = Tokenizer(BPE(vocab=dict(vocab), merges=list(merges), unk_token=unk,
                        fuse_unk=True, byte_fallback=True))
    tok.normalizer = normalizers.Sequence([normalizers.Prepend(WS),
                                           normalizers.Replace(" ", WS)])
    tok.pre_tokenizer = None
    tok.decoder = decoders.Sequence([decoders.Replace(WS, " "), decoders.ByteFallback(),
                                     decoders.Fuse(), decoders.Strip(" ", 1, 0)])
    specials = [p.piece for p in proto.pieces if p.type in (2, 3)]
    tok.add_special_tokens([AddedToken(s, normalized=False, special=True) for s in specials])
    return tok


class HfVariant:
    def __init__(self, name, encode, decode, describe):
        self.name = name
        self.encode = encode
        self.decode = decode
        self.describe = describe


def build_hf_variants(model_path, sp, proto, tmpdir):
    import transformers
    major = int(transformers.__version__.split(".")[0])
    vocab, merges = score_ordered_merges(sp)
    # from_pretrained wants a folder whose file is named tokenizer.model.
    model_dir = os.path.join(tmpdir, "spm")
    os.makedirs(model_dir)
    shutil.copyfile(model_path, os.path.join(model_dir, "tokenizer.model"))

    def wrap(name, t, describe):
        return HfVariant(
            name,
            lambda s: list(t.encode(s, add_special_tokens=False)),
            lambda ids: t.decode(ids, skip_special_tokens=False),
            describe)

    def backend_layout(t):
        j = json.loads(t.backend_tokenizer.to_str())
        return {"normalizer": j["normalizer"], "pre_tokenizer": j["pre_tokenizer"],
                "merges": len(j["model"]["merges"])}

    out = []
    if major >= 5:
        from transformers import LlamaTokenizer
        t1 = LlamaTokenizer.from_pretrained(model_dir, legacy=True)
        out.append(wrap("hf5_from_model", t1, backend_layout(t1)))
        t2 = LlamaTokenizer(vocab=dict(vocab), merges=list(merges), legacy=True)
        out.append(wrap("hf5_metaspace", t2, backend_layout(t2)))
    else:
        from transformers import LlamaTokenizer, LlamaTokenizerFast
        t1 = LlamaTokenizer.from_pretrained(model_dir, legacy=True)
        out.append(wrap("hf4_slow", t1, {"class": type(t1).__name__}))
        t2 = LlamaTokenizerFast.from_pretrained(model_dir, legacy=True, from_slow=True)
        out.append(wrap("hf4_fast", t2, backend_layout(t2)))
    tk = build_tk_legacy(sp, proto, vocab, merges)
    out.append(HfVariant(
        "tk_legacy",
        lambda s: tk.encode(s, add_special_tokens=False).ids,
        lambda ids: tk.decode(ids, skip_special_tokens=False),
        {"normalizer": "Sequence[Prepend, Replace]", "pre_tokenizer": None, "merges": len(merges)}))
    return out


def first_diff(a, b):
    k = 0
    while k < min(len(a), len(b)) and a[k] == b[k]:
        k += 1
    return k


def classify(text, a, b, sp):
    """Put one (A) != (B) line into a category."""
    if text[:1] == " ":
        return "text starts with a space"
    k = first_diff(a, b)
    pieces = [sp.id_to_piece(i) for i in a[k:k + 2] + b[k:k + 2]]
    if any(p and set(p) == {WS} for p in pieces):
        return "whitespace run before a word"
    return "other"


# Mistral "[INST]" chat cases. The fixture stores the rendered text and its
# (A) ids; the rendering is the v1 instruct layout: <s>, then for each user
# turn "[INST] " + content + " [/INST]", and for each assistant turn
# " " + content + "</s>". A system message is put in front of the first
# user turn, followed by a blank line.
CHAT_CASES = [
    [{"role": "user", "content": "What is the capital of France?"}],
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "Name a primary colour."},
    ],
    [
        {"role": "user", "content": "Hi! Can you add 12 and 30?"},
        {"role": "assistant", "content": "Sure: 12 + 30 = 42."},
        {"role": "user", "content": "And multiply that by 3?"},
    ],
    [
        {"role": "system", "content": "You write Python.\nKeep answers short."},
        {"role": "user", "content": "Write a function that squares x.\n\n\tThanks!"},
        {"role": "assistant", "content": "def square(x):\n    return x * x\n"},
        {"role": "user", "content": "Now explain it in fran\u00e7ais, s'il vous pla\u00eet \U0001F600"},
        {"role": "assistant", "content": "Elle renvoie x\u00b2."},
    ],
    [{"role": "user", "content": "  <b>bold</b>   \n"}],
    [
        {"role": "user", "content": "a"},
        {"role": "assistant", "content": "  b  "},
        {"role": "user", "content": "\tc"},
    ],
]


def render_chat(messages):
    system = [m["content"] for m in messages if m["role"] == "system"]
    out = ["<s>"]
    first_user = True
    for m in messages:
        if m["role"] == "user":
            content = m["content"]
            if first_user and system:
                content = system[0] + "\n\n" + content
            first_user = False
            out.append("[INST] " + content + " [/INST]")
        elif m["role"] == "assistant":
            out.append(" " + m["content"] + "</s>")
    return "".join(out)


def mistral_common_ids(model_path, messages):
    """Token ids from mistral_common, or None if it is not installed."""
    try:
        from mistral_common.protocol.instruct.messages import AssistantMessage, UserMessage
        from mistral_common.protocol.instruct.request import InstructRequest
        from mistral_common.tokens.tokenizers.mistral import MistralTokenizer
    except ImportError:
        return None
    mt = MistralTokenizer.from_file(model_path)
    kinds = {"user": UserMessage, "assistant": AssistantMessage}
    system = [m["content"] for m in messages if m["role"] == "system"]
    req = InstructRequest(
        messages=[kinds[m["role"]](content=m["content"]) for m in messages if m["role"] != "system"],
        system_prompt=system[0] if system else None)
    return list(mt.instruct_tokenizer.encode_instruct(req).tokens)


def write_jsonl(path, rows):
    with open(path, "w", encoding="ascii", newline="\n") as f:
        for r in rows:
            f.write(json.dumps(r, ensure_ascii=True) + "\n")


def versions():
    out = {"python": sys.version.split()[0]}
    for p in ("sentencepiece", "protobuf", "tokenizers", "transformers", "mistral_common"):
        try:
            out[p] = pkg_version(p)
        except PackageNotFoundError:
            out[p] = None
    return out


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--model", default=os.path.join(REPO_ROOT, "models", "mistral-tokenizer", "tokenizer.model"))
    ap.add_argument("--corpus", default=os.path.join(REPO_ROOT, "tests", "fixtures", "tokenizer", "corpus.jsonl"))
    ap.add_argument("--outdir", default=os.path.join(REPO_ROOT, "tests", "fixtures", "tokenizer"))
    ap.add_argument("--with-hf-ids", action="store_true",
                    help="also write 'hf_ids' (from hf5_metaspace, or hf4_fast under "
                         "transformers 4) on lines where they differ from (A)")
    args = ap.parse_args()

    model_sha = sha256_file(args.model)
    if model_sha != EXPECTED_SHA256:
        print("WARNING: %s has sha256 %s, expected %s" % (args.model, model_sha, EXPECTED_SHA256))

    sp = spm.SentencePieceProcessor(model_file=args.model)
    proto = load_proto(args.model)
    ns, ts = proto.normalizer_spec, proto.trainer_spec
    type_counts = collections.Counter(PIECE_TYPE_NAMES.get(p.type, str(p.type)) for p in proto.pieces)
    model_info = {
        "sha256": model_sha,
        "vocab_size": sp.get_piece_size(),
        "model_type": ts.ModelType.Name(ts.model_type),
        "unk_id": sp.unk_id(), "bos_id": sp.bos_id(), "eos_id": sp.eos_id(), "pad_id": sp.pad_id(),
        "piece_types": dict(sorted(type_counts.items())),
        "special_pieces": {i: p.piece for i, p in enumerate(proto.pieces) if p.type in (2, 3, 4)},
        "normalizer": {
            "name": ns.name,
            "add_dummy_prefix": ns.add_dummy_prefix,
            "remove_extra_whitespaces": ns.remove_extra_whitespaces,
            "escape_whitespaces": ns.escape_whitespaces,
            "precompiled_charsmap_bytes": len(ns.precompiled_charsmap),
        },
        "has_denormalizer": proto.HasField("denormalizer_spec"),
        "trainer": {
            "byte_fallback": ts.byte_fallback,
            "split_digits": ts.split_digits,
            "treat_whitespace_as_suffix": ts.treat_whitespace_as_suffix,
            "allow_whitespace_only_pieces": ts.allow_whitespace_only_pieces,
        },
        "whitespace_only_pieces": sorted(
            (i for i in range(sp.get_piece_size()) if set(sp.id_to_piece(i)) == {WS}),
            key=lambda i: len(sp.id_to_piece(i))),
    }
    model_info["whitespace_only_piece_scores"] = sorted(
        {sp.get_score(i) for i in model_info["whitespace_only_pieces"]})

    ref = SpmReference(sp, proto)
    with open(args.corpus, encoding="utf-8") as f:
        texts = [json.loads(line)["text"] for line in f]
    A = [ref.encode(t) for t in texts]

    with tempfile.TemporaryDirectory() as tmpdir:
        variants = build_hf_variants(args.model, sp, proto, tmpdir)
        B = {v.name: [v.encode(t) for t in texts] for v in variants}
        hf_decoded = {v.name: [v.decode(ids) for ids in A] for v in variants}
        chat_A = [ref.encode(render_chat(m)) for m in CHAT_CASES]
        chat_hf_decoded = {v.name: [v.decode(ids) for ids in chat_A] for v in variants}
        probes = ["a<s>b", "a<s> b", "a</s>  b", "<unk>", " x", "\u2581x", ""]
        probe_rows = {p: {"A": ref.encode(p), **{v.name: v.encode(p) for v in variants}} for p in probes}
        chat_texts = [render_chat(m) for m in CHAT_CASES]
        chat_B = {v.name: [v.encode(t) for t in chat_texts] for v in variants}
        layouts = {v.name: v.describe for v in variants}

    # Fixture: mistral_ids.jsonl
    hf_name = "hf5_metaspace" if "hf5_metaspace" in B else "hf4_fast"
    rows, decode_mismatch = [], []
    for i, (text, ids) in enumerate(zip(texts, A)):
        row = {"text": text, "ids": ids}
        dec = ref.decode(ids)
        if dec != text:
            row["decoded"] = dec
            decode_mismatch.append(i)
        if args.with_hf_ids and B[hf_name][i] != ids:
            row["hf_ids"] = B[hf_name][i]
        rows.append(row)
    write_jsonl(os.path.join(args.outdir, "mistral_ids.jsonl"), rows)

    # Fixture: mistral_chat.jsonl
    chat_rows, chat_checks = [], []
    for msgs, text in zip(CHAT_CASES, chat_texts):
        ids = ref.encode(text)
        row = {"messages": msgs, "text": text, "ids": ids}
        dec = ref.decode(ids)
        if dec != text:
            row["decoded"] = dec
        chat_rows.append(row)
        mc = mistral_common_ids(args.model, msgs)
        chat_checks.append(None if mc is None else mc == ids)
    write_jsonl(os.path.join(args.outdir, "mistral_chat.jsonl"), chat_rows)

    # Report.
    comparison = {}
    for name, ids_list in B.items():
        diff = [i for i in range(len(texts)) if ids_list[i] != A[i]]
        cats = collections.Counter(classify(texts[i], A[i], ids_list[i], sp) for i in diff)
        examples = []
        for i in diff[:4]:
            k = first_diff(A[i], ids_list[i])
            examples.append({"text": texts[i][:60], "at": k,
                             "A": [sp.id_to_piece(x) for x in A[i][k:k + 3]],
                             name: [sp.id_to_piece(x) for x in ids_list[i][k:k + 3]]})
        dec_diff = sum(1 for i in range(len(texts)) if hf_decoded[name][i] != ref.decode(A[i]))
        comparison[name] = {
            "layout": layouts[name],
            "differing_lines": len(diff),
            "categories": dict(cats),
            "chat_differing": sum(1 for j, t in enumerate(chat_texts) if chat_B[name][j] != ref.encode(t)),
            "decode_of_A_ids_differs_from_A_decode": dec_diff,
            "chat_decode_of_A_ids_differs_from_A_decode": sum(
                1 for j, ids in enumerate(chat_A) if chat_hf_decoded[name][j] != ref.decode(ids)),
            "examples": examples,
        }
    summary = {
        "model": model_info,
        "corpus_lines": len(texts),
        "corpus_sha256": sha256_file(args.corpus),
        "mistral_ids_lines": len(rows),
        "total_tokens": sum(len(a) for a in A),
        "decode_roundtrip_failures": len(decode_mismatch),
        "chat_cases": len(chat_rows),
        "chat_matches_mistral_common": chat_checks,
        "hf_comparison": comparison,
        "probes": {repr(p): r for p, r in probe_rows.items()},
        "with_hf_ids": args.with_hf_ids,
        "versions": versions(),
    }
    print(json.dumps(summary, indent=1, ensure_ascii=False))


if __name__ == "__main__":
    main()
