#!/usr/bin/env python3
"""RULER's scoring on constructed (prediction, references) pairs, for the C++ parity test.

Runs RULER's own code from a checkout (or bare git dir) of NVIDIA/RULER: string_match_all and
string_match_part from scripts/eval/synthetic/constants.py, and postprocess_pred from
scripts/eval/evaluate.py (extracted with `ast`, since importing that script parses arguments and
needs NeMo). Writes tests/fixtures/ruler/metric_cases.json: each case with the per-pair score of
both metrics, plus the aggregate over all cases as the official evaluator reports it.

  python3 tools/reference/ruler_metrics.py --ruler /path/to/RULER
"""
import argparse
import ast
import json
import os
import random
import re
import subprocess


def ruler_source(root, path):
    if os.path.isdir(os.path.join(root, "scripts")):
        return open(os.path.join(root, path)).read()
    return subprocess.run(["git", f"--git-dir={root}", "show", f"HEAD:{path}"], check=True, capture_output=True,
                          text=True).stdout


def cases():
    rng = random.Random(7)
    refs_pool = [["7492158"], ["Paris"], ["eat a sandwich"], ["LYXQR", "DXNRI", "SOERJ", "TEOKV", "HFUPI"],
                 ["seabass", "spit", "confidence"], ["Ünïcödé"], ["ΣΊΣΥΦΟΣ"], ["İstanbul"], ["straße"], ["東京"],
                 ["a", "b"], ["3.14"], ["x-y"], ["New York", "NYC"], ["  padded  "], ["ß"], ["Ǆ"], ["ﬁle"]]
    preds = ["", " ", "\n", "7492158", " The special magic number is 7492158.", "7492 158", "paris", "PARIS!",
             "I think it is Paris, France.", "Eat A Sandwich and sit", "lyxqr dxnri soerj", "LYXQR, DXNRI, SOERJ, TEOKV, HFUPI",
             "seabass\x00spit\x1fconfidence", "\x1e  seabass spit  \x1f", "ünïcödé", "σίσυφος", "ΣΊΣΥΦΟΣ",
             "i̇stanbul", "istanbul", "STRASSE", "straße", "東京都", "東 京", "3.14159", "x - y", "nyc", "new york",
             "\t\tpadded\t", "  padded  ", "SS", "ß", "ǆ", "ǅ", "file", "ﬁle", "\u00a0Paris\u00a0", "\u2003paris\u3000",
             "\x85Paris", "a", "ab", "b\x1ca", "none of these", "7492158\n7492158", "\r\nParis\r\n"]
    out = []
    for p in preds:
        for r in refs_pool:
            out.append((p, r))
    rng.shuffle(out)
    # Exact hits of every reference set, then predictions built from random subsets of the references
    # with changed case, separators and control characters.
    out += [(" ".join(r), r) for r in refs_pool]
    seps = [" ", ", ", "\n", "\x00", "\x1f", "\t", "|", ""]
    for _ in range(300):
        r = rng.choice(refs_pool)
        chosen = [x for x in r if rng.random() < 0.6]
        cased = [x.upper() if rng.random() < 0.3 else x.lower() if rng.random() < 0.3 else x for x in chosen]
        out.append((rng.choice(["", " ", "\x01", "\n"]) + rng.choice(seps).join(cased) + rng.choice(["", ".", " \x1e"]), r))
    return out


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--ruler", required=True)
    ap.add_argument("--out", default="tests/fixtures/ruler/metric_cases.json")
    args = ap.parse_args()
    ns = {}
    exec(ruler_source(args.ruler, "scripts/eval/synthetic/constants.py"), ns)
    tree = ast.parse(ruler_source(args.ruler, "scripts/eval/evaluate.py"))
    fn = next(n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "postprocess_pred")
    exec(compile(ast.Module(body=[fn], type_ignores=[]), "evaluate.py", "exec"), {"re": re}, ns)
    post = lambda p: ns["postprocess_pred"](p, {})
    records = []
    for p, r in cases():
        q = post(p)
        records.append({"prediction": p, "references": r, "all": ns["string_match_all"]([q], [r]),
                        "part": ns["string_match_part"]([q], [r])})
    preds = [post(c["prediction"]) for c in records]
    refs = [c["references"] for c in records]
    with open(args.out, "w") as f:
        json.dump({"source": "NVIDIA/RULER scripts/eval (string_match_all/part, postprocess_pred)",
                   "aggregate": {"all": ns["string_match_all"](preds, refs), "part": ns["string_match_part"](preds, refs)},
                   "cases": records}, f, indent=0, ensure_ascii=True)
        f.write("\n")
    print(len(records), "cases")


if __name__ == "__main__":
    main()
