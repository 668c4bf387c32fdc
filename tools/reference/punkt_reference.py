#!/usr/bin/env python3
"""NLTK Punkt sentence splitting, for the C++ port's parity test (tasks/ruler/punkt.cpp).

Builds nltk's PunktSentenceTokenizer from the English tables that scripts/setup.sh writes
(<data>/punkt/english, the punkt_tab layout), so no NLTK download is needed, and writes
tests/fixtures/ruler/punkt_cases.json:
  - `cases`: constructed texts (abbreviations, initials, numbers, quotes and brackets after periods,
    ellipses, dashes, newlines, non-ASCII) with nltk's sentences;
  - `essays`: for each Paul Graham essay file of the NIAH haystack, as is and with its whitespace
    collapsed the way RULER builds its essay haystack, the number of sentences and an FNV-1a 64 hash
    of the sentences joined by U+0001 (the essays themselves are data and are not committed).

  python3 tools/reference/punkt_reference.py [--data data]

Needs: nltk (3.10.4 used).
"""
import argparse
import json
import os
import random
import re
import sys

sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from ruler_generate import fnv1a64  # noqa: E402

PIECES = [
    "Mr. Smith went to Washington.", "He met Dr. J. R. Oppenheimer at 5 p.m. on Jan. 3.", "It cost $4.50.",
    "Was it worth it?", "Yes!", "\"I think so.\"", "(See Fig. 3.)", "The U.S. economy grew 2.5% in 1999.",
    "Prof. Knuth wrote T.A.O.C.P. in vols.", "Wait... what?", "He said 'no.' Then he left.",
    "She lives at 221 B. Baker St. now.", "The meeting ended at noon. Everyone left.", "e.g. this one.",
    "The temperature was -3.5 degrees.", "It was the 3rd. of May.", "Numbers like 1,000.00 are common.",
    "[Ref. 12] shows it.", "He wrote: “Stop.” She didn't.", "«Bonjour.» dit-il.", "Look -- over there.",
    "Inc. and Ltd. are suffixes.", "Capt. Ahab! Come here.", "St. Louis is in Mo. state.", "i.e. the end.",
    "Sept. 11 changed things.", "A. Lincoln was president.", "Ok. So.", "Café au lait. Très bien.",
    "Über alles. Noch einmal.", "Is this a question?! Maybe.", "The end.", "Items: a. b. c. d.",
    "He got a Ph.D. in 1990. Then he taught.", "See p. 42. It's there.", "What about No. 7? Nothing.",
]


def constructed(r):
    cases = [p for p in PIECES]
    for _ in range(260):
        k = r.randint(2, 6)
        seps = [" ", "  ", "\n", " \n ", "\n\n", "\t"]
        cases.append("".join(p + r.choice(seps) for p in r.sample(PIECES, k)).rstrip(r.choice(["", " "])))
    cases += ["", " ", "...", "Hello", "a.b.c.", "1. 2. 3.", "\"Quoted.\" \"Again.\"", "end.)", "x. ) y."]
    return cases


def english_tokenizer(data):
    """nltk's PunktSentenceTokenizer with the tables load_punkt_params reads from a punkt_tab
    directory (its path guard refuses directories outside nltk_data, so they are read here)."""
    from collections import defaultdict

    from nltk.tokenize.punkt import PunktParameters, PunktSentenceTokenizer

    def lines(name):
        with open(os.path.join(data, "punkt", "english", name), encoding="utf-8") as f:
            return [line[:-1] if line.endswith("\n") else line for line in f]

    params = PunktParameters()
    params.abbrev_types = set(lines("abbrev_types.txt"))
    params.sent_starters = set(lines("sent_starters.txt"))
    params.collocations = {tuple(line.split("\t")) for line in lines("collocations.tab")}
    params.ortho_context = defaultdict(int, {a: int(b) for a, b in (line.split("\t") for line in lines("ortho_context.tab"))})
    return PunktSentenceTokenizer(params)


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--data", default="data")
    ap.add_argument("--out", default="tests/fixtures/ruler/punkt_cases.json")
    args = ap.parse_args()
    tok = english_tokenizer(args.data)
    r = random.Random(20261123)
    cases = [{"text": t, "sentences": tok.tokenize(t)} for t in constructed(r)]
    essays = []
    folder = os.path.join(args.data, "PaulGrahamEssays")
    for name in sorted(os.listdir(folder)):
        text = open(os.path.join(folder, name), encoding="utf-8").read()
        for form, t in (("file", text), ("collapsed", " ".join(re.sub(r"\s+", " ", text).split(" ")).strip())):
            sents = tok.tokenize(t)
            essays.append({"essay": name, "form": form, "count": len(sents),
                           "fnv1a64": fnv1a64("\x01".join(sents).encode())})
    with open(args.out, "w") as f:
        json.dump({"source": "nltk PunktSentenceTokenizer (3.10.4) with the punkt_tab English tables",
                   "cases": cases, "essays": essays}, f, indent=0, ensure_ascii=False)
        f.write("\n")
    print(len(cases), "cases,", len(essays), "essay forms", file=sys.stderr)


if __name__ == "__main__":
    main()
