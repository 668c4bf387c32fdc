#!/usr/bin/env python3
"""Samples from RULER's own generator scripts, for the C++ parity test of the native generator.

Runs NVIDIA/RULER's scripts/data/synthetic/*.py (2025 code, `base` model template, seed 42) with the
default model's Hugging Face tokenizer (loaded from the GGUF by transformers) and writes, per sample,
the FNV-1a 64 hash of the model input (input + answer_prefix), the answers and the stored length to
tests/fixtures/ruler/generator.json. The C++ test generates the same tasks and compares.

The essay haystack: RULER's json/PaulGrahamEssays.json is written from the 49 essays that
scripts/setup.sh fetches (RULER's download script puts these first, in this order; the 169 web-site
essays it appends are never reached at these lengths), and RULER's sent_tokenize is nltk's Punkt
with the English tables of <data>/punkt/english (tools/reference/punkt_reference.py).

  python3 tools/reference/ruler_generate.py --ruler /path/to/RULER (a checkout, or a bare git dir)

Needs: transformers, torch, numpy, scipy, nltk, wonderwords==3.0.1, tenacity, tqdm.
"""
import argparse
import glob
import json
import os
import runpy
import subprocess
import sys
import tempfile

TEMPLATES = {  # task template + answer prefix (scripts/data/synthetic/constants.py), base wrapper
    "niah": "Some special magic {type_needle_v} are hidden within the following text. Make sure to memorize it. I will quiz you about the {type_needle_v} afterwards.\n{context}\nWhat are all the special magic {type_needle_v} for {query} mentioned in the provided text? The special magic {type_needle_v} for {query} mentioned in the provided text are",
    "variable_tracking": "Memorize and track the chain(s) of variable assignment hidden in the following text.\n\n{context}\nQuestion: Find all variables that are assigned the value {query} in the text above. Answer: According to the chain(s) of variable assignment in the text above, {num_v} variables are assigned the value {query}, they are: ",
    "common_words_extraction": "Below is a numbered list of words. In these words, some appear more often than others. Memorize the ones that appear most often.\n{context}\nQuestion: What are the 10 most common words in the above list? Answer: The top 10 words that appear most often in the list are:",
    "freq_words_extraction": "Read the following coded text and track the frequency of each coded word. Find the three most frequently appeared coded words. {context}\nQuestion: Do not provide any explanation. Please ignore the dots '....'. What are the three most frequently appeared words in the above coded text? Answer: According to the coded text above, the three most frequently appeared words are:",
}

# (kvbench task, script, tokens to generate, extra arguments), as RULER's synthetic.yaml configures them.
TASKS = [
    ("niah_single_1", "niah", 128, ["--type_haystack", "noise", "--type_needle_k", "words", "--type_needle_v", "numbers"]),
    ("niah_multikey_2", "niah", 128, ["--type_haystack", "needle", "--type_needle_k", "words", "--type_needle_v", "numbers"]),
    ("niah_multikey_3", "niah", 128, ["--type_haystack", "needle", "--type_needle_k", "uuids", "--type_needle_v", "uuids"]),
    ("niah_single_2", "niah", 128, ["--type_haystack", "essay", "--type_needle_k", "words", "--type_needle_v", "numbers"]),
    ("niah_single_3", "niah", 128, ["--type_haystack", "essay", "--type_needle_k", "words", "--type_needle_v", "uuids"]),
    ("niah_multikey_1", "niah", 128, ["--type_haystack", "essay", "--type_needle_k", "words", "--type_needle_v", "numbers",
                                      "--num_needle_k", "4"]),
    ("niah_multivalue", "niah", 128, ["--type_haystack", "essay", "--type_needle_k", "words", "--type_needle_v", "numbers",
                                      "--num_needle_v", "4"]),
    ("niah_multiquery", "niah", 128, ["--type_haystack", "essay", "--type_needle_k", "words", "--type_needle_v", "numbers",
                                      "--num_needle_q", "4"]),
    ("vt", "variable_tracking", 30, ["--type_haystack", "noise", "--num_chains", "1", "--num_hops", "4"]),
    ("cwe", "common_words_extraction", 120, ["--freq_cw", "30", "--freq_ucw", "3", "--num_cw", "10"]),
    ("fwe", "freq_words_extraction", 50, ["--alpha", "2.0"]),
]
LENGTHS = [1024, 4096]
SAMPLES = 3


def fnv1a64(data):
    h = 0xcbf29ce484222325
    for b in data:
        h = ((h ^ b) * 0x100000001b3) & 0xFFFFFFFFFFFFFFFF
    return f"{h:016x}"


def arguments():
    """The options every RULER reference script takes: RULER's source, the model, the data folder."""
    ap = argparse.ArgumentParser()
    ap.add_argument("--ruler", required=True, help="RULER checkout or bare git directory")
    ap.add_argument("--gguf", default="models/SmolLM2-135M-Instruct.Q4_1.gguf")
    ap.add_argument("--data", default="data")
    return ap


def prepare(ruler, gguf, data, work):
    """RULER's scripts/data in `work` (a copy: files are added to it), RULER's essay file made from
    <data>/PaulGrahamEssays, and the default model's tokenizer saved for RULER's `hf` tokenizer type.
    Returns (synthetic script directory, tokenizer directory)."""
    from transformers import AutoTokenizer

    if os.path.isdir(os.path.join(ruler, "scripts")):
        subprocess.run(["cp", "-r", os.path.join(ruler, "scripts"), work], check=True)
    else:  # a bare git directory
        subprocess.run(f"git --git-dir={ruler} archive HEAD scripts/data | tar -x -C {work}", shell=True, check=True)
    synthetic = os.path.join(work, "scripts/data/synthetic")
    # english_words.json is a Git-LFS file that snapshots store as a pointer; cwe reads it only when a
    # sample needs more distinct words than wonderwords holds, which these lengths never do.
    words = os.path.join(synthetic, "json/english_words.json")
    try:
        json.load(open(words))
    except ValueError:
        with open(words, "w") as f:
            f.write("{}")
    text = ""
    for path in sorted(glob.glob(os.path.join(data, "PaulGrahamEssays", "*.txt"))):
        with open(path) as f:  # text mode, as the download script reads them
            text += f.read()
    with open(os.path.join(synthetic, "json/PaulGrahamEssays.json"), "w") as f:
        json.dump({"text": text}, f)
    tok_dir = os.path.join(work, "tokenizer")
    d, name = os.path.split(os.path.abspath(gguf))
    AutoTokenizer.from_pretrained(d, gguf_file=name).save_pretrained(tok_dir)
    return synthetic, tok_dir


def run_with_punkt(data, script, args):
    """Runs a RULER script with nltk's sent_tokenize served by the Punkt tables of `data`."""
    import nltk.tokenize

    from punkt_reference import english_tokenizer

    tok = english_tokenizer(data)
    nltk.tokenize.sent_tokenize = lambda text, language="english": tok.tokenize(text)
    sys.argv = [script] + args
    sys.path.insert(0, os.path.dirname(script))  # as running the script itself would
    runpy.run_path(script, run_name="__main__")


def main():
    if len(sys.argv) > 1 and sys.argv[1] == "--run-with-punkt":
        run_with_punkt(sys.argv[2], sys.argv[3], sys.argv[4:])
        return
    ap = arguments()
    ap.add_argument("--out", default="tests/fixtures/ruler/generator.json")
    args = ap.parse_args()
    work = tempfile.mkdtemp()
    synthetic, tok_dir = prepare(args.ruler, args.gguf, args.data, work)
    records = []
    for task, script, gen, extra in TASKS:
        for length in LENGTHS:
            out = os.path.join(work, "out", f"{task}_{length}")
            cmd = [sys.executable, os.path.abspath(__file__), "--run-with-punkt", os.path.abspath(args.data),
                   os.path.join(synthetic, script + ".py"), "--save_dir", out,
                   "--save_name", task, "--tokenizer_path", tok_dir, "--tokenizer_type", "hf",
                   "--max_seq_length", str(length), "--tokens_to_generate", str(gen), "--num_samples", str(SAMPLES),
                   "--random_seed", "42", "--template", TEMPLATES[script]] + extra
            subprocess.run(cmd, check=True, cwd=synthetic)
            with open(os.path.join(out, task, "validation.jsonl")) as f:
                for i, line in enumerate(f):
                    r = json.loads(line)
                    text = r["input"] + r.get("answer_prefix", "")
                    records.append({"task": task, "length": length, "index": i,
                                    "fnv1a64": fnv1a64(text.encode()), "chars": len(text),
                                    "outputs": r["outputs"], "stored_length": r["length"]})
            print(task, length, "ok", file=sys.stderr)
    with open(args.out, "w") as f:
        json.dump({"source": "NVIDIA/RULER scripts/data/synthetic (2025), base template, seed 42",
                   "samples_per_task": SAMPLES, "records": records}, f, indent=1, ensure_ascii=True)
        f.write("\n")


if __name__ == "__main__":
    main()
