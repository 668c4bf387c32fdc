#!/usr/bin/env python3
"""lm-evaluation-harness's own prompts, generations and scores of the gsm8k task's fixtures, for test_gsm8k.cpp.

GSM8K's files cannot be fetched here, so the fixtures are made up in its layout: 40 test and 30 training
problems (seeded), each a question and a worked answer with calculator annotations ("<<3*4=12>>") ending in
"#### <answer>", some answers negative, decimal, in dollars or with a thousands comma.

lm-eval (0.4.13) then runs its registered `gsm8k` task on them (5-shot from the training file, its prompt,
stop strings, filters and exact_match) through its HFLM model: transformers 4.57.1 on the default GGUF,
float32, with SmolLM2's own tokenizer rules restored (tools/reference/smollm2_hf.py). Written per sample:
the prompt lm-eval built, the generation and each filter's exact_match. The model's generations rarely
reach a number the filters treat differently, so the same filters and metric also score made-up responses
(RESPONSES) against the fixtures' answers.

    python3 tasks/gsm8k/reference.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
    (needs: pip install lm-eval==0.4.13 transformers==4.57.1 gguf torch)

Output: tasks/gsm8k/fixtures/{test,train}.jsonl and tasks/gsm8k/fixtures/lm_eval.json. Under transformers
5.25.0 (lm-eval 0.4.13, torch 2.15, numpy 2.4) the script writes the same files, byte for byte.

With --files DIR (GSM8K's own test.jsonl and train.jsonl) the same run covers the first --limit problems of
the real files and writes only --out (the layout of lm_eval.json, without the made-up responses): the check
of a `kvbench run` of task gsm8k on those files, compared by --compare RECORDS.
"""
import argparse
import json
import pathlib
import random
import sys
from importlib.metadata import version

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "tasks/gsm8k/fixtures"
NAMES = ["Natalia", "Weng", "Betty", "James", "Julie", "Mark", "Zo\u00eb", "Ken", "Albert", "Tina"]


def number(x):
    return str(int(x)) if float(x).is_integer() else f"{x:g}"


def problem(rng, i):
    name = rng.choice(NAMES)
    a, b, c = rng.randrange(2, 30), rng.randrange(2, 12), rng.randrange(2, 9)
    kind = i % 5
    if kind == 0:
        q = f"{name} has {a} apples. She buys {b} bags with {c} apples in each bag. How many apples does she have now?"
        bc = b * c
        steps = [f"The bags hold {b} * {c} = <<{b}*{c}={bc}>>{bc} apples.",
                 f"So {name} has {a} + {bc} = <<{a}+{bc}={a + bc}>>{a + bc} apples."]
        final = number(a + bc)
    elif kind == 1:
        wage = a * 5
        week = wage * b
        total = week * c * 10
        q = f"{name} earns ${wage} an hour and works {b} hours a week. How much does {name} earn in {c * 10} weeks?"
        steps = [f"In a week {name} earns {wage} * {b} = $<<{wage}*{b}={week}>>{week}.",
                 f"In {c * 10} weeks that is {week} * {c * 10} = $<<{week}*{c * 10}={total}>>{total}."]
        final = f"{total:,}" if i % 3 == 0 else number(total)  # a few references with a thousands comma
    elif kind == 2:
        q = f"The temperature was {b} degrees at noon and dropped {a + b} degrees by midnight. What was the temperature at midnight?"
        steps = [f"It ended at {b} - {a + b} = <<{b}-{a + b}={-a}>>{-a} degrees."]
        final = number(-a)
    elif kind == 3:
        price = rng.choice([1.5, 2.25, 0.75])
        q = f"{name} buys {a} pens that cost ${price:.2f} each. How many dollars does {name} spend?"
        steps = [f"The pens cost {a} * {price:g} = <<{a}*{price:g}={a * price:g}>>{a * price:g} dollars."]
        final = ("$" if i % 2 else "") + number(a * price)
    else:
        q = f"A class of {a * c} students splits into groups of {c}. Each group gets {b} markers. How many markers are handed out?"
        steps = [f"There are {a * c} / {c} = <<{a * c}/{c}={a}>>{a} groups.",
                 f"They get {a} * {b} = <<{a}*{b}={a * b}>>{a * b} markers."]
        final = number(a * b)
    return {"question": q, "answer": "\n".join(steps) + f"\n#### {final}"}


# Responses for the filters and the metric alone, each against a fixture answer (by index): numbers after
# "#### " and elsewhere, with commas, dollars, signs, decimals and a final period, none at all.
RESPONSES = [
    (0, "The bags hold 3 * 4 = 12 apples.\n#### {final}"),
    (0, "#### {final}."),
    (0, "The answer is {final}."),
    (0, "So she has {final} apples.\n#### 7"),
    (0, "#### 7\nShe has {final}."),
    (1, "#### {final}"),
    (1, "So {name} earns ${final}."),
    (1, "#### $ {final}"),
    (1, "That is {final} dollars, or 12 a day."),
    (2, "It ended at {final} degrees.\n#### {final}"),
    (2, "#### -{final}"),
    (2, "It was {final}"),
    (2, "The drop is - 5 degrees."),
    (3, "#### {final}"),
    (3, "The pens cost {final} dollars total."),
    (3, "#### {final}0"),
    (4, "They get 3 * 4 = 12 markers.\n#### {final}"),
    (4, "no number here"),
    (4, ""),
    (4, "#### {final}\n\n"),
    (4, "markers: {final}, groups: 3."),
    (5, "{final}"),
    (5, "#### {final}.00"),
    (6, "The total is 1,{final}"),
    (6, "  #### {final}  "),
    (7, "\u00e9t\u00e9 {final}."),
    (7, "####{final}"),
    (8, "#### {final}.\n"),
    (9, "So: {final}.."),
    (11, "The answer is $1,000,000."),
    (12, "#### 1.5.5"),
    (13, "#### {final}!"),
]


def compare(samples, records):
    same, scored, checked = 0, 0, 0
    for line in open(records, encoding="utf-8"):
        r = json.loads(line)
        if r["config"]["method"] != "fullkv" or r["meta"]["line"] > len(samples):
            continue
        want = samples[r["meta"]["line"] - 1]
        metric = r["config"]["options"].get("metric", "strict")
        checked += 1
        same += r["prediction"] == want["generation"]
        scored += r["score"] == want[metric]
    print(f"{checked} full-cache records: {same} generations identical to lm-eval's, {scored} scores equal")


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--gguf", default=str(ROOT / "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--files", type=pathlib.Path, help="GSM8K's test.jsonl and train.jsonl instead of the fixtures")
    ap.add_argument("--limit", type=int, default=30, help="with --files: the first this many test problems")
    ap.add_argument("--out", type=pathlib.Path, help="with --files: where the results go")
    ap.add_argument("--compare", type=pathlib.Path,
                    help="records of a kvbench run of gsm8k on the same files: its full-cache generations and "
                         "scores against --out's (no model is run)")
    args = ap.parse_args()
    if args.compare:
        compare(json.loads(args.out.read_text())["samples"], args.compare)
        return

    if args.files:
        def read(name):
            return [json.loads(line) for line in open(args.files / name, encoding="utf-8")]
        test, train = read("test.jsonl")[:args.limit], read("train.jsonl")
    else:
        rng = random.Random(8)
        test = [problem(rng, i) for i in range(40)]
        train = [problem(rng, i + 1) for i in range(30)]  # more than random.sample's pool threshold (21)
        OUT.mkdir(parents=True, exist_ok=True)
        for name, docs in (("test", test), ("train", train)):
            with open(OUT / f"{name}.jsonl", "w", encoding="utf-8") as f:
                for d in docs:
                    f.write(json.dumps(d, ensure_ascii=False) + "\n")

    import datasets
    import lm_eval.api.task as task_module
    from lm_eval import evaluator
    from lm_eval.api.metrics import exact_match_hf_evaluate
    from lm_eval.filters.extraction import RegexFilter
    from lm_eval.models.huggingface import HFLM
    from lm_eval.tasks import TaskManager

    sys.path.insert(0, str(ROOT / "tools/reference"))
    import smollm2_hf  # noqa: E402  (the GGUF with SmolLM2's own tokenizer rules, as kvbench encodes)

    def load_dataset(path, name=None, **kwargs):
        assert path == "openai/gsm8k", path
        return datasets.DatasetDict({"train": datasets.Dataset.from_list(train),
                                     "test": datasets.Dataset.from_list(test)})

    task_module.datasets.load_dataset = load_dataset  # the registered task as it is, its data the fixtures
    path = pathlib.Path(args.gguf)
    tok, model = smollm2_hf.load(path)
    lm = HFLM(pretrained=model, tokenizer=tok, batch_size=1)
    out = evaluator.simple_evaluate(model=lm, tasks=["gsm8k"], task_manager=TaskManager(), log_samples=True,
                                    bootstrap_iters=0)
    samples = {}
    for s in out["samples"]["gsm8k"]:
        request = s["arguments"]  # [[context, generation kwargs]] in 0.4.13
        prompt = request[0][0] if isinstance(request, list) else request["gen_args_0"]["arg_0"]
        row = samples.setdefault(s["doc_id"], {"prompt": prompt, "generation": s["resps"][0][0]})
        row[{"strict-match": "strict", "flexible-extract": "flexible"}[s["filter"]]] = float(s["exact_match"])
    golden = {"lm_eval": version("lm_eval"), "model": path.name, "num_fewshot": 5,
              "samples": [samples[i] for i in range(len(test))]}
    if args.files:
        args.out.write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
        print(out["results"]["gsm8k"])
        return

    # The same filters and metric as gsm8k.yaml, on RESPONSES.
    metric = dict(regexes_to_ignore=[",", "\\$", "(?s).*#### ", "\\.$"], ignore_case=True, ignore_punctuation=False)
    filters = {"strict": RegexFilter(regex_pattern="#### (\\-?[0-9\\.\\,]+)"),
               "flexible": RegexFilter(regex_pattern="(-?[$0-9.,]{2,})|(-?[0-9]+)", group_select=-1)}
    golden["responses"] = []
    for k, text in RESPONSES:
        ref = test[k]["answer"]
        final = ref.split("#### ")[-1]
        resp = text.format(final=final, name="x")
        row = {"response": resp, "answer": ref}
        for fname, f in filters.items():
            got = list(f.apply([[resp]], [test[k]]))[0][0]
            row[fname] = float(exact_match_hf_evaluate([got], [ref], **metric)["exact_match"])
        golden["responses"].append(row)
    (OUT / "lm_eval.json").write_text(json.dumps(golden, indent=1, ensure_ascii=False) + "\n")
    print(out["results"]["gsm8k"])
    print(sum(r["strict"] for r in golden["responses"]), sum(r["flexible"] for r in golden["responses"]),
          "of", len(RESPONSES), "made-up responses right (strict, flexible)")


if __name__ == "__main__":
    main()
