#!/usr/bin/env python3
"""rouge_score's stemmed ROUGE-1 and NLTK's Porter stemmer, for the C++ port's parity test
(harness/task/rouge_score.cpp), which HeadKV-R profiling uses as its success test.

Writes tests/fixtures/rouge/cases.json:
  - `stems`: {word: nltk PorterStemmer().stem(word)} for every distinct lowercase word of the Paul
    Graham essays of the NIAH haystack (setup fetches them) plus words chosen for the stemmer's
    special cases (irregular forms, -ied/-ies, double consonants, -alli, -logi, y rules);
  - `rouge`: (target, prediction) pairs with rouge_score's rouge1/rouge2 precision, recall, F.

  python3 tools/reference/rouge_reference.py [--data data]

Needs: nltk (3.10.4 used), rouge_score (0.1.2 used).
"""
import argparse
import glob
import json
import os
import random
import re

from nltk.stem.porter import PorterStemmer
from rouge_score import rouge_scorer

SPECIAL = """sky skies dying lying tying news innings inning outings outing cannings canning howe proceed
exceed succeed ties died cried spied pies agreed feed bleed plastered motoring sing conflated troubled
sized hopping tanned falling hissing fizzed failing filing happy sky fly syzygy yes toy boyish crying
relational conditional rational valenci hesitanci digitizer conformabli radicalli differentli vileli
analogousli vietnamization predication operator feudalism decisiveness hopefulness callousness
formaliti sensitiviti sensibiliti triplicate formative formalize electriciti electrical hopeful goodness
revival allowance inference airliner gyroscopic adjustable defensible irritant replacement adjustment
dependent adoption homologou communism activate angulariti homologous effective bowdlerize probate rate
cease controll roll generalli beautifulli analogi archaeologi apology ology yy ayy by ay abbey
ear eyes dyes says""".split()

CASES = [
    ("records were once again broken, and in some cases smashed, for greenhouse gas levels.",
     "Records were broken and smashed for greenhouse gases"),
    ("take a walk in Chaoyang Park and have a cup of Espresso in the evening",
     "The best thing to do is to take a walk in the park."),
    ("Because he is a mean person and also he can't ride a horse or dive a car.",
     "He is mean; he cannot ride horses or drive cars!"),
    ("the the the cat", "the cat cat"),
    ("", "anything at all"),
    ("something", ""),
    ("Numbers 123 and 4.5 and x86-64", "numbers 123 45 x86 64"),
    ("İstanbul café naïve résumé", "istanbul cafe naive resume"),
    ("Generalizations, relational conditionals; hopefulness.", "generalization relate condition hope"),
]


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data")
    ap.add_argument("--out", default="tests/fixtures/rouge/cases.json")
    args = ap.parse_args()
    words = set(SPECIAL)
    for f in sorted(glob.glob(os.path.join(args.data, "PaulGrahamEssays", "*.txt"))):
        with open(f, encoding="utf-8") as fh:
            words.update(re.findall(r"[a-z0-9]+", fh.read().lower()))
    stemmer = PorterStemmer()
    stems = {w: stemmer.stem(w) for w in sorted(words)}
    scorer = rouge_scorer.RougeScorer(["rouge1", "rouge2"], use_stemmer=True)
    rng = random.Random(0)
    sample = sorted(words)
    cases = list(CASES)
    for _ in range(40):  # random bags of real words, repeats included
        t = " ".join(rng.choice(sample) for _ in range(rng.randint(1, 25)))
        p = " ".join(rng.choice(t.split() + sample[:50]) for _ in range(rng.randint(1, 25)))
        cases.append((t, p))
    rouge = []
    for t, p in cases:
        s = scorer.score(t, p)
        rouge.append({"target": t, "prediction": p,
                      **{k: [s[k].precision, s[k].recall, s[k].fmeasure] for k in ("rouge1", "rouge2")}})
    with open(args.out, "w", encoding="ascii") as fh:
        json.dump({"stems": stems, "rouge": rouge}, fh, ensure_ascii=True, indent=0, sort_keys=True)
    print(f"{len(stems)} stems, {len(rouge)} rouge cases -> {args.out}")


if __name__ == "__main__":
    main()
