#!/usr/bin/env python3
"""Render conversations with transformers' own Jinja chat-template renderer.

Output: tests/fixtures/tokenizer/chat_templates.jsonl, one line per template and
conversation: {"template", "messages", "add_generation_prompt", "text"} or
{"..., "error"} where transformers refuses the conversation. The templates are
the files in tests/fixtures/tokenizer/templates/ (the families kvbench
recognises, with their tool-use branches cut: kvbench renders no tools). The
Llama 3.2 template asks for today's date; it is rendered with date_string set to
its literal fallback, as kvbench renders it.

Usage (from the repo root, transformers 5 installed):
    python3 tools/reference/chat_templates.py
"""

import json
import os

from transformers.utils.chat_template_utils import render_jinja_template

ROOT = os.path.join(os.path.dirname(__file__), "..", "..")
TEMPLATES = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "templates")
OUT = os.path.join(ROOT, "tests", "fixtures", "tokenizer", "chat_templates.jsonl")

SPECIAL = {
    "llama": {"bos_token": "<|begin_of_text|>", "eos_token": "<|eot_id|>"},
    "sentencepiece": {"bos_token": "<s>", "eos_token": "</s>"},
    "chatml": {"bos_token": "", "eos_token": "<|im_end|>"},
}


def U(c):
    return {"role": "user", "content": c}


def S(c):
    return {"role": "system", "content": c}


def A(c):
    return {"role": "assistant", "content": c}


CONVERSATIONS = [
    [U("hi")],
    [U("What is the capital of France?")],
    [S("Be brief."), U("hi")],
    [U("hi"), A("hello"), U("how are you?")],
    [S("Be brief."), U("hi"), A("hello"), U("bye")],
    [U("  hi  \n")],
    [U("\n\nhi\n\n")],
    [U("\u00a0hi\u3000")],
    [U("\x0bhi\x0c")],
    [U("\u2028hi\u0085")],
    [U("\x1chi\x1f")],
    [U("")],
    [S(""), U("hi")],
    [S("Be brief.  "), U("  hi")],
    [S("  \n"), U("hi")],
    [U("x</s>y<s>[INST]z")],
    [U("<<SYS>>\nfoo\n<</SYS>>\n\nbar")],
    [U("hi"), A("  hello  "), U("\tagain")],
    [U("\u65e5\u672c\u8a9e \U0001f600 e\u0301")],
]


def family(name):
    if name.startswith("llama3"):
        return "llama"
    if name.startswith(("llama2", "mistral")):
        return "sentencepiece"
    return "chatml"


def main():
    with open(OUT, "w") as out:
        for file in sorted(os.listdir(TEMPLATES)):
            name = file[: -len(".jinja")]
            template = open(os.path.join(TEMPLATES, file)).read()
            extra = dict(SPECIAL[family(name)])
            if name == "llama32":
                extra["date_string"] = "26 Jul 2024"
            for messages in CONVERSATIONS:
                for agp in (True, False):
                    row = {"template": name, "messages": messages, "add_generation_prompt": agp}
                    try:
                        text, _ = render_jinja_template(
                            [messages], chat_template=template, add_generation_prompt=agp, **extra
                        )
                        row["text"] = text[0]
                    except Exception as e:  # the template's own raise_exception
                        row["error"] = str(e)
                    out.write(json.dumps(row, ensure_ascii=True) + "\n")


if __name__ == "__main__":
    main()
