#!/usr/bin/env python3
"""Generate the deterministic tokenizer test corpus.

Output: tests/fixtures/tokenizer/corpus.jsonl, one {"text": "..."} object per
line, written with ensure_ascii=True so the file is pure ASCII (characters
outside the BMP appear as JSON surrogate-pair escapes; there are never lone
surrogates).

The corpus is meant to stress a byte-level BPE tokenizer implementation
(pre-tokenizer regexes, special-token splitting, Unicode classes), not to be
natural text.  Every string comes either from a hand-written edge-case list or
from a generator driven by a single random.Random(SEED); random.Random's
integer seeding and choice()/randint() are stable across CPython 3.x, so the
output is byte-for-byte reproducible.  Nothing here reads the model or the
network.

Usage (from the repo root):
    python3 tools/reference/make_tokenizer_corpus.py [--out PATH] [--seed N]
"""

import argparse
import json
import os
import random
import sys

SEED = 20250207
MIN_STRINGS = 2500

# ---------------------------------------------------------------------------
# Chat template support.  The SmolLM2 GGUF ships this Jinja template (ChatML
# with a default system prompt when the first message is not a system one).
# It is simple enough to mirror by hand, which keeps this script free of the
# model file; tokenize_reference.py checks the mirror against transformers'
# apply_chat_template on the same conversations.
# ---------------------------------------------------------------------------
SMOLLM2_DEFAULT_SYSTEM = (
    "You are a helpful AI assistant named SmolLM, trained by Hugging Face"
)

CHAT_CONVERSATIONS = [
    # 1: single user turn, no system message (default system is inserted)
    [{"role": "user", "content": "What is the capital of France?"}],
    # 2: explicit system message + one user turn
    [
        {"role": "system", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "Name a primary colour."},
    ],
    # 3: multi-turn without system message
    [
        {"role": "user", "content": "Hi! Can you add 12 and 30?"},
        {"role": "assistant", "content": "Sure: 12 + 30 = 42."},
        {"role": "user", "content": "And multiply that by 3?"},
    ],
    # 4: system + multi-turn ending with an assistant turn, code and unicode
    [
        {"role": "system", "content": "You write Python.\nKeep answers short."},
        {"role": "user", "content": "Write a function that squares x.\n\n\tThanks!"},
        {"role": "assistant", "content": "def square(x):\n    return x * x\n"},
        {"role": "user", "content": "Now explain it in français, s'il vous plaît \U0001F600"},
        {"role": "assistant", "content": "Elle renvoie x\u00b2."},
    ],
    # 5: content that itself looks like markup, trailing whitespace
    [
        {"role": "user", "content": "  <b>bold</b>   \n"},
        {"role": "assistant", "content": ""},
    ],
]

# (conversation index, add_generation_prompt) pairs used for the chat fixture.
CHAT_FIXTURE_CASES = [(0, True), (1, True), (2, True), (3, False), (4, False)]


def render_smollm2_chat(messages, add_generation_prompt):
    """Hand-written equivalent of the SmolLM2 chat template in the GGUF."""
    out = []
    for i, m in enumerate(messages):
        if i == 0 and messages[0]["role"] != "system":
            out.append("<|im_start|>system\n" + SMOLLM2_DEFAULT_SYSTEM + "<|im_end|>\n")
        out.append("<|im_start|>" + m["role"] + "\n" + m["content"] + "<|im_end|>\n")
    if add_generation_prompt:
        out.append("<|im_start|>assistant\n")
    return "".join(out)


def render_llama3_chat(messages, add_generation_prompt):
    """Llama-3 style header/eot framing (for special-token coverage only)."""
    out = ["<|begin_of_text|>"]
    for m in messages:
        out.append("<|start_header_id|>" + m["role"] + "<|end_header_id|>\n\n"
                   + m["content"].strip() + "<|eot_id|>")
    if add_generation_prompt:
        out.append("<|start_header_id|>assistant<|end_header_id|>\n\n")
    return "".join(out)


# ---------------------------------------------------------------------------
# Building blocks (all written for this corpus).
# ---------------------------------------------------------------------------
SUBJECTS = ["The cat", "my neighbour", "a small robot", "The committee", "Everyone",
            "the old lighthouse keeper", "Our compiler", "this function", "She", "They",
            "A quiet student", "the weather", "Nobody", "the first train", "Your parser"]
VERBS = ["jumped over", "quietly ignored", "rewrote", "painted", "was thinking about",
         "measured", "forgot", "carried", "will optimize", "has never seen",
         "tokenized", "argued with", "borrowed", "found", "refactored"]
OBJECTS = ["the lazy dog", "three red apples", "an unexpected error", "the README",
           "a very long sentence", "the river bank", "two hundred lines of code",
           "the moon", "its own shadow", "a broken umbrella", "the final exam",
           "some rather strange numbers", "the kitchen table", "every edge case"]
TAILS = ["yesterday", "again", "before lunch", "without asking", "in the rain",
         "for no reason at all", "twice", "at 3 a.m.", "on Tuesday", "",
         "while humming", "with great care", "in 2019"]
ENDS = [".", "!", "?", "...", "!?", ";", ":", " .", "", "!!", ".\n"]
CONTRACTIONS = ["it's", "I'll", "we've", "don't", "they're", "she'd", "I'm", "you'll",
                "can't", "won't", "he's", "we'd", "that's", "isn't", "y'all",
                "o'clock", "rock'n'roll", "ma'am", "'tis", "shouldn't've"]
WORDS = ["alpha", "beta", "gamma", "token", "merge", "vocab", "byte", "level", "regex",
         "model", "layer", "cache", "kernel", "tensor", "the", "and", "of", "to", "in",
         "quick", "brown", "fox", "hello", "world", "Hello", "World", "HELLO", "WORLD",
         "Mixed", "CamelCase", "snake_case", "kebab-case", "x", "a", "I", "OK", "ok",
         "naive", "don", "t", "s", "re", "ve", "ll", "m", "d"]


def case_variant(rng, s):
    """Random casing so contraction matching (case-sensitive in GPT-2 style
    regexes, case-insensitive in Llama-3's) is exercised both ways."""
    mode = rng.randrange(5)
    if mode == 0:
        return s
    if mode == 1:
        return s.upper()
    if mode == 2:
        return s.capitalize()
    if mode == 3:
        return s.title()
    return "".join(c.upper() if rng.random() < 0.5 else c.lower() for c in s)


def gen_prose(rng, n):
    out = []
    for _ in range(n):
        parts = []
        for _ in range(rng.randint(1, 3)):
            sent = "%s %s %s %s" % (rng.choice(SUBJECTS), rng.choice(VERBS),
                                    rng.choice(OBJECTS), rng.choice(TAILS))
            sent = sent.rstrip()
            if rng.random() < 0.6:
                c = case_variant(rng, rng.choice(CONTRACTIONS))
                pos = rng.randrange(3)
                if pos == 0:
                    sent = c + " " + sent[0].lower() + sent[1:]
                elif pos == 1:
                    sent = sent + ", " + c
                else:
                    sent = sent + " and " + c + " " + rng.choice(WORDS)
                sent = sent[0].upper() + sent[1:]
            if rng.random() < 0.1:
                sent = sent.replace("'", "\u2019")  # curly apostrophe
            sent += rng.choice(ENDS)
            parts.append(sent)
        out.append(rng.choice([" ", "  ", "\n", " "]).join(parts))
    return out


CODE_SNIPPETS = [
    # Python
    "def fib(n):\n    a, b = 0, 1\n    for _ in range(n):\n        a, b = b, a + b\n    return a\n",
    "class Stack:\n    def __init__(self):\n        self._items = []\n\n    def push(self, x):\n        self._items.append(x)\n\n    def pop(self):\n        return self._items.pop()\n",
    "import os, sys\n\nif __name__ == \"__main__\":\n    print(f\"args={sys.argv[1:]!r}\", file=sys.stderr)\n    sys.exit(0)\n",
    "with open('data.txt', 'r', encoding='utf-8') as fh:\n    lines = [l.rstrip('\\n') for l in fh if l.strip()]\n",
    "x = {'a': 1, 'b': [2, 3], 'c': {'d': None}}  # dict literal\nassert x['b'][1] == 3\n",
    "@decorator(arg=True)\nasync def handler(request, *args, **kwargs) -> dict:\n    return await do_work(request)\n",
    "lambda x: x ** 2 if x >= 0 else -x\n",
    "try:\n\tvalue = int(text)\nexcept ValueError as err:\n\tvalue = -1\nfinally:\n\tpass\n",
    # C++
    "#include <vector>\n#include <cstdint>\n\nint main(int argc, char** argv) {\n    std::vector<int32_t> v{1, 2, 3};\n    for (auto& x : v) { x *= 2; }\n    return 0;\n}\n",
    "template <typename T>\nstruct Span {\n  T* data = nullptr;\n  size_t size = 0;\n  T& operator[](size_t i) const { return data[i]; }\n};\n",
    "namespace kv {\nstatic_assert(sizeof(float) == 4, \"float must be 32-bit\");\nconstexpr uint32_t kMagic = 0x46554747u;  // 'GGUF'\n}  // namespace kv\n",
    "if (a && !b || c != d) {\n\tptr->next = &node;\n} else if (x <<= 2, y >>= 1) {\n\t--count;\n}\n",
    "auto it = std::find_if(m.begin(), m.end(), [&](const auto& kv) { return kv.second > 0.5f; });\n",
    "#define CHECK(x) do { if (!(x)) { fprintf(stderr, \"%s:%d\\n\", __FILE__, __LINE__); abort(); } } while (0)\n",
    # JavaScript / TypeScript
    "const sum = (arr) => arr.reduce((a, b) => a + b, 0);\nconsole.log(`sum=${sum([1, 2, 3])}`);\n",
    "function debounce(fn, ms) {\n  let t;\n  return (...args) => {\n    clearTimeout(t);\n    t = setTimeout(() => fn(...args), ms);\n  };\n}\n",
    "export interface User {\n  id: number;\n  name?: string | null;\n}\n\nlet u: User = { id: 7 };\n",
    "document.querySelectorAll('.item').forEach(el => el.classList.toggle(\"active\"));\n",
    "if (a === b && c !== d) { x ??= 0; y ||= 1; z &&= 2; }\n",
    # Other formats
    "{\n  \"name\": \"kvbench\",\n  \"version\": \"0.1.0\",\n  \"tags\": [\"a\", \"b\"],\n  \"nested\": {\"ok\": true, \"n\": null}\n}\n",
    "<!DOCTYPE html>\n<html>\n  <body>\n    <p class=\"x\">Hello &amp; welcome</p>\n  </body>\n</html>\n",
    "SELECT id, COUNT(*) AS n\nFROM events\nWHERE ts >= '2024-01-01'\nGROUP BY id\nORDER BY n DESC;\n",
    "all: build\n\nbuild:\n\t$(CC) -O2 -o app main.c\n\nclean:\n\trm -f app *.o\n",
    "#!/usr/bin/env bash\nset -euo pipefail\nfor f in *.txt; do\n  echo \"$f: $(wc -l < \"$f\")\"\ndone\n",
    "fn main() {\n    let v: Vec<u8> = (0..=255).collect();\n    println!(\"{:?}\", &v[..4]);\n}\n",
    "diff --git a/x.c b/x.c\n--- a/x.c\n+++ b/x.c\n@@ -1,3 +1,3 @@\n-int x = 1;\n+int x = 2;\n",
]


def gen_code(rng):
    out = []
    for snip in CODE_SNIPPETS:
        out.append(snip)
        out.append(snip.rstrip("\n"))
        # Tabs instead of 4-space (or 2-space) indentation.
        out.append(snip.replace("    ", "\t").replace("  ", "\t"))
        # Windows line endings.
        out.append(snip.replace("\n", "\r\n"))
        # Trailing spaces on every line (spaces before newline).
        out.append(snip.replace("\n", "   \n"))
        # Extra indentation for the whole block.
        out.append("".join("        " + l for l in snip.splitlines(True)))
        lines = snip.splitlines(True)
        for _ in range(4):
            i = rng.randrange(len(lines))
            j = rng.randint(i + 1, len(lines))
            out.append("".join(lines[i:j]))
    return out


def gen_numbers(rng, n):
    fixed = ["1", "12", "123", "1234", "12345", "123456", "1234567890123",
             "0", "00", "007", "-1", "+42", "3.14159", "2.718281828459045", "0.5", ".5",
             "5.", "1e10", "6.022e23", "1.6E-19", "-0.000001", "1,000,000", "1.000.000,50",
             "1 000 000", "1_000_000", "$1,234.56", "\u20ac99.99", "\u00a3 5", "50%", "100 %",
             "+1 (555) 123-4567", "555-0100", "+44 20 7946 0958", "(02) 9876 5432",
             "2024-03-15", "15/03/2024", "03.15.2024", "March 3, 2024", "12:30:45",
             "2024-03-15T12:30:45.123Z", "192.168.0.1", "v1.2.3", "1.2.3-rc.1",
             "0xDEADBEEF", "0b1011", "0o777", "1st 2nd 3rd 4th 21st", "COVID-19", "mp3",
             "H2O", "x86_64", "arm64-v8a", "3D", "4K", "24/7", "9/11", "1/2", "3:2", "10^9",
             "1234567890" * 3, "9" * 40, "   42", "\n7", "x1y2z3", "a1", "1a",
             "123abc456", "12 345", "  1  2  3  ", "1\n2\n3", "1\t2\t3", "3 . 14"]
    out = list(fixed)
    for _ in range(n):
        kind = rng.randrange(8)
        if kind == 0:
            s = str(rng.randint(0, 10 ** rng.randint(1, 25)))
        elif kind == 1:
            s = "%d.%0*d" % (rng.randint(0, 99999), rng.randint(1, 8),
                             rng.randint(0, 10 ** 6))
        elif kind == 2:
            s = "{:,}".format(rng.randint(1000, 10 ** 12))
        elif kind == 3:
            s = "%04d-%02d-%02d" % (rng.randint(1900, 2100), rng.randint(1, 12),
                                    rng.randint(1, 28))
        elif kind == 4:
            s = "+%d %03d %03d %04d" % (rng.randint(1, 99), rng.randint(0, 999),
                                         rng.randint(0, 999), rng.randint(0, 9999))
        elif kind == 5:
            s = "%s %d %s" % (rng.choice(WORDS), rng.randint(0, 99999),
                              rng.choice(WORDS))
        elif kind == 6:
            s = rng.choice(["", " ", "  ", "\n", "x", "(", "$", "-", "#"]) + \
                str(rng.randint(0, 10 ** rng.randint(1, 12))) + \
                rng.choice(["", " ", "%", ")", "px", "kg", ".", "\n", "th"])
        else:
            s = "%.*e" % (rng.randint(0, 6), rng.uniform(-1e6, 1e6))
        out.append(s)
    return out


PUNCT_FIXED = ["!!!", "...", "?!?", "---", "\"''\"", "@#$%^&*", "!", "?", ".", ",",
               "''", "\"\"", "``", "((()))", "[]{}<>", "-->", "<--", "=>", "::", ";;",
               "/*", "*/", "//", "#", "##", "###", "~~~", "___", "***", "|||", "\\\\",
               "&&", "||", "!=", "==", "===", "<=>", "...!", "?!", "\u2026",
               "\u2014", "\u2013", "\u00ab\u00bb", "\u201c\u201d", "\u2018\u2019",
               "\u00bf\u00a1", "\u3002\u3001", "\uff01\uff1f", "!@#$%^&*()_+-=[]{}|;':\",./<>?`~",
               " !", " !!", "! !", "a!b", "end.", "end. ", "(a)", "'quoted'", "\"dq\"",
               "e.g.", "i.e.", "U.S.A.", "Mr. Smith", "'s", "'S", "'t", "'ll", "'LL",
               "''s", "'''", "' s", " 's", "'", "\"", "`", "\\n", "\\t", "\\"]
PUNCT_CHARS = "!\"#$%&'()*+,-./:;<=>?@[\\]^_`{|}~"


def gen_punct(rng, n):
    out = list(PUNCT_FIXED)
    for _ in range(n):
        k = rng.randint(1, 12)
        s = "".join(rng.choice(PUNCT_CHARS) for _ in range(k))
        if rng.random() < 0.5:
            s = rng.choice(WORDS) + rng.choice(["", " "]) + s + rng.choice(["", " ", "\n"]) + rng.choice(WORDS)
        out.append(s)
    return out


WS_FIXED = ["", " ", "  ", "   ", "    ", "\t", "\t\t", "\n", "\n\n", "\n\n\n", "\r\n",
            "\r\n\r\n", "\r", " \n", "  \n", "\n ", "\n  ", " \t\n", "\t \n \t",
            "a  b", "a   b", "a\tb", "a\nb", "a\n\nb", "a\n\n\nb", "a\r\nb", "a \nb",
            "a  \nb", "a\n b", "a\n  b", " a", "  a", "   a", "a ", "a  ", "a   ",
            " a ", "  hello  world  ", "hello \n world", "x\n\n\n\n\ny", "\n\nhi\n\n",
            "\t\tindented", "    indented", "\v", "\f", "a\vb", "a\fb",
            "line1\nline2\r\nline3\rline4", " \u00a0 ", "tab\tthen  spaces   end   "]
WS_SEPS = [" ", "  ", "   ", "\t", "\n", "\n\n", "\r\n", " \n", "\n ", "\t\t", " \t ",
           "\n\n\n", "\r", "    ", "\n    ", "  \n  "]


def gen_whitespace(rng, n):
    out = list(WS_FIXED)
    for _ in range(n):
        words = [rng.choice(WORDS + ["1", "42", "!", "(", "\u00e9t\u00e9", "\u4e2d"])
                 for _ in range(rng.randint(1, 6))]
        s = ""
        for w in words:
            s += w + rng.choice(WS_SEPS)
        if rng.random() < 0.4:
            s = rng.choice(WS_SEPS) + s
        if rng.random() < 0.5:
            s = s.rstrip(" \t\r\n")
        out.append(s)
    return out


EMOJI = ["\U0001F600", "\U0001F602", "\U0001F44D", "\U0001F44D\U0001F3FD",
         "\U0001F44B\U0001F3FF", "\U0001F468\u200D\U0001F469\u200D\U0001F467\u200D\U0001F466",
         "\U0001F3F3\uFE0F\u200D\U0001F308", "\U0001F1FA\U0001F1F8", "\U0001F1EF\U0001F1F5",
         "\U0001F1E9\U0001F1EA", "\U0001F1EE\U0001F1F3", "\u2764\uFE0F", "\u2764",
         "1\uFE0F\u20E3", "#\uFE0F\u20E3", "\U0001F9D1\U0001F3FF\u200D\U0001F4BB",
         "\U0001F469\U0001F3FB\u200D\U0001F52C", "\U0001F937\u200D\u2642\uFE0F",
         "\U0001F40D", "\U0001F980", "\U0001FAE0", "\U0001F525", "\u2728", "\u2705",
         "\U0001F3F4\U000E0067\U000E0062\U000E0073\U000E0063\U000E0074\U000E007F",
         "\u263A", "\u2603\uFE0F", "\U0001F408\u200D\u2B1B", "\U0001F9D4\u200D\u2640\uFE0F",
         "\U0001F91D\U0001F3FC", "\U0001F680", "\U0001F4A9", "\u00a9\uFE0F", "\u2122"]


def gen_emoji(rng, n):
    out = list(EMOJI)
    out += ["I love it " + EMOJI[0] + EMOJI[0] + EMOJI[0],
            "".join(EMOJI), " ".join(EMOJI), "flags: " + "".join(EMOJI[7:11]),
            "family" + EMOJI[5] + "time", EMOJI[5] * 5]
    for _ in range(n):
        k = rng.randint(1, 5)
        s = ""
        for _ in range(k):
            s += rng.choice(EMOJI) + rng.choice(["", "", " ", rng.choice(WORDS), "!", "\n"])
        if rng.random() < 0.5:
            s = rng.choice(WORDS) + rng.choice(["", " "]) + s
        out.append(s)
    return out


SCRIPT_PHRASES = [
    # Chinese
    "\u6211\u559c\u6b22\u5728\u65e9\u4e0a\u559d\u8336\u3002",
    "\u4eca\u5929\u7684\u5929\u6c14\u5f88\u597d\uff0c\u6211\u4eec\u53bb\u516c\u56ed\u6563\u6b65\u5427\uff01",
    "\u8fd9\u4e2a\u6a21\u578b\u6709\u4e00\u4ebf\u4e09\u5343\u4e94\u767e\u4e07\u4e2a\u53c2\u6570",
    "\u4e2d\u6587English\u6df7\u5408123",
    # Japanese (hiragana, katakana, kanji)
    "\u3053\u3093\u306b\u3061\u306f\u3001\u4e16\u754c\u3002",
    "\u30ab\u30bf\u30ab\u30ca\u3068\u3072\u3089\u304c\u306a\u3092\u6df7\u305c\u3066\u66f8\u304d\u307e\u3059\u3002",
    "\u6771\u4eac\u306f\u65e5\u672c\u306e\u9996\u90fd\u3067\u3059\u3002",
    "\u30c8\u30fc\u30af\u30ca\u30a4\u30b6\u30fc\u306e\u30c6\u30b9\u30c8",
    "\uff8a\uff9d\uff76\uff78\uff76\uff80\uff76\uff85",  # half-width katakana
    # Korean
    "\uc548\ub155\ud558\uc138\uc694, \ub9cc\ub098\uc11c \ubc18\uac11\uc2b5\ub2c8\ub2e4.",
    "\uc624\ub298\uc740 \ub0a0\uc528\uac00 \uc88b\ub124\uc694.",
    "\ud55c\uad6d\uc5b4 \ud615\ud0dc\uc18c \ubd84\uc11d",
    # Accented Latin
    "caf\u00e9 na\u00efve fa\u00e7ade r\u00e9sum\u00e9 co\u00f6perate",
    "\u00c5ngstr\u00f6m in Z\u00fcrich and S\u00e3o Paulo",
    "\u0141\u00f3d\u017a, \u0130stanbul, stra\u00dfe, \u0133sselmeer, \ufb01nancial",
    "\u00c0 bient\u00f4t! \u00c7a va? \u00d1and\u00fa, \u00e6sir, \u00f8l, \u00fe\u00f0",
    "Cr\u00e8me br\u00fbl\u00e9e co\u00fbte 5\u20ac",
    # Cyrillic
    "\u041f\u0440\u0438\u0432\u0435\u0442, \u043c\u0438\u0440! \u041a\u0430\u043a \u0434\u0435\u043b\u0430?",
    "\u0422\u043e\u043a\u0435\u043d\u0438\u0437\u0430\u0442\u043e\u0440 \u0440\u0430\u0431\u043e\u0442\u0430\u0435\u0442 \u0431\u044b\u0441\u0442\u0440\u043e.",
    "\u0423\u043a\u0440\u0430\u0457\u043d\u0441\u044c\u043a\u0430 \u043c\u043e\u0432\u0430: \u0457\u0436\u0430\u043a, \u0491\u0430\u043d\u043e\u043a",
    # Greek
    "\u0393\u03b5\u03b9\u03ac \u03c3\u03bf\u03c5 \u039a\u03cc\u03c3\u03bc\u03b5",
    "\u0397 \u03b3\u03bb\u03ce\u03c3\u03c3\u03b1 \u03b5\u03af\u03bd\u03b1\u03b9 \u03cc\u03bc\u03bf\u03c1\u03c6\u03b7; \u03b1\u03b2\u03b3 \u0394\u03a3\u03a9",
    # Arabic (RTL)
    "\u0645\u0631\u062d\u0628\u0627 \u0628\u0627\u0644\u0639\u0627\u0644\u0645",
    "\u0627\u0644\u0644\u063a\u0629 \u0627\u0644\u0639\u0631\u0628\u064a\u0629 \u062c\u0645\u064a\u0644\u0629 \u0661\u0662\u0663",
    "\u0643\u064e\u062a\u064e\u0628\u064e \u0627\u0644\u0637\u0651\u064e\u0627\u0644\u0650\u0628\u064f",  # with harakat
    # Hebrew
    "\u05e9\u05dc\u05d5\u05dd \u05e2\u05d5\u05dc\u05dd",
    "\u05d6\u05d4 \u05de\u05d1\u05d7\u05df 123 \u05e9\u05dc \u05d8\u05d5\u05e7\u05e0\u05d9\u05d6\u05e8",
    # Devanagari
    "\u0928\u092e\u0938\u094d\u0924\u0947 \u0926\u0941\u0928\u093f\u092f\u093e",
    "\u092e\u0948\u0902 \u0939\u093f\u0902\u0926\u0940 \u092a\u0922\u093c \u0930\u0939\u093e \u0939\u0942\u0901\u0964",
    # Thai (no spaces between words)
    "\u0e2a\u0e27\u0e31\u0e2a\u0e14\u0e35\u0e04\u0e23\u0e31\u0e1a",
    "\u0e20\u0e32\u0e29\u0e32\u0e44\u0e17\u0e22\u0e44\u0e21\u0e48\u0e21\u0e35\u0e0a\u0e48\u0e2d\u0e07\u0e27\u0e48\u0e32\u0e07\u0e23\u0e30\u0e2b\u0e27\u0e48\u0e32\u0e07\u0e04\u0e33",
    # Misc scripts
    "\u10e5\u10d0\u10e0\u10d7\u10e3\u10da\u10d8",  # Georgian
    "\u0540\u0561\u0575\u0565\u0580\u0565\u0576",  # Armenian
    "\u12a0\u121b\u122d\u129b",  # Ethiopic
    "\u0ba4\u0bae\u0bbf\u0bb4\u0bcd",  # Tamil
    "\U00010330\U00010331\U00010332",  # Gothic (non-BMP letters)
    "\U00020000\U0002A6D6",  # CJK Ext-B
]


def gen_scripts(rng, n):
    out = list(SCRIPT_PHRASES)
    for _ in range(n):
        k = rng.randint(1, 3)
        parts = [rng.choice(SCRIPT_PHRASES) for _ in range(k)]
        if rng.random() < 0.5:
            parts.insert(rng.randrange(len(parts) + 1), rng.choice(WORDS))
        if rng.random() < 0.3:
            parts.append(str(rng.randint(0, 9999)))
        out.append(rng.choice([" ", "", "\n", ", "]).join(parts))
    return out


UNI_WS = ["\u00a0", "\u1680", "\u2000", "\u2001", "\u2002", "\u2003", "\u2004", "\u2005",
          "\u2006", "\u2007", "\u2008", "\u2009", "\u200a", "\u2028", "\u2029", "\u202f",
          "\u205f", "\u3000", "\u0085", "\u200b", "\u200c", "\u200d", "\u2060", "\ufeff",
          "\u180e", "\u000b", "\u000c", "\u001c", "\u001d", "\u001e", "\u001f"]


def gen_unicode_ws(rng, n):
    out = []
    for w in UNI_WS:
        out += [w, "a" + w + "b", w + "word", "word" + w, w + w, " " + w + " ",
                "1" + w + "2", w + "\n"]
    for _ in range(n):
        s = ""
        for _ in range(rng.randint(1, 5)):
            s += rng.choice(WORDS + ["1", "\u00e9", "\u4e2d\u6587"]) + rng.choice(UNI_WS + [" "])
        if rng.random() < 0.3:
            s = rng.choice(UNI_WS) + s
        out.append(s)
    return out


COMBINING = ["e\u0301", "n\u0303", "a\u0308\u0301", "o\u0302\u0323", "u\u031b\u0309",
             "Z\u0351\u036b\u0343\u036a\u0302a\u0352\u0342l\u0351\u0308g\u0344\u0300o\u0300\u0301",
             "\u1100\u1161\u11a8",  # decomposed Hangul
             "\u0915\u094d\u0937",  # Devanagari conjunct with virama
             "\u0301",  # lone combining mark
             "\u0301\u0301\u0301 start",
             "x\u20d7", "\u00e9 vs e\u0301", "A\u030a vs \u00c5 vs \u212b",
             "\u0063\u0327\u0061", "i\u0307", "q\u0307\u0323"]


def gen_combining(rng, n):
    out = list(COMBINING)
    marks = [chr(c) for c in range(0x0300, 0x0370)]
    for _ in range(n):
        s = ""
        for _ in range(rng.randint(1, 8)):
            s += rng.choice("aeiouxyzAEIOU \u03b1\u0436")
            for _ in range(rng.randint(0, 4)):
                s += rng.choice(marks)
        out.append(s)
    return out


NUMERIC_OTHER = ["\uff10\uff11\uff12\uff13\uff14\uff15\uff16\uff17\uff18\uff19",
                 "\uff11\uff12\uff13abc", "\u00b2", "\u00b3", "\u00b9", "x\u00b2 + y\u00b2 = z\u00b2",
                 "\u2070\u2074\u2075\u2076", "H\u2082O", "\u2080\u2081\u2082\u2083",
                 "\u216b", "\u217b", "Chapter \u2163", "\u2160\u2161\u2162\u2163\u2164",
                 "\u00bd", "\u00bc \u00be", "\u2153\u215e", "1\u00bd cups", "\u2460\u2461\u2462",
                 "\u2474\u2475", "\u0660\u0661\u0662\u0663\u0664\u0665\u0666\u0667\u0668\u0669",
                 "\u0966\u0967\u0968\u0969", "\u0ce7\u0ce8", "\u3007\u4e00\u4e8c",
                 "\U0001D7CE\U0001D7CF\U0001D7D0", "\U000104A0\U000104A1", "\u0f20\u0f21",
                 "\u1040\u1041", "\u17e0\u17e1", "\u2070", "10\u00b3", "\u00b2\u00b3\u00b9",
                 "\u3252\u3253", "\U0001F100", "\u2189", "\u0e51\u0e52\u0e53"]


def gen_numeric_other(rng, n):
    out = list(NUMERIC_OTHER)
    pool = "".join(NUMERIC_OTHER) + "0123456789"
    for _ in range(n):
        s = "".join(rng.choice(pool) for _ in range(rng.randint(1, 10)))
        if rng.random() < 0.5:
            s = rng.choice(WORDS) + rng.choice(["", " "]) + s
        out.append(s)
    return out


def gen_long(rng):
    out = ["a" * 600, "ab" * 400, " " * 600, "\n" * 520, "\t" * 510, "1234567890" * 60,
           "supercalifragilisticexpialidocious" * 20,
           "Pneumonoultramicroscopicsilicovolcanoconiosis",
           "the " * 200, "x" * 1000 + " " + "y" * 1000, "!" * 700, "." * 512,
           "\u4e2d" * 600, "\U0001F600" * 300, "\u00e9" * 550, "\u0120" * 300,
           "\u0120\u010a\u0109 literal byte-level chars", "Ġhello Ċ ĉ",
           "\u00a0" * 520, "-" * 80 + "\n" + "=" * 80, "0" * 501,
           "https://example.com/a/very/long/path/" + "segment/" * 70 + "?q=1&r=2#frag",
           "QUJDREVGR0hJSktMTU5PUFFSU1RVVldYWVo" * 16 + "==",
           "deadbeefcafebabe0123456789abcdef" * 20]
    pieces = WORDS + CONTRACTIONS + ["\n", "\t", "  ", "1234", "\u00e9t\u00e9",
                                     "\U0001F44D", "\u4e2d\u6587", "<|im_end|>"]
    for _ in range(30):
        s = ""
        target = rng.randint(500, 3000)
        while len(s) < target:
            s += rng.choice(pieces) + rng.choice([" ", " ", "", "\n", ", "])
        out.append(s)
    for _ in range(10):
        # Long words without any separator.
        out.append("".join(rng.choice("abcdefghijklmnopqrstuvwxyz") for _ in range(rng.randint(60, 900))))
    return out


SMOL_SPECIALS = ["<|im_start|>", "<|im_end|>", "<|endoftext|>", "<repo_name>", "<file_sep>",
                 "<filename>", "<gh_stars>", "<jupyter_code>", "<empty_output>"]
LLAMA3_SPECIALS = ["<|begin_of_text|>", "<|end_of_text|>", "<|start_header_id|>",
                   "<|end_header_id|>", "<|eot_id|>", "<|reserved_special_token_5|>"]
MALFORMED = ["<|im_start", "im_start|>", "<|im_start |>", "< |im_start|>", "<|IM_START|>",
             "<|im_start|", "<<|im_start|>>", "<|im_end", "|im_end|>", "<im_end>",
             "<|endoftext", "<|endoftext|", "<|end of text|>", "<|", "|>", "<||>", "<|>",
             "<|eot_id", "<|start_header_id", "<|begin_of_text|", "<|eot_id |>",
             "<|im_st<|im_end|>art|>", "<|im_start|><|im_start", "<repo_name", "<filename",
             "<|im\u200b_start|>", "\uff1c|im_start|\uff1e"]


def gen_specials(rng, n):
    out = [
        "<|im_start|>", "<|im_end|>", "<|endoftext|>", "<|begin_of_text|>",
        "<|start_header_id|>", "<|eot_id|>",
        "<|im_start|>user\nHello<|im_end|>",
        "<|im_start|>assistant\nHi there!<|im_end|>\n",
        "text<|im_end|>text", "<|im_start|><|im_start|>", "<|im_end|><|im_end|><|im_end|>",
        " <|endoftext|> ", "  <|endoftext|>  ", "\n<|im_end|>\n", "word<|endoftext|>word",
        "<|endoftext|><|endoftext|>", "123<|im_end|>456", "!<|im_start|>?",
        "<|im_end|>\n<|im_start|>assistant", "\U0001F600<|im_end|>\u4e2d",
        "<|begin_of_text|><|start_header_id|>user<|end_header_id|>\n\nHi<|eot_id|>",
        "<|begin_of_text|>Hello", "Hello<|eot_id|>", "<|eot_id|><|eot_id|>",
        "<|start_header_id|>system<|end_header_id|>", "x<|reserved_special_token_5|>y",
        "<repo_name>kvbench<file_sep>README.md", "<filename>foo.py\nprint(1)",
        "<jupyter_code>import numpy as np<jupyter_output>", "<gh_stars>100",
    ]
    out += MALFORMED
    out += [m + "user" for m in MALFORMED[:8]]
    all_sp = SMOL_SPECIALS + LLAMA3_SPECIALS
    fillers = WORDS + ["", "", " ", "\n", "\n\n", "  ", "123", "!", "\u00e9", "\U0001F44D",
                       "user", "assistant", "system"]
    for _ in range(n):
        s = ""
        for _ in range(rng.randint(1, 5)):
            r = rng.random()
            if r < 0.4:
                s += rng.choice(all_sp)
            elif r < 0.5:
                s += rng.choice(MALFORMED)
            else:
                s += rng.choice(fillers)
        out.append(s)
    return out


def gen_chat():
    out = []
    for conv in CHAT_CONVERSATIONS:
        for agp in (False, True):
            out.append(render_smollm2_chat(conv, agp))
            out.append(render_llama3_chat(conv, agp))
    return out


def gen_controls():
    """Every C0 control and DEL, alone and inside text, plus code points whose
    UTF-8 lead byte is 0xF1/0xF2 (planes 4-11).  Several of these bytes
    (e.g. 0x04, 0x1D, 0xF1, 0xF2) have no byte-level token in the SmolLM2
    vocab, so they exercise the "byte not in vocab" path."""
    out = []
    for c in list(range(0x00, 0x20)) + [0x7F]:
        ch = chr(c)
        out += [ch, "a" + ch + "b", ch + ch + " x"]
    for cp in (0x40000, 0x7FFFF, 0x80000, 0xBFFFF):
        out += [chr(cp), "x" + chr(cp) + "y", " " + chr(cp)]
    return out


# Code-point ranges for random "soup" strings: (lo, hi, weight).  Surrogates
# (U+D800..U+DFFF) are deliberately absent; noncharacters and private-use code
# points are valid scalar values and are included.
SOUP_RANGES = [
    (0x20, 0x7E, 30), (0x00, 0x1F, 3), (0x7F, 0x9F, 2), (0xA0, 0xFF, 6),
    (0x100, 0x24F, 4), (0x370, 0x3FF, 3), (0x400, 0x4FF, 3), (0x590, 0x6FF, 3),
    (0x900, 0x97F, 2), (0xE00, 0xE7F, 2), (0x300, 0x36F, 3), (0x2000, 0x206F, 4),
    (0x2070, 0x218F, 3), (0x3000, 0x30FF, 4), (0x4E00, 0x9FFF, 5), (0xAC00, 0xD7A3, 3),
    (0xE000, 0xE0FF, 1), (0xFB00, 0xFFFF, 3), (0x1F300, 0x1FAFF, 5),
    (0x10000, 0x1007F, 1), (0x1D400, 0x1D7FF, 2), (0x20000, 0x2A6DF, 1),
    (0xE0000, 0xE007F, 1), (0x10FFFE, 0x10FFFF, 1),
]


def gen_soup(rng, n):
    weights = [w for _, _, w in SOUP_RANGES]
    out = []
    for _ in range(n):
        chars = []
        for _ in range(rng.randint(1, 40)):
            lo, hi, _ = rng.choices(SOUP_RANGES, weights=weights)[0]
            chars.append(chr(rng.randint(lo, hi)))
        out.append("".join(chars))
    return out


def build_corpus(seed):
    rng = random.Random(seed)
    corpus = []
    corpus += WS_FIXED[:4]  # "", " ", "  ", "   " first for easy spotting
    corpus += gen_prose(rng, 450)
    corpus += gen_code(rng)
    corpus += gen_numbers(rng, 250)
    corpus += gen_punct(rng, 120)
    corpus += gen_whitespace(rng, 220)
    corpus += gen_emoji(rng, 130)
    corpus += gen_scripts(rng, 180)
    corpus += gen_unicode_ws(rng, 100)
    corpus += gen_combining(rng, 60)
    corpus += gen_numeric_other(rng, 80)
    corpus += gen_long(rng)
    corpus += gen_specials(rng, 260)
    corpus += gen_chat()
    corpus += gen_controls()
    corpus += gen_soup(rng, 320)

    # De-duplicate, keeping first occurrence, so every line is a distinct case.
    seen = set()
    uniq = []
    for s in corpus:
        if s not in seen:
            seen.add(s)
            uniq.append(s)
    return uniq


def main():
    repo_root = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--out", default=os.path.join(repo_root, "tests/fixtures/tokenizer/corpus.jsonl"))
    ap.add_argument("--seed", type=int, default=SEED)
    args = ap.parse_args()

    corpus = build_corpus(args.seed)
    for s in corpus:
        # Strict UTF-8 encoding fails on lone surrogates: guarantee valid Unicode.
        s.encode("utf-8", errors="strict")
    if len(corpus) < MIN_STRINGS:
        sys.exit("corpus too small: %d < %d" % (len(corpus), MIN_STRINGS))

    os.makedirs(os.path.dirname(os.path.abspath(args.out)), exist_ok=True)
    with open(args.out, "w", encoding="ascii", newline="\n") as f:
        for s in corpus:
            f.write(json.dumps({"text": s}, ensure_ascii=True) + "\n")
    print("wrote %d strings to %s" % (len(corpus), args.out))


if __name__ == "__main__":
    main()
