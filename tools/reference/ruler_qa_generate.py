#!/usr/bin/env python3
"""RULER qa_1/qa_2 parity: small SQuAD 2.0 and HotpotQA files, and RULER's own qa.py samples on them.

Writes tests/fixtures/ruler/qa/squad.json and hotpotqa.json (synthetic text in the official formats,
made here from a fixed seed: impossible questions, paragraphs shared between articles and between
questions, non-ASCII text so that the sorted document order matters), then runs NVIDIA/RULER's
scripts/data/synthetic/qa.py (2025 code, `base` template, seed 42) on them with the default model's
Hugging Face tokenizer and writes per sample the FNV-1a 64 hash of the model input (input +
answer_prefix), the outputs and the stored length to tests/fixtures/ruler/qa_generator.json.

  python3 tools/reference/ruler_qa_generate.py --ruler /path/to/RULER (a checkout, or a bare git dir)

Needs: transformers, gguf, numpy, tqdm, tenacity.
"""
import json
import os
import random
import subprocess
import sys
import tempfile

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ruler_generate import arguments, fnv1a64, prepare  # noqa: E402

TEMPLATE = ("Answer the question based on the given documents. Only give me the answer and do not output any other "
            "words.\n\nThe following are given documents.\n\n{context}\n\nAnswer the question based on the given "
            "documents. Only give me the answer and do not output any other words.\n\nQuestion: {query} Answer:")
# (dataset, lengths): 4096 exceeds the SQuAD file's documents, so upstream repeats the whole set.
# (Upstream loops forever when even 10 documents do not fit; these documents are short enough.)
RUNS = [("squad", [1024, 2048, 4096]), ("hotpotqa", [1024, 4096])]
SAMPLES = 3

NAMES = ["Ada", "Bruno", "Chiara", "Dmitri", "Élodie", "Farid", "Grete", "Hiroshi", "Ingrid", "José", "Kwame", "Léa",
         "Mateo", "Nadia", "Øystein", "Priya", "Quentin", "Rosa", "Søren", "Tomás", "Ulla", "Vikram", "Wen", "Yusuf"]
PLACES = ["Avonlea", "Brindisi", "Cádiz", "Dunmore", "Eskdale", "Fárbauti", "Gdańsk", "Harrowgate", "Ilmenau",
          "Jyväskylä", "Kilkenny", "Lübeck", "Montrose", "Nørrebro", "Oaxaca", "Perth", "Québec", "Riga", "北京", "São Paulo"]
THINGS = ["bridges", "lighthouses", "violins", "orchards", "observatories", "printing presses", "canals", "windmills",
          "libraries", "clock towers", "ferries", "vineyards", "tramlines", "bakeries", "glassworks", "archives"]
VERBS = ["built", "restored", "catalogued", "sold", "painted", "measured", "repaired", "photographed", "mapped"]


def sentence(r):
    return (f"In {r.randint(1700, 2020)}, {r.choice(NAMES)} of {r.choice(PLACES)} {r.choice(VERBS)} "
            f"{r.randint(2, 90)} {r.choice(THINGS)}{r.choice(['.', ', or so the records say.', ' — and more.', '.'])}")


def squad(r):
    articles, shared = [], None
    for a in range(6):
        paragraphs = []
        for p in range(20 if a == 0 else 6):  # article 0 can fill a short input from its own paragraphs
            if a == 3 and p == 0:  # the same paragraph in two articles: one document after dedup
                context = shared
            else:
                context = " ".join(sentence(r) for _ in range(r.randint(2, 4)))
            if a == 1 and p == 2:
                shared = context
            qas = []
            for q in range(r.randint(1, 3)):
                s = r.choice(context.split(". "))
                words = s.split()
                answer = " ".join(words[-3:-1]) if len(words) > 3 else words[0]
                qas.append({"id": f"{a}-{p}-{q}", "question": f"Who or what is mentioned with {words[1]} here?",
                            "answers": [{"text": answer, "answer_start": context.find(answer)}],
                            "is_impossible": q == 2})
            paragraphs.append({"context": context, "qas": qas})
        articles.append({"title": f"Article_{a}", "paragraphs": paragraphs})
    return {"version": "v2.0", "data": articles}


def hotpotqa(r):
    pool = [[f"{r.choice(PLACES)} {r.choice(THINGS).title()} {i}", [sentence(r) + " " for _ in range(r.randint(1, 2))]]
            for i in range(90)]
    questions = []
    for i in range(14):
        context = r.sample(pool, 10)  # documents recur across questions, as in the real file
        title, sents = context[r.randrange(10)]
        questions.append({"_id": f"q{i}", "question": f"What happened at {title}?", "answer": sents[0].split()[-2],
                          "type": "bridge", "level": "medium", "supporting_facts": [[title, 0]],
                          "context": context})
    return questions


def main():
    ap = arguments()
    ap.add_argument("--fixtures", default="tests/fixtures/ruler")
    args = ap.parse_args()
    r = random.Random(20261123)
    os.makedirs(os.path.join(args.fixtures, "qa"), exist_ok=True)
    data = {"squad": squad(r), "hotpotqa": hotpotqa(r)}
    for name, content in data.items():
        with open(os.path.join(args.fixtures, "qa", name + ".json"), "w") as f:
            json.dump(content, f, ensure_ascii=False, indent=0)

    synthetic, tok_dir = prepare(args.ruler, args.gguf, args.data, tempfile.mkdtemp())
    work = os.path.dirname(tok_dir)
    for name in data:  # qa.py reads json/<dataset>.json beside itself
        subprocess.run(["cp", os.path.join(args.fixtures, "qa", name + ".json"), os.path.join(synthetic, "json")],
                       check=True)
    records = []
    for dataset, lengths in RUNS:
        task = "qa_1" if dataset == "squad" else "qa_2"
        for length in lengths:
            out = os.path.join(work, "out", f"{task}_{length}")
            subprocess.run([sys.executable, os.path.join(synthetic, "qa.py"), "--save_dir", out, "--save_name", task,
                            "--tokenizer_path", tok_dir, "--tokenizer_type", "hf", "--max_seq_length", str(length),
                            "--tokens_to_generate", "32", "--num_samples", str(SAMPLES), "--random_seed", "42",
                            "--template", TEMPLATE, "--dataset", dataset], check=True, cwd=synthetic)
            with open(os.path.join(out, task, "validation.jsonl")) as f:
                for i, line in enumerate(f):
                    rec = json.loads(line)
                    text = rec["input"] + rec["answer_prefix"]
                    records.append({"task": task, "length": length, "index": i, "fnv1a64": fnv1a64(text.encode()),
                                    "chars": len(text), "outputs": rec["outputs"], "stored_length": rec["length"]})
            print(task, length, "ok", file=sys.stderr)
    with open(os.path.join(args.fixtures, "qa_generator.json"), "w") as f:
        json.dump({"source": "NVIDIA/RULER scripts/data/synthetic/qa.py (2025), base template, seed 42, on the "
                             "files in qa/", "samples_per_task": SAMPLES, "records": records}, f, indent=1,
                  ensure_ascii=True)
        f.write("\n")


if __name__ == "__main__":
    main()
