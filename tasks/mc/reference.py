#!/usr/bin/env python3
"""lm-evaluation-harness's own scores of the mc task's fixtures, for test_mc.cpp.

The five benchmarks' files cannot be fetched here, so the fixtures are made up in their layouts:
36 samples per benchmark built (seeded) from the Paul Graham essays, with what the layouts' quirks
exercise: ARC in the datasets library's layout and in the released one, numeric ARC labels, PIQA
labels as numbers and digits, Winogrande blanks with options that end in a space, HellaSwag's
WikiHow markers ([title], [header], [step]), doubled spaces and a ctx_b in mixed case.

lm-eval (0.4.13) then runs its registered arc_challenge, arc_easy, piqa, winogrande and hellaswag
tasks (their prompts, choices, process_docs and metrics) on these files through its HFLM model:
transformers 4.57.1 on the default GGUF, float32, with SmolLM2's own tokenizer rules restored
(tools/reference/smollm2_hf.py). Written per sample: each choice's log-likelihood
and greedy flag, and lm-eval's acc and acc_norm.

    python3 tasks/mc/reference.py --data DIR [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
    (needs: pip install lm-eval==0.4.13 transformers==4.57.1 gguf torch)

Output: tasks/mc/fixtures/<benchmark>.jsonl (the samples) and tasks/mc/fixtures/lm_eval.json.

Under transformers 5.25.0 (lm-eval 0.4.13, torch 2.15, numpy 2.4) the script gives the same samples,
the same acc and acc_norm of every sample, and log-likelihoods within 6.5e-5 of the fixture's (the
test allows 1e-3).
"""
import argparse
import glob
import json
import pathlib
import random
import re
from importlib.metadata import version

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tasks/mc/fixtures"
PER_BENCHMARK = 36


def sentences(data):
    text = " ".join(open(p, encoding="utf-8").read() for p in sorted(glob.glob(str(data / "PaulGrahamEssays/*.txt")))[:12])
    out = [s.strip() for s in re.split(r"(?<=[.?!])\s+", text)]
    return [s for s in out if 8 <= len(s.split()) <= 30 and "\n" not in s]


def arc(rng, sents, i):
    s = rng.choice(sents).split()
    cut = rng.randrange(4, len(s) - 1)
    truth = s[cut]
    others = [w for w in rng.choice(sents).split() if w != truth][:3]
    n = 3 if i % 9 == 4 else 4  # ARC has a few three- and five-choice questions
    words = ([truth] + others + ["perhaps"])[:n]
    rng.shuffle(words)
    labels = [str(k + 1) for k in range(n)] if i % 7 == 3 else "ABCDE"[:n]
    stem = "Which word comes next in: " + " ".join(s[:cut]) + "?"
    if i % 11 == 5:
        stem = "Qu\u2019est-ce qui vient apr\u00e8s \u00ab " + " ".join(s[:cut]) + " \u00bb ?"
    key = labels[words.index(truth) if i % 5 else rng.randrange(n)]
    doc = {"id": f"Fixture_{i:03d}", "question": stem, "choices": {"text": words, "label": list(labels)},
           "answerKey": key}
    if i % 4 == 1:  # the released layout
        doc = {"id": doc["id"], "question": {"stem": stem, "choices": [{"text": t, "label": l} for t, l in zip(words, labels)]},
               "answerKey": key}
    return doc


def piqa(rng, sents, i):
    a, b = rng.sample(sents, 2)
    goal = " ".join(a.split()[:rng.randrange(4, 9)])
    sols = [" ".join(a.split()[len(goal.split()):]), " ".join(b.split()[:rng.randrange(5, 12)])]
    if i % 2:
        sols.reverse()
    label = i % 2
    return {"goal": goal, "sol1": sols[0], "sol2": sols[1], "label": str(label) if i % 3 == 0 else label}


def winogrande(rng, sents, i):
    # Each sample its own sentence: lm-eval's logits cache (HFLM, logits_cache=True) hands two requests
    # whose tokens coincide but split differently into context and continuation the same logits, so
    # two samples filling one sentence differently would compare its quirk, not the metric.
    s = rng.choice(sents[i::PER_BENCHMARK]).split()
    at = rng.randrange(2, len(s) - 2)
    truth, other = s[at], rng.choice([w for w in rng.choice(sents).split() if w != s[at]] or ["thing"])
    if i % 6 == 2:
        truth += " "  # a trailing space moves from the context to the continuation
    options = [truth, other] if i % 2 == 0 else [other, truth]
    sentence = " ".join(s[:at] + ["_"] + s[at + 1:])
    return {"qID": f"fixture-{i:03d}", "sentence": sentence, "option1": options[0], "option2": options[1],
            "answer": "1" if i % 2 == 0 else "2"}


def hellaswag(rng, sents, i):
    a, b = rng.sample(sents, 2)
    words = b.split()
    ctx_b = " ".join(words[:3]).lower()
    if i % 4 == 1:
        ctx_b = ctx_b.upper()
    elif i % 4 == 2:
        ctx_b = "tHe " + ctx_b
    endings = []
    for k in range(4):
        e = " ".join(rng.choice(sents).split()[:rng.randrange(5, 14)])
        if (i + k) % 5 == 0:
            e = "[header] " + e + " [title] " + e.split()[0]
        elif (i + k) % 5 == 1:
            e = e + "  [step]  more words"
        endings.append(" " + e if k % 2 else e)
    endings[i % 4] = " ".join(words[3:])  or endings[i % 4]
    return {"ind": 1000 + i, "activity_label": rng.choice(["Cooking", "Personal care and style", "Roof shingle removal"]),
            "ctx_a": a, "ctx_b": ctx_b, "ctx": a + " " + ctx_b, "endings": endings, "label": str(i % 4)}


MAKERS = {"arc_challenge": arc, "arc_easy": arc, "piqa": piqa, "winogrande": winogrande, "hellaswag": hellaswag}


def as_datasets_layout(doc):
    """lm-eval's tasks read the datasets library's layout: ARC's released one is converted."""
    q = doc.get("question")
    if isinstance(q, dict):
        return {"id": doc["id"], "question": q["stem"],
                "choices": {"text": [c["text"] for c in q["choices"]], "label": [c["label"] for c in q["choices"]]},
                "answerKey": doc["answerKey"]}
    if "label" in doc and "goal" in doc:
        return {**doc, "label": int(doc["label"])}
    return doc


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", required=True, type=pathlib.Path)
    ap.add_argument("--gguf", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    args = ap.parse_args()

    sents = sentences(args.data)
    OUT.mkdir(parents=True, exist_ok=True)
    docs = {}
    for n, (name, make) in enumerate(MAKERS.items()):
        rng = random.Random(1000 + n)
        docs[name] = [make(rng, sents, i) for i in range(PER_BENCHMARK)]
        with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
            for d in docs[name]:
                f.write(json.dumps(d, ensure_ascii=False) + "\n")

    import sys

    from lm_eval import evaluator
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    sys.path.insert(0, str(ROOT / "tools/reference"))
    import smollm2_hf  # noqa: E402  (the GGUF with SmolLM2's own tokenizer rules, as kvbench encodes)

    path = pathlib.Path(args.gguf)
    tok, model = smollm2_hf.load(path)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1)

    golden = {"lm_eval": version("lm_eval"), "model": path.name, "benchmarks": {}}
    # lm-eval's registered tasks as they are, their dataset read from the fixtures instead of the hub.
    import datasets
    import lm_eval.api.task as task_module
    hub = {"allenai/ai2_arc": lambda name: "arc_challenge" if name == "ARC-Challenge" else "arc_easy",
           "baber/piqa": lambda name: "piqa", "allenai/winogrande": lambda name: "winogrande",
           "Rowan/hellaswag": lambda name: "hellaswag"}

    def load_dataset(path, name=None, **kwargs):
        rows = [as_datasets_layout(d) for d in docs[hub[path](name)]]
        split = datasets.Dataset.from_list(rows)
        return datasets.DatasetDict({"train": split, "validation": split, "test": split})

    task_module.datasets.load_dataset = load_dataset
    out = evaluator.simple_evaluate(model=lm, tasks=list(MAKERS), task_manager=TaskManager(), num_fewshot=0,
                                    log_samples=True, bootstrap_iters=0)
    for name in MAKERS:
        rows = sorted(out["samples"][name], key=lambda r: r["doc_id"])
        golden["benchmarks"][name] = [
            {"loglikelihood": [float(r[0][0]) for r in s["resps"]], "greedy": [bool(r[0][1]) for r in s["resps"]],
             "acc": float(s["acc"]), **({"acc_norm": float(s["acc_norm"])} if "acc_norm" in s else {})}
            for s in rows]
        golden["benchmarks"][name + "_summary"] = {k: v for k, v in out["results"][name].items()
                                                   if isinstance(v, float)}
    (OUT / "lm_eval.json").write_text(json.dumps(golden, indent=1) + "\n")
    for name in MAKERS:
        print(name, out["results"][name])


if __name__ == "__main__":
    main()
