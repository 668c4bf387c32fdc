#!/usr/bin/env python3
"""The layers of the source tree, checked: every #include "..." of a project file must point to its own
component or to one the table below lets it use. All targets share the source root as include path,
so the compiler would accept an upward include; this check is what refuses it.

    python3 tests/check_layers.py [--root DIR]   # the tree: exit 1 and one line per violation
    python3 tests/check_layers.py --self-test    # the tree plus planted upward includes: each must be caught
"""
import argparse
import os
import re
import sys

# Bottom to top. A component may include itself and what it lists (and, through them, nothing else:
# the lists are written out in full so that the table reads as the rule).
BELOW = {
    "util": [],                      # harness/util: errors, JSON, hashing, parameters, maps
    "kernels": ["util"],             # kernels/: dtypes, CPU and CUDA kernels with their references
    "model": ["util", "kernels"],    # harness/model: GGUF, safetensors, configs
    "tokenizer": ["util", "kernels", "model"],
    "cache": ["util", "kernels"],    # harness/cache: LayerCache and the shared storage formats
    "engine": ["util", "kernels", "model", "tokenizer", "cache"],
    "method-api": ["util", "kernels", "model", "tokenizer", "cache", "engine"],  # harness/method
    "task-api": ["util", "kernels", "model", "tokenizer"],                       # harness/task
    "method": ["util", "kernels", "model", "tokenizer", "cache", "engine", "method-api", "task-api"],
    "task": ["util", "kernels", "model", "tokenizer", "task-api"],
    "experiment": ["util", "kernels", "model", "tokenizer", "cache", "engine", "method-api", "task-api"],
    "report": ["util", "kernels", "model", "tokenizer", "cache", "engine", "method-api", "task-api", "experiment"],
}
TOP = "app"  # harness/cli, python/, tests/, fuzz/ and the methods' own tests: may include anything

SOURCE = re.compile(r"\.(cpp|hpp|h|cu|cuh)$")
INCLUDE = re.compile(r'^\s*#\s*include\s+"([^"]+)"')


def component(path):
    """(kind, instance) of a source path relative to the root, or None outside the layered folders."""
    parts = path.split("/")
    name = parts[-1]
    if parts[0] == "harness" and len(parts) > 2:
        sub = parts[1]
        if sub == "cli":
            return (TOP, "")
        kind = {"method": "method-api", "task": "task-api"}.get(sub, sub)
        return (kind, "") if kind in BELOW else None
    if parts[0] == "kernels":
        return ("kernels", "")
    if parts[0] == "methods" and len(parts) > 2:
        if name.startswith("test_"):
            return (TOP, "")
        return ("method", parts[1])  # one folder, one method (or one family of variants)
    if parts[0] == "tasks" and len(parts) > 2:
        if name.startswith("test_"):
            return (TOP, "")
        return ("task", parts[1])
    if parts[0] in ("python", "tests", "fuzz", "examples"):
        return (TOP, "")
    return None


def allowed(src, dst):
    if src[0] == TOP or src == dst:
        return True
    if dst[0] == TOP:
        return False
    # Plugins never include one another: a method folder or a task folder is used only through its
    # registry (what two of them share moves down into harness/).
    return dst[0] in BELOW[src[0]]


def sources(root):
    out = {}
    for top in ("harness", "kernels", "methods", "tasks", "python", "tests", "fuzz", "examples"):
        for dirpath, _, files in os.walk(os.path.join(root, top)):
            for f in files:
                if SOURCE.search(f):
                    full = os.path.join(dirpath, f)
                    with open(full, encoding="utf-8", errors="replace") as fh:
                        out[os.path.relpath(full, root)] = fh.read()
    return out


def violations(files, root):
    bad = []
    for path, text in sorted(files.items()):
        src = component(path)
        if src is None:
            continue
        for no, line in enumerate(text.splitlines(), 1):
            m = INCLUDE.match(line)
            if not m:
                continue
            inc = m.group(1)
            if inc not in files and not os.path.exists(os.path.join(root, inc)):
                continue  # generated headers, the tests' own helpers by bare name
            dst = component(inc)
            if dst is None or allowed(src, dst):
                continue
            what = lambda c: c[0] + (f" {c[1]}" if c[1] else "")  # noqa: E731
            bad.append(f"{path}:{no}: includes {inc}: {what(src)} may not use {what(dst)}")
    return bad


PLANTED = {
    "kernels/cpu/planted_upward.cpp": '#include "harness/engine/engine.hpp"\n',
    "harness/method/planted_task.cpp": '#include "harness/task/task.hpp"\n',
    "methods/snapkv/planted_peer.cpp": '#include "methods/pyramidkv/pyramidkv.hpp"\n',
    "tasks/niah/planted_method.cpp": '#include "harness/method/method.hpp"\n',
    "harness/experiment/planted_report.cpp": '#include "harness/report/report.hpp"\n',
}


def main():
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--root", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), ".."))
    ap.add_argument("--self-test", action="store_true", help="plant upward includes and require each to be caught")
    args = ap.parse_args()
    root = os.path.abspath(args.root)
    files = sources(root)
    if not files:
        sys.exit(f"{root}: no sources under harness/, kernels/, methods/, tasks/")
    if args.self_test:
        found = violations({**files, **PLANTED}, root)
        missed = [p for p in PLANTED if not any(v.startswith(p + ":") for v in found)]
        if missed:
            sys.exit("planted upward includes not caught: " + ", ".join(missed))
        print(f"all {len(PLANTED)} planted upward includes caught")
        return
    bad = violations(files, root)
    for v in bad:
        print(v)
    if bad:
        sys.exit(f"{len(bad)} include(s) against the layers (tests/check_layers.py)")
    print(f"{len(files)} files, every include within the layers")


if __name__ == "__main__":
    main()
