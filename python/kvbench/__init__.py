"""kvbench from Python: the native engine, its method and task registries, sweeps, results and the
benchmarks' own metrics, and KV-cache compression methods written in Python.

    import kvbench
    m = kvbench.Model("models/SmolLM2-135M-Instruct.Q4_1.gguf")
    out = m.generate("What is the capital of France?", method="snapkv", budget=64)
    kvbench.run("experiments/quickstart.yaml")
    df = kvbench.load_results("runs/quickstart.jsonl")

The work stays in the native engine; numpy arrays handed to Python methods are views of its memory,
without copies, valid during the call that receives them.
"""
from __future__ import annotations

import importlib
import json
import math
import os
import tempfile
from typing import Any, Iterable, Sequence

import numpy as np

from . import _kvbench
from ._kvbench import Error, LayerView, Model

__all__ = ["Error", "LayerView", "Method", "Model", "code_version", "load_results", "methods", "register", "run",
           "sample_scores", "score", "summarize", "tasks"]


def methods() -> list[dict]:
    """The registered methods (Python ones included): name, summary, params (name, type, default,
    range or choices, help), composition, budgeted, offline_step."""
    return _kvbench.methods()


def tasks() -> list[dict]:
    """The registered tasks with their options."""
    return _kvbench.tasks()


def code_version() -> str:
    """The code version compiled in (git describe), as records carry it."""
    return _kvbench.code_version()


class Method:
    """A KV-cache compression method written in Python.

    Subclass it, give the parameters' defaults in `params` (their types are the parameters' types)
    and implement `compress(view, budget)`. It is called once per layer after the full-attention
    prefill of a prompt longer than the KV size, with `view` (a LayerView: `queries`, `keys`,
    `values`, `attention()`, ... as numpy arrays) and `budget`, the KV size T in tokens. Return either

    - the kept positions of each stored head: an int array [stored_heads, k] or a list of 1-D int
      arrays (heads may keep different counts), at most T each, window included if you keep one; or
    - float scores [n_heads or n_kv_heads, n_tokens - window] of the prefix: the shared top-k then
      keeps the best T - window of each stored head plus the last `window` tokens, as SnapKV does.

    At run time `self.params` holds the resolved values (with `gqa`). `needs()` says what the prefill
    must keep for the method: the window of queries (by default the `window` parameter, if any),
    accumulated attention (`attn_colsum`) and pre-RoPE keys (`k_pre_rope`).
    """

    params: dict[str, Any] = {}

    def needs(self) -> dict:
        return {"window": int(self.params.get("window", 0))}

    def compress(self, view: LayerView, budget: int):
        raise NotImplementedError(f"{type(self).__name__}.compress")


def register(cls: type, name: str | None = None, params: dict[str, Any] | None = None,
             summary: str | None = None) -> type:
    """Puts a Method subclass in the native registry, so that Model.generate, run and YAML specs use
    it like a C++ method. `name` defaults to "python:MODULE.CLASS" (the name a spec may also give
    without registering first); `params` to the class's own `params`."""
    if not (isinstance(cls, type) and issubclass(cls, Method)):
        raise TypeError(f"kvbench.register: {cls!r} is not a subclass of kvbench.Method")
    name = name or f"python:{cls.__module__}.{cls.__qualname__}"
    doc = (summary or (cls.__doc__ or "").strip().split("\n")[0]) or "written in Python"
    _kvbench.register_method(cls, name, dict(cls.params if params is None else params), doc)
    return cls


def _resolve(name: str) -> bool:
    # A spec's "python:module.Class" is imported and registered the first time it is asked for.
    if not name.startswith("python:"):
        return False
    module, _, attr = name[len("python:"):].rpartition(".")
    if not module:
        raise ValueError(f"{name}: expected python:MODULE.CLASS")
    cls = getattr(importlib.import_module(module), attr, None)
    if cls is None:
        raise ValueError(f"{name}: module {module} has no {attr}")
    register(cls, name=name)
    return True


_kvbench.set_method_resolver(_resolve)


def run(spec: str | os.PathLike | dict, shard: str | tuple[int, int] | None = None, progress: bool = True) -> dict:
    """Runs a sweep: a spec file, or a dict of the same keys. Resumable, like `kvbench run`. Returns
    the cells run, those already recorded, those that failed (their errors in the `failures` file),
    the results file (`out`), the times, and the prompt tokens of the shared prefills with how many of
    them were computed (`prompt_tokens`, `prefilled_tokens`: the rest continued shared prefixes)."""
    shard_text = "" if shard is None else shard if isinstance(shard, str) else f"{shard[0]}/{shard[1]}"
    if isinstance(spec, dict):
        # JSON is YAML: the spec loader reads the dict as written, errors naming its keys.
        with tempfile.TemporaryDirectory(prefix="kvbench_spec_") as d:
            path = os.path.join(d, f"{spec.get('name', 'spec')}.yaml")
            with open(path, "w", encoding="utf-8") as f:
                json.dump(spec, f, indent=2)  # one key a line: errors' line numbers point at keys
            try:
                return _kvbench.run(path, shard_text, progress)
            except Error as e:  # the file is gone when the caller reads the error: name the dict instead
                raise Error(str(e).replace(path, "the spec dict (as JSON, indent 2)")) from None
    return _kvbench.run(os.fspath(spec), shard_text, progress)


def _record_files(paths: Iterable[str | os.PathLike]) -> list[str]:
    files = []
    for p in map(os.fspath, paths):
        if os.path.isdir(p):
            files += sorted(os.path.join(p, f) for f in os.listdir(p) if f.endswith((".jsonl", ".jsonl.gz")))
        else:
            files.append(p)
    return files


def load_results(*paths: str | os.PathLike):
    """Result records (files, plain or gzip-compressed, or directories of .jsonl and .jsonl.gz files
    such as a Slurm sweep's shards) as a pandas DataFrame, one row per record counted: the documented fields,
    nested ones as `config.method`, `config.params.window`, `meta.depth`, ... A torn last line is
    skipped; a malformed record is an error naming the file and line. As in kvbench report, a cell
    recorded twice counts once, and so does a sample of runs over overlapping grids (NIAH's depths=3
    and depths=5 share depth 50); copies that disagree on the score are an error."""
    import pandas as pd

    return pd.json_normalize(_kvbench.read_records([str(f) for f in _record_files(paths)]), max_level=2)


# Task options that name one part of a sweep's grid (a length, a depth, a RULER task, a LongBench
# dataset): cells that differ only in these are one configuration, as in kvbench report's summary.
_GRID_OPTIONS = ("s_len", "e_len", "step", "depths", "samples", "task", "dataset", "length")


def summarize(df, by: Sequence[str] | None = None):
    """One row per configuration of a results DataFrame (load_results): its mean score x 100 (a
    perplexity task's: exp of the mean NLL, the perplexity), the
    number of samples `n`, and the 95% interval `ci_low`, `ci_high` (Wilson's for 0/1 scores, else a
    percentile bootstrap over samples resampled within each RULER task or LongBench dataset; NaN for
    one sample or too few to bootstrap), the same numbers as kvbench report's summary. `by` names the
    grouping column or columns (default: every `config.*` column but the grid's options and the code
    version)."""
    import pandas as pd

    if by is None:
        skip = {f"config.options.{o}" for o in _GRID_OPTIONS} | {"config.version"}
        by = [c for c in df.columns if c.startswith("config.") and c not in skip]
    by = [by] if isinstance(by, str) else list(by)
    if missing := [c for c in by if c not in df.columns]:
        raise ValueError(f"summarize: no column {', '.join(map(repr, missing))} in the records; their config "
                         f"columns: {', '.join(c for c in df.columns if c.startswith('config.'))}")
    # Values left nested by load_results (an artifact's digest under config.artifacts.*) group by their
    # JSON text, as the report's configurations do.
    nested = [c for c in by if df[c].map(lambda v: isinstance(v, (dict, list))).any()]
    if nested:
        df = df.copy()
        for c in nested:
            df[c] = df[c].map(lambda v: json.dumps(v, sort_keys=True) if isinstance(v, (dict, list)) else v)
    # A RULER cell's strata are its tasks, a LongBench cell's its datasets: a frame holding both has both
    # columns, each empty in the other's rows.
    strata = [c for c in ("config.options.task", "config.options.dataset") if c in df.columns]
    strata = strata[0] if len(strata) == 1 else strata  # a list of one warns in pandas 2
    # A perplexity task's scores are mean NLLs: its score is exp of their mean, as the report prints it.
    perplexity = {t["name"] for t in _kvbench.tasks() if t["perplexity"]}
    rows = []
    for key, g in df.groupby(by, dropna=False, sort=True):
        groups = [s["score"].tolist() for _, s in g.groupby(strata, dropna=False)] if strata else [g["score"].tolist()]
        ci = _kvbench.score_interval(groups, "samples")
        tasks = set(g["config.task"]) if "config.task" in g else set()
        if tasks & perplexity and len(tasks) > 1:
            raise ValueError(f"summarize: a group mixes a perplexity task with others ({', '.join(sorted(tasks))}); "
                             "group by config.task")
        scale = math.exp if tasks & perplexity else (lambda v: 100 * v)
        row = dict(zip(by, key if isinstance(key, tuple) else (key,)))
        row.update(score=scale(ci["mean"]), n=ci["n"],
                   ci_low=float("nan") if ci["ci_low"] is None else scale(ci["ci_low"]),
                   ci_high=float("nan") if ci["ci_high"] is None else scale(ci["ci_high"]), interval=ci["interval"])
        rows.append(row)
    return pd.DataFrame(rows)


def _meta(n: int, value, what: str) -> list:
    if value is None:
        return [[] for _ in range(n)] if what == "all_classes" else [0] * n
    value = list(value)
    if len(value) != n:
        raise ValueError(f"score: {len(value)} {what} for {n} predictions")
    return value


def sample_scores(dataset: str, predictions: Sequence[str], answers: Sequence[Sequence[str]], *,
                  all_classes: Sequence[Sequence[str]] | None = None, data: str | None = None) -> np.ndarray:
    """The benchmark's own metric of each prediction, in [0, 1]: `longbench/NAME` (eval.py's metric
    of the dataset, its first-line rule included), `ruler/TASK` (string_match_all, string_match_part
    for the QA tasks), `niah` (answers unused) or `jsonl/METRIC` (the jsonl task's metrics).
    `all_classes` (LongBench's classification datasets) is one list of class names for every
    prediction, or one list per prediction."""
    if isinstance(predictions, str):
        raise TypeError("sample_scores: predictions must be a list of strings, not one string")
    answers = [[a] if isinstance(a, str) else list(a) for a in answers]
    if all_classes is not None and not isinstance(all_classes, str) and all(isinstance(c, str) for c in all_classes):
        all_classes = [list(all_classes)] * len(predictions)  # one class list for every prediction
    elif isinstance(all_classes, str) or (all_classes is not None and any(isinstance(c, str) for c in all_classes)):
        raise TypeError("sample_scores: all_classes must be one list of class names, or one such list per prediction")
    classes = _meta(len(predictions), all_classes, "all_classes")
    return np.asarray(_kvbench.score_each(dataset, list(predictions), answers, [list(c) for c in classes],
                                          data or _kvbench.default_data_dir()))


def score(dataset: str, predictions: Sequence[str] | str | os.PathLike, answers: Sequence[Sequence[str]] | None = None,
          *, all_classes: Sequence[Sequence[str]] | None = None, length: Sequence[int] | None = None,
          data: str | None = None):
    """The score as the benchmark reports it, on predictions made anywhere: the mean of
    sample_scores x 100, rounded to 2 decimals for LongBench (as eval.py) and RULER (as evaluate.py).
    For `longbench-e/NAME`, a dict of LongBench-E's length ranges (by `length`). `predictions` may
    also a file in LongBench's pred/ layout (`pred`, `answers`, `all_classes`, `length`), as `kvbench
    score` reads it, for any of these datasets; a line missing a field is an error naming the line."""
    if isinstance(predictions, (str, os.PathLike)) and answers is None:
        bench = dataset.partition("/")[0]
        r = _kvbench.score_file(dataset, os.fspath(predictions), bench == "longbench-e", data or _kvbench.default_data_dir())
        return {k: v for k, v in r.items() if k not in ("score", "lines")} if bench == "longbench-e" else r["score"]
    if answers is None:
        raise ValueError("score: answers are needed with a list of predictions")
    s = sample_scores(dataset, predictions, answers, all_classes=all_classes, data=data)
    if dataset.startswith("longbench-e/"):
        if length is None:
            raise ValueError(f"score: {dataset} is scored by length range: give each prediction's `length`")
        lengths = _meta(len(s), length, "lengths")
        ranges = {"0-4k": [], "4-8k": [], "8k+": []}
        for x, n in zip(s, lengths):
            ranges["0-4k" if n < 4000 else "4-8k" if n < 8000 else "8k+"].append(x)
        return {k: (round(100 * float(np.mean(v)), 2) if v else None) for k, v in ranges.items()}
    if not len(s):
        raise ValueError("score: no predictions")
    # Summed in order, in each script's own order of operations (a rounding tie goes its way): LongBench's
    # eval.py 100 * sum / n, the others' (RULER's) sum / n * 100, as `kvbench score` takes them.
    total = sum(s.tolist())
    mean = 100 * total / len(s) if dataset.startswith("longbench/") else total / len(s) * 100
    return mean if dataset == "niah" else round(mean, 2)
