"""The Python module against the command line and the C++ methods on the default model, the metrics
against the golden fixtures, and the errors of Python methods. Run by ctest (tests/CMakeLists.txt)
with PYTHONPATH=<build>/python and KVBENCH_CLI=<build>/kvbench."""
import gzip
import json
import os
import pathlib
import subprocess
import sys

import numpy as np
import pytest

import kvbench
from kvbench import summarize

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
MODEL = os.path.join(os.environ.get("KVBENCH_MODELS", os.path.join(ROOT, "models")), "SmolLM2-135M-Instruct.Q4_1.gguf")
CLI = os.environ.get("KVBENCH_CLI", os.path.join(ROOT, "build", "kvbench"))
FIXTURES = os.path.join(ROOT, "tests", "fixtures")
sys.path.insert(0, os.path.join(ROOT, "examples"))
from streaming import Streaming  # noqa: E402  (examples/streaming.py: StreamingLLM in numpy)

needs_model = pytest.mark.skipif(not os.path.exists(MODEL) and os.environ.get("KVBENCH_REQUIRE_MODELS") != "1",
                                 reason=f"{MODEL} absent (scripts/setup.sh)")
PROMPT = "What is the capital of France? Answer in one word. " * 12


@pytest.fixture(scope="module")
def model():
    return kvbench.Model(pathlib.Path(MODEL), threads=2)  # a path-like, as load_results takes


def cli(*args):
    # The command line on the OpenBLAS kernels this interpreter's module runs (it would otherwise move
    # off OpenBLAS's fallback where the module cannot), so that both sum in the same order.
    env = {**os.environ, "OPENBLAS_CORETYPE": kvbench._kvbench.blas_kernels()}
    return subprocess.run([CLI, *args], check=True, capture_output=True, text=True, env=env).stdout


kvbench.register(Streaming, name="numpy_streaming")


class Raising(kvbench.Method):
    def compress(self, view, budget):
        raise ValueError("no thanks")


kvbench.register(Raising, name="raising")


@needs_model
def test_generate_and_logits_equal_the_cli(model):
    got = model.generate("What is the capital of France?", chat=True, max_new_tokens=16)
    want = json.loads(cli("generate", MODEL, "--prompt", "What is the capital of France?", "--chat", "--json",
                          "-n", "16", "--threads", "2"))
    assert got["text"] == want["text"]
    assert got["ids"] == want["tokens"]
    assert got["kv_bytes"] == want["prefill_kv_bytes"]

    got = model.generate(PROMPT, method="snapkv", budget=32, params={"window": 8}, max_new_tokens=8)
    want = json.loads(cli("generate", MODEL, "--prompt", PROMPT, "--chat", "--json", "-n", "8", "--method", "snapkv",
                          "--budget", "32", "--param", "window=8", "--threads", "2"))
    assert got["text"] == want["text"] and got["kv_bytes"] == want["prefill_kv_bytes"]
    assert got["kv_bytes"] < got["full_kv_bytes"]

    text = "The capital of France is"
    logits = model.logits(model.tokenize(text, prompt=True))
    top = json.loads(cli("logits", MODEL, "--text", text, "--top-k", "5", "--threads", "2"))["top"]
    order = np.argsort(-logits, kind="stable")[:5]
    assert [t["id"] for t in top] == order.tolist()
    np.testing.assert_allclose([t["logit"] for t in top], logits[order], rtol=0, atol=1e-4)
    assert model.detokenize(model.tokenize(text)) == text


def test_runs_under_the_numpy_it_is_named_for():
    # ctest runs this suite under the system numpy (1.x) and under numpy 2 from the package index.
    want = os.environ.get("KVBENCH_EXPECT_NUMPY")
    if want:
        assert np.__version__.split(".")[0] == want, f"numpy {np.__version__}, expected {want}.x"


@needs_model
@pytest.mark.parametrize("method, budget, params, steps", [
    ("", 0, None, 0), ("", 0, None, 3), ("snapkv", 32, {"window": 8}, 3), ("kvmix", 0, None, 2),
    ("streamingllm", 24, {"sinks": 4}, 0)])
def test_logits_equal_the_cli_bit_for_bit(model, tmp_path, method, budget, params, steps):
    ids = model.tokenize(PROMPT, chat=True)
    got = model.logits(ids, method=method, budget=budget, params=params, steps=steps)
    args = ["logits", MODEL, "--text", PROMPT, "--chat", "--threads", "2", "--out", str(tmp_path / "l.npy"),
            "--steps", str(steps)]
    if method:
        args += ["--method", method] + (["--budget", str(budget)] if budget else [])
        args += [a for k, v in (params or {}).items() for a in ("--param", f"{k}={v}")]
    info = json.loads(cli(*args))
    want = np.load(tmp_path / "l.npy")
    assert info["tokens"] == len(ids)
    if not method and not steps:
        assert got.shape == (model.config["vocab_size"],)
        want = want[0]
    else:
        assert got.shape == (1 + steps, model.config["vocab_size"])
    assert got.dtype == np.float32 and got.strides[-1] == 4
    assert np.array_equal(got, want)
    assert len(np.unique(got)) > 1000  # a real row, not one value repeated (numpy 2 with an old pybind11)
    if method == "snapkv":  # the greedy tokens fed are the argmax of each row
        assert [s["fed"] for s in info["steps"][1:]] == np.argmax(got[:-1], axis=1).tolist()
        full = model.logits(ids, steps=steps)
        assert np.array_equal(full[0], got[0]) and not np.array_equal(full[1:], got[1:])


@needs_model
def test_logits_errors_say_what_a_method_needs(model):
    ids = model.tokenize("Hello", prompt=True)
    with pytest.raises(kvbench.Error, match="Model.logits: method snapkv needs a budget"):
        model.logits(ids, method="snapkv")
    with pytest.raises(kvbench.Error, match="takes no budget"):
        model.logits(ids, method="kvmix", budget=16)
    with pytest.raises(kvbench.Error, match="steps 2 but a continuation of 1 tokens"):
        model.logits(ids, steps=2, continuation=[5])
    rows = model.logits(ids, continuation=[5, 6])
    assert rows.shape == (3, model.config["vocab_size"])
    assert np.array_equal(rows[0], model.logits(ids))


NIAH = ["-o", "s_len=600", "-o", "e_len=600", "-o", "depths=1"]


def cli_sample_prompt():
    out = cli("sample", "niah", "-m", MODEL, *NIAH)
    return out.split("--- prompt ---\n", 1)[1][:-1]  # printed with one newline after it


@needs_model
@pytest.mark.parametrize("method, budget", [("snapkv", 64), ("h2o", 48), ("pyramidkv", 64)])
def test_kept_positions_equal_the_kept_sets_the_cli_writes(model, tmp_path, method, budget):
    cli("dump-prefill", "niah", "-m", MODEL, *NIAH, "--method", method, "--budget", str(budget),
        "--out", str(tmp_path))
    meta = json.load(open(tmp_path / "meta.json"))
    prompt = cli_sample_prompt()
    assert model.tokenize(prompt, prompt=True) == meta["prompt_ids"]
    got = model.kept_positions(prompt, method, budget, chat=False)
    assert len(got) == meta["layers"][-1] + 1
    for layer, heads in enumerate(got):
        widths = np.load(tmp_path / f"layer{layer}.widths.npy")
        assert len(heads) == widths.shape[0]
        for h, kept in enumerate(heads):
            assert kept.dtype == np.int32
            assert np.array_equal(kept, np.flatnonzero(widths[h] > 0)), (layer, h)


@needs_model
def test_every_view_a_python_method_reads_holds_the_engine_values(model, tmp_path):
    cli("dump-prefill", "niah", "-m", MODEL, *NIAH, "--window", "8", "--layers", "0,7", "--out", str(tmp_path))
    seen = {}

    class Recorder(kvbench.Method):
        params = {"window": 8}

        def needs(self):
            return {"window": 8, "attn_colsum": True, "k_pre_rope": True}

        def compress(self, view, budget):
            if view.layer in (0, 7):
                # Kept as they come: found by an audit, the engine's reused memory changed them after the call.
                seen[view.layer] = {k: getattr(view, k) for k in
                                    ("queries", "keys", "values", "keys_pre_rope", "attn_colsum")}
                seen[view.layer]["attention"] = view.attention()
            return np.tile(np.arange(view.n_tokens - budget, view.n_tokens), (view.stored_heads, 1))

    kvbench.register(Recorder, name="recorder")
    model.kept_positions(cli_sample_prompt(), "recorder", 64, chat=False)
    model.generate(PROMPT, max_new_tokens=2)  # the engine's buffers hold another prompt now
    for layer, v in seen.items():
        k, q = np.load(tmp_path / f"layer{layer}.k.npy"), np.load(tmp_path / f"layer{layer}.q_window.npy")
        assert np.array_equal(v["keys"], k) and np.array_equal(v["values"], np.load(tmp_path / f"layer{layer}.v.npy"))
        assert np.array_equal(v["queries"], q)
        n, heads = k.shape[0], q.shape[1]
        # RoPE rotates: each key's norm is the same before and after it.
        np.testing.assert_allclose(np.linalg.norm(v["keys_pre_rope"], axis=2), np.linalg.norm(k, axis=2), rtol=1e-4)
        assert not np.array_equal(v["keys_pre_rope"][1:], k[1:])
        # Every query's attention sums to 1, so a head's column sums add up to the number of queries.
        np.testing.assert_allclose(v["attn_colsum"].sum(axis=1), np.full(heads, n), rtol=1e-3)
        # attention(): the window rows recomputed here from the queries and keys.
        kk = np.repeat(k, heads // k.shape[1], axis=1)
        s = np.einsum("whd,nhd->hwn", q.astype(np.float64), kk.astype(np.float64)) / np.sqrt(k.shape[2])
        s[:, np.arange(8)[:, None] < np.arange(n)[None, :] - (n - 8)] = -np.inf
        ref = np.exp(s - s.max(axis=2, keepdims=True))
        ref /= ref.sum(axis=2, keepdims=True)
        np.testing.assert_allclose(v["attention"], ref, rtol=0, atol=1e-5)


@needs_model
def test_python_streamingllm_keeps_what_the_cpp_one_keeps(model):
    py = model.kept_positions(PROMPT, "numpy_streaming", budget=24, params={"sinks": 4})
    cpp = model.kept_positions(PROMPT, "streamingllm", budget=24, params={"sinks": 4})
    assert len(py) == len(cpp) == model.config["n_layers"]
    for a, b in zip(py, cpp):
        assert all(np.array_equal(x, y) for x, y in zip(a, b))
    assert len(py[0][0]) == 24
    g_py = model.generate(PROMPT, method="numpy_streaming", budget=24, max_new_tokens=12)
    g_cpp = model.generate(PROMPT, method="streamingllm", budget=24, params={"sinks": 4}, max_new_tokens=12)
    assert (g_py["text"], g_py["ids"], g_py["kv_bytes"]) == (g_cpp["text"], g_cpp["ids"], g_cpp["kv_bytes"])


@needs_model
def test_scores_go_through_the_shared_top_k(model):
    # Python scores = SnapKV's own window attention (its defaults: window 32, max pooling over 7, mean
    # over the window rows) give SnapKV's kept sets.
    class AttentionScores(kvbench.Method):
        params = {"window": 32}

        def compress(self, view, budget):
            a = view.attention()[:, :, : view.n_tokens - self.params["window"]].mean(axis=1)
            pad = np.pad(a, ((0, 0), (3, 3)), constant_values=-np.inf)
            return np.lib.stride_tricks.sliding_window_view(pad, 7, axis=1).max(axis=2)

    kvbench.register(AttentionScores, name="attention_scores")
    py = model.kept_positions(PROMPT, "attention_scores", budget=64)
    cpp = model.kept_positions(PROMPT, "snapkv", budget=64)
    same = sum(np.array_equal(x, y) for a, b in zip(py, cpp) for x, y in zip(a, b))
    total = sum(len(a) for a in cpp)
    assert same >= total - 2, f"{same} of {total} heads keep SnapKV's set"  # float ties may differ


@needs_model
@pytest.mark.parametrize("returned, fragment", [
    ("too_many", "keeps 25 positions, more than the KV size 24"),
    ("out_of_range", "out of range"),
    ("floats_wrong_shape", "scores of shape"),
    ("strings", "dtype"),
    ("raise", "compress() raised ValueError: no thanks"),
    ("heads", "position lists; expected one per stored head"),
    ("score_lists", "found floats; scores are one float array"),
    ("huge_unsigned", "position 9223372036854775813 is out of range"),
])
def test_python_method_errors_name_the_method_and_layer(model, returned, fragment):
    class Bad(kvbench.Method):
        def compress(self, view, budget):
            n = view.n_tokens
            if returned == "too_many":
                return np.tile(np.arange(budget + 1), (view.stored_heads, 1))
            if returned == "out_of_range":
                return np.tile(np.arange(n - budget + 1, n + 1), (view.stored_heads, 1))
            if returned == "floats_wrong_shape":
                return np.zeros((view.stored_heads, 3), dtype=np.float32)
            if returned == "strings":
                return np.array([["a"] * budget] * view.stored_heads)
            if returned == "heads":
                return [np.arange(budget)]
            if returned == "score_lists":  # scores.tolist(): read as one position list per head
                return np.zeros((view.stored_heads, n - 8)).tolist()
            if returned == "huge_unsigned":
                return np.full((view.stored_heads, 1), 2**63 + 5, dtype=np.uint64)
            raise ValueError("no thanks")

    kvbench.register(Bad, name=f"bad_{returned}")
    with pytest.raises(kvbench.Error) as e:
        model.generate(PROMPT, method=f"bad_{returned}", budget=24, max_new_tokens=4)
    assert f"python method bad_{returned}, layer 0" in str(e.value)
    assert fragment in str(e.value)


@needs_model
def test_a_head_may_keep_nothing_written_as_an_empty_list(model):
    class Nothing(kvbench.Method):
        def compress(self, view, budget):
            return [[] for _ in range(view.stored_heads)]  # numpy reads [] as float64

    kvbench.register(Nothing, name="nothing")
    assert all(len(h) == 0 for layer in model.kept_positions(PROMPT, "nothing", 24) for h in layer)


def sweep_spec(tmp_path, methods, name):
    return {"name": name, "model": MODEL, "task": "niah", "threads": 2,
            "task_options": {"s_len": 300, "e_len": 400, "step": 100, "depths": 2, "chat": True},
            "methods": methods, "budgets": [64], "out": str(tmp_path / f"{name}.jsonl")}


@needs_model
def test_a_sweep_with_python_methods_records_failed_cells_and_keeps_the_rest(tmp_path):
    out = kvbench.run(sweep_spec(tmp_path, ["fullkv", "streamingllm", "numpy_streaming", "raising",
                                            "python:keynorm.KeyNorm"], "mixed"), progress=False)
    assert out["run"] == 16 and out["failed"] == 4  # 4 samples x (fullkv, 2 streamings, keynorm) / raising
    assert 0 < out["prefilled_tokens"] <= out["prompt_tokens"]
    failures = [json.loads(line) for line in open(out["failures"])]
    assert {f["config"]["method"] for f in failures} == {"raising"}
    assert all("python method raising, layer 0: compress() raised ValueError" in f["error"] for f in failures)
    df = kvbench.load_results(out["out"])
    assert len(df) == 16
    for col in ("key", "score", "config.method", "config.params.sinks", "kv_bytes", "meta.depth", "prediction"):
        assert col in df.columns
    a = df[df["config.method"] == "streamingllm"].sort_values("id")
    b = df[df["config.method"] == "numpy_streaming"].sort_values("id")
    assert a["prediction"].tolist() == b["prediction"].tolist()
    assert a["kv_bytes"].tolist() == b["kv_bytes"].tolist()
    # Compressed as committed results are, the records read the same, alone or from their directory.
    packed = tmp_path / "packed"
    packed.mkdir()
    with open(out["out"], "rb") as f, gzip.open(packed / "mixed.jsonl.gz", "wb") as g:
        g.write(f.read())
    for source in (packed / "mixed.jsonl.gz", packed):
        assert kvbench.load_results(source).equals(df)
    # A rerun retries only the failed cells.
    again = kvbench.run(sweep_spec(tmp_path, ["fullkv", "streamingllm", "numpy_streaming", "raising",
                                              "python:keynorm.KeyNorm"], "mixed"), progress=False)
    assert (again["run"], again["already"], again["failed"]) == (0, 16, 4)


def test_registries_list_methods_and_tasks():
    methods = {m["name"]: m for m in kvbench.methods()}
    assert "snapkv" in methods and methods["snapkv"]["composition"] == "selector"
    assert {p["name"] for p in methods["snapkv"]["params"]} >= {"window", "kernel", "gqa"}
    assert methods["numpy_streaming"]["params"][0]["name"] in ("sinks", "gqa")
    assert {"niah", "ruler", "longbench"} <= {t["name"] for t in kvbench.tasks()}
    # Defaults and ranges typed as the parameter (they were strings and floats).
    window = next(p for p in methods["snapkv"]["params"] if p["name"] == "window")
    assert window["default"] == 32 and window["range"] == (1, 4096) and isinstance(window["range"][0], int)
    for m in kvbench.methods():
        for p in m["params"]:
            want = {"int": int, "float": float, "bool": bool}.get(p["type"], str)
            assert p["default"] is None or isinstance(p["default"], want), (m["name"], p)


LONGBENCH_DATASET = {"qa_f1": "qasper", "rouge": "gov_report", "classification_first_line": "trec",
                     "code_sim": "lcc", "count": "passage_count", "retrieval": "passage_retrieval_en",
                     "retrieval_zh": "passage_retrieval_zh", "qa_f1_zh": "multifieldqa_zh", "rouge_zh": "dureader"}


def test_score_equals_the_golden_metric_fixtures():
    cases = json.load(open(os.path.join(FIXTURES, "longbench", "metric_cases.json")))["cases"]
    data = os.path.join(ROOT, "data")
    checked = 0
    for metric, dataset in LONGBENCH_DATASET.items():
        if metric.endswith("_zh") and not os.path.isdir(os.path.join(data, "jieba")):
            continue
        cs = [c for c in cases if c["metric"] == metric]
        preds, answers = [c["prediction"] for c in cs], [[c["answer"]] for c in cs]
        classes = [c.get("all_classes", []) for c in cs]
        got = kvbench.sample_scores(f"longbench/{dataset}", preds, answers, all_classes=classes, data=data)
        np.testing.assert_allclose(got, [c["score"] for c in cs], rtol=0, atol=1e-9, err_msg=metric)
        assert kvbench.score(f"longbench/{dataset}", preds, answers, all_classes=classes, data=data) == \
            round(100 * sum(c["score"] for c in cs) / len(cs), 2)
        checked += 1
    assert checked >= 6

    ruler = json.load(open(os.path.join(FIXTURES, "ruler", "metric_cases.json")))
    preds, refs = [c["prediction"] for c in ruler["cases"]], [c["references"] for c in ruler["cases"]]
    # The evaluator reports round(100 x mean, 2); for one pair that is the pair's score.
    for task, key in (("ruler/niah_single_1", "all"), ("ruler/qa_1", "part")):
        got = np.round(100 * kvbench.sample_scores(task, preds, refs), 2)
        np.testing.assert_allclose(got, [c[key] for c in ruler["cases"]], rtol=0, atol=1e-9, err_msg=task)
    assert kvbench.score("ruler/vt", preds, refs) == ruler["aggregate"]["all"]
    assert kvbench.score("ruler/qa_2", preds, refs) == ruler["aggregate"]["part"]

    assert kvbench.score("niah", ["You should eat a sandwich and sit in Dolores Park on a sunny day."], [[]]) == 100
    assert kvbench.score("niah", ["A sandwich."], [[]]) == pytest.approx(100 / 11)

    e = kvbench.score("longbench-e/qasper", ["Paris", "x", "Rome"], [["Paris"], ["y"], ["Paris"]], length=[100, 5000, 9000])
    assert e == {"0-4k": 100.0, "4-8k": 0.0, "8k+": 0.0}

    # Found by an audit: one list of classes was read as one class list per character; it now serves
    # every prediction. One string as the predictions is refused, not scored letter by letter.
    for classes in (["Location", "Person"], [["Location", "Person"]] * 2):
        assert kvbench.score("longbench/trec", ["Location", "Person"], [["Location"], ["Person"]],
                             all_classes=classes) == 100
    with pytest.raises(TypeError, match="all_classes"):
        kvbench.sample_scores("longbench/trec", ["Location"], [["Location"]], all_classes=[["Location"], "Person"])
    with pytest.raises(TypeError, match="not one string"):
        kvbench.sample_scores("longbench/qasper", "Paris", [["Paris"]])


def test_a_predictions_file_with_a_missing_field_names_the_line(tmp_path):
    p = tmp_path / "qasper.jsonl"
    p.write_text('{"pred": "Paris", "answers": ["Paris"]}\n{"pred": "Rome"}\n')
    with pytest.raises(kvbench.Error, match=r"qasper.jsonl:2.*answers"):
        kvbench.score("longbench/qasper", str(p))
    p.write_text('{"pred": "Paris", "answers": ["Paris"]}\n{"pred": "Rome", "answers": ["Paris"]}\n')
    assert kvbench.score("longbench/qasper", str(p)) == 50.0
    with pytest.raises(ValueError, match="2 lengths for 3"):
        kvbench.score("longbench-e/qasper", ["a", "b", "c"], [["a"]] * 3, length=[1, 2])
    with pytest.raises(ValueError, match="give each prediction's `length`"):
        kvbench.score("longbench-e/qasper", ["a"], [["a"]])


@needs_model
def test_one_model_runs_one_call_at_a_time(model):
    # Found by an audit: two threads on one Model mixed their caches into wrong tokens, silently, and a
    # method calling its own Model overwrote the running call's caches.
    import threading

    prompts = ["What is the capital of France?", "Name three colours of the rainbow."]
    want = [model.generate(p, max_new_tokens=6)["ids"] for p in prompts]
    got = {}

    def work(i):
        got[i] = [model.generate(prompts[i], max_new_tokens=6)["ids"] for _ in range(2)]

    threads = [threading.Thread(target=work, args=(i,)) for i in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert got == {0: [want[0]] * 2, 1: [want[1]] * 2}

    class Nested(kvbench.Method):
        def compress(self, view, budget):
            model.generate("hi", max_new_tokens=1)
            return np.tile(np.arange(view.n_tokens - budget, view.n_tokens), (view.stored_heads, 1))

    kvbench.register(Nested, name="nested")
    with pytest.raises(kvbench.Error, match="running a call already"):
        model.generate(PROMPT, method="nested", budget=24, max_new_tokens=2)
    assert model.generate(prompts[0], max_new_tokens=6)["ids"] == want[0]  # the model is free again
    with pytest.raises(kvbench.Error, match="threads -1"):
        kvbench.Model(MODEL, threads=-1)


@needs_model
@pytest.mark.parametrize("needs, fragment", [
    ({"window": 8.0}, "window must be an int, got 8.0"),
    ({"window": "8"}, "window must be an int, got '8'"),
    ({"window": True}, "window must be an int, got True"),
    ({"window": 10**12}, "window 1000000000000 must be between 0 and"),
    ({"window": -1}, "window -1 must be between 0 and"),
    ({"attn_colsum": "no"}, "attn_colsum must be True or False, got 'no'"),
    ({"k_pre_rope": 1}, "k_pre_rope must be True or False, got 1"),
])
def test_needs_of_the_wrong_type_name_the_method_and_key(model, needs, fragment):
    # Found by an audit: these were pybind11's cast errors, naming neither the method nor the key.
    class Needy(kvbench.Method):
        def needs(self):
            return needs

        def compress(self, view, budget):
            return np.tile(np.arange(view.n_tokens - budget, view.n_tokens), (view.stored_heads, 1))

    kvbench.register(Needy, name="needy")
    with pytest.raises(kvbench.Error, match="python method needy: needs.. " + fragment.replace("(", ".")):
        model.generate(PROMPT, method="needy", budget=24, max_new_tokens=1)


@needs_model
def test_needs_take_numpy_scalars_and_any_window(model):
    class Numpy(kvbench.Method):
        def needs(self):
            return {"window": np.int64(8), "attn_colsum": np.True_, "k_pre_rope": np.False_}

        def compress(self, view, budget):
            assert view.window == 8 and view.attn_colsum is not None and view.keys_pre_rope is None
            return np.tile(np.arange(view.n_tokens - budget, view.n_tokens), (view.stored_heads, 1))

    class AllQueries(kvbench.Method):
        def needs(self):
            return {"window": 2**31 - 1}  # every query, as C++ H2O asks

        def compress(self, view, budget):
            assert view.window == view.n_tokens
            return np.tile(np.arange(view.n_tokens - budget, view.n_tokens), (view.stored_heads, 1))

    for cls, name in ((Numpy, "numpy_needs"), (AllQueries, "all_queries")):
        kvbench.register(cls, name=name)
        model.kept_positions(PROMPT, name, 24)


@needs_model
def test_registering_a_python_method_again_replaces_it(model):
    # A notebook cell run again after its class was edited: the new class serves the name.
    class First(kvbench.Method):
        def compress(self, view, budget):
            return np.tile(np.arange(budget), (view.stored_heads, 1))

    class Second(kvbench.Method):
        def compress(self, view, budget):
            return np.tile(np.arange(view.n_tokens - budget, view.n_tokens), (view.stored_heads, 1))

    kvbench.register(First, name="edited")
    first = model.kept_positions(PROMPT, "edited", 24)[0][0]
    kvbench.register(Second, name="edited")
    second = model.kept_positions(PROMPT, "edited", 24)[0][0]
    assert first.tolist() == list(range(24)) and second[0] > 0
    with pytest.raises(kvbench.Error, match="registered twice"):
        kvbench.register(Second, name="snapkv")  # a C++ method's name stays taken
    with pytest.raises(kvbench.Error, match="default 2199023255553, outside"):
        kvbench.register(Second, name="big", params={"x": 2**41 + 1})


@needs_model
def test_parameters_reach_the_python_method_typed(model):
    seen = []

    class Typed(kvbench.Method):
        params = {"n": 3, "ratio": 0.5, "flag": False, "mode": "a"}

        def compress(self, view, budget):
            seen.append(dict(self.params))
            return np.tile(np.arange(view.n_tokens - budget, view.n_tokens), (view.stored_heads, 1))

    kvbench.register(Typed, name="typed")
    model.generate(PROMPT, method="typed", budget=24, params={"n": 7, "flag": True, "mode": "b"}, max_new_tokens=2)
    assert seen[0] == {"n": 7, "ratio": 0.5, "flag": True, "mode": "b", "gqa": "native"}
    assert len(seen) == model.config["n_layers"]
    with pytest.raises(kvbench.Error, match="typed"):
        model.generate(PROMPT, method="typed", budget=24, params={"n": "seven"}, max_new_tokens=2)
    with pytest.raises(kvbench.Error, match="nope"):
        model.generate(PROMPT, method="typed", budget=24, params={"nope": 1}, max_new_tokens=2)


def test_summarize_gives_each_configuration_its_interval():
    import pandas as pd

    df = pd.DataFrame({"config.method": ["snapkv"] * 10 + ["h2o"] * 12 + ["fullkv"],
                       "config.options.task": ["vt", "cwe"] * 5 + ["vt"] * 12 + ["vt"],
                       "config.options.length": ["4096"] * 23,
                       "score": [1, 1, 1, 0, 1, 1, 0, 1, 0, 1] + [0.25, 0.5, 0.5, 0.75] * 3 + [1.0]})
    s = summarize(df).set_index("config.method")
    assert list(s.index) == ["fullkv", "h2o", "snapkv"]
    snap = s.loc["snapkv"]  # 7 of 10, 0/1 scores: Wilson's interval
    assert (snap["n"], snap["interval"]) == (10, "wilson")
    assert snap["score"] == pytest.approx(70) and snap["ci_low"] == pytest.approx(39.678, abs=1e-3)
    assert snap["ci_high"] == pytest.approx(89.221, abs=1e-3)
    h2o = s.loc["h2o"]
    assert h2o["interval"] == "bootstrap" and h2o["ci_low"] < 50 < h2o["ci_high"]
    full = s.loc["fullkv"]  # one sample: its n and no interval
    assert full["n"] == 1 and pd.isna(full["ci_low"]) and pd.isna(full["ci_high"]) and full["interval"] == "none"
    # Intervals are floats (NaN for none) even where no row has one; one column may be named alone.
    alone = summarize(df[df["config.method"] == "fullkv"], by="config.method")
    assert alone["ci_low"].dtype == "float64" and list(alone["config.method"]) == ["fullkv"]
    with pytest.raises(ValueError, match="no column 'nope'.*config.method"):
        summarize(df, by=["nope"])
    # Found by an audit: records of two code versions (a sweep resumed after a commit) were two rows.
    versions = df.assign(**{"config.version": ["a1", "b2"] * 11 + ["a1"]})
    assert summarize(versions).set_index("config.method")["n"].to_dict() == {"fullkv": 1, "h2o": 12, "snapkv": 10}


def test_summarize_stratifies_each_task_by_its_own_column():
    # RULER rows stratify by their task, LongBench rows by their dataset, in one frame; an artifact's
    # digest left nested by load_results groups like any other setting.
    import pandas as pd

    from kvbench import _kvbench

    ruler = [0.1 * (i % 10) for i in range(20)]
    longbench = {"qasper": [0.2, 0.3, 0.25, 0.35, 0.3], "trec": [0.8, 0.9, 0.85, 0.95, 0.9]}
    rows = [{"config.task": "ruler", "config.options.task": ["vt", "cwe"][i % 2], "score": x}
            for i, x in enumerate(ruler)]
    rows += [{"config.task": "longbench", "config.options.dataset": d, "score": x}
             for d, xs in longbench.items() for x in xs]
    df = pd.DataFrame(rows)
    df["config.artifacts.pca"] = [{"digest": "abc"}] * len(df)
    s = summarize(df).set_index("config.task")
    want = _kvbench.score_interval(list(longbench.values()), "samples")
    assert s.loc["longbench", "n"] == 10
    assert s.loc["longbench", "ci_low"] == pytest.approx(100 * want["ci_low"])
    assert s.loc["longbench", "ci_high"] == pytest.approx(100 * want["ci_high"])
    assert s.loc["ruler", "n"] == 20 and s.loc["ruler", "interval"] == "bootstrap"


def test_summarize_and_load_results_give_the_reports_numbers(tmp_path):
    # Found by an independent check: load_results kept a sample of overlapping NIAH grids twice, and
    # summarize printed a perplexity task's mean NLL x 100 instead of the perplexity.
    import math

    import pandas as pd

    def rec(task, opts, id_, score, key):
        return {"config": {"task": task, "options": opts, "method": "fullkv", "budget": 0, "model": "m.gguf"},
                "key": key, "id": id_, "score": score}

    with open(tmp_path / "r.jsonl", "w") as f:
        for depths, ids in (("3", (0, 50, 100)), ("5", (0, 25, 50, 75, 100))):
            for d in ids:
                f.write(json.dumps(rec("niah", {"depths": depths}, f"d{d}", d / 100, f"{depths}-{d}")) + "\n")
    df = kvbench.load_results(tmp_path / "r.jsonl")
    assert len(df) == 5
    with open(tmp_path / "r.jsonl", "a") as f:
        f.write(json.dumps(rec("niah", {"depths": "2"}, "d100", 0.3, "2-100")) + "\n")
    with pytest.raises(kvbench.Error, match="r.jsonl:9.*recorded again with score 0.3"):
        kvbench.load_results(tmp_path / "r.jsonl")
    nll = [2.0, 2.5, 3.0]
    s = summarize(pd.DataFrame({"config.task": ["perplexity"] * 3, "score": nll}))
    assert s.loc[0, "score"] == pytest.approx(math.exp(2.5))
    mixed = pd.DataFrame({"config.task": ["perplexity", "niah"], "config.method": ["fullkv"] * 2, "score": [2.0, 1.0]})
    with pytest.raises(ValueError, match="mixes a perplexity task"):
        summarize(mixed, by="config.method")
    with pytest.raises(kvbench.Error, match="not a finite number"):
        kvbench._kvbench.score_interval([[0.1, float("nan")]])


@pytest.mark.parametrize("args, message", [
    (["generate", "m.gguf", "-p", "hi", "--method", "snapkv", "--budget", "0"], "--budget: expected a number > 0, found 0"),
    (["generate", "m.gguf", "-p", "hi", "--threads", "-3"], "--threads: expected a number >= 0, found -3"),
    (["sample", "niah", "-m", "m.gguf", "--index", "-1"], "--index: expected a number >= 0, found -1"),
    (["run-task", "niah", "-m", "m.gguf", "--limit", "x"], "--limit: expected a number, found 'x'"),
])
def test_command_line_numbers_out_of_range_say_what_was_expected(args, message):
    r = subprocess.run([CLI, *args], capture_output=True, text=True)
    assert r.returncode != 0
    assert message in r.stdout + r.stderr


@needs_model
@pytest.mark.parametrize("args, message", [
    (["run-task", "niah", "-m", MODEL, "-o", "s_len"], "--option 's_len': expected key=value"),
    (["run-task", "niah", "-m", MODEL, "-o", "s_len=300", "-o", "s_len=400"], "--option s_len=400: 's_len' is given twice"),
    (["run-task", "niah", "-m", MODEL, "--method", "snapkv", "--ratio", "0"], "compression ratio 0 is outside (0, 1)"),
])
def test_command_line_options_name_the_flag_and_the_value(args, message):
    r = subprocess.run([CLI, *args], capture_output=True, text=True)
    assert r.returncode != 0
    assert message in r.stdout + r.stderr


def test_score_on_the_command_line_splits_longbench_e_by_length(tmp_path):
    p = tmp_path / "pred.jsonl"
    rows = [("Paris", ["Paris"], 100), ("x", ["y"], 5000), ("Rome", ["Paris"], 9000)]
    p.write_text("".join(json.dumps({"pred": a, "answers": b, "length": n}) + "\n" for a, b, n in rows))
    out = subprocess.run([CLI, "score", "--task", "longbench-e/qasper", str(p)], capture_output=True, text=True,
                         check=True).stdout
    assert "0-4k: 100.00" in out and "4-8k: 0.00" in out and "8k+: 0.00" in out
    assert kvbench.score("longbench-e/qasper", str(p)) == {"0-4k": 100.0, "4-8k": 0.0, "8k+": 0.0}


def test_a_dict_spec_error_names_the_dict_not_a_deleted_file(tmp_path):
    with pytest.raises(kvbench.Error, match=r"the spec dict \(as JSON, indent 2\):\d+:\d+: unknown key 'bogus'") as e:
        kvbench.run({"name": "x", "model": MODEL, "task": "niah", "methods": ["fullkv"], "bogus": 1,
                     "out": str(tmp_path / "x.jsonl")}, progress=False)
    assert "kvbench_spec_" not in str(e.value)


def test_info_describes_a_model_directory_without_a_tokenizer():
    out = subprocess.run([CLI, "info", os.path.join(FIXTURES, "hf_config", "llama31_scaling"), "--json"],
                         capture_output=True, text=True, check=True).stdout
    j = json.loads(out)
    assert j["architecture"] == "llama" and j["layers"] > 0 and j["kv_heads"] > 0
    assert j["tokenizer"] == "none" and "no tokenizer.json or tokenizer.model" in j["tokenizer_error"]


@needs_model
def test_generate_refuses_a_negative_budget_and_no_tokens_to_make(model):
    with pytest.raises(kvbench.Error, match="budget -5: a KV size must be > 0"):
        model.generate(PROMPT, method="snapkv", budget=-5, max_new_tokens=2)
    with pytest.raises(kvbench.Error, match="max_new_tokens -1 must be at least 1"):
        model.generate(PROMPT, max_new_tokens=-1)
    for bad in (True, np.True_, 2.5, np.float32(40.7), "16"):  # a bool is not read as 1, nor a float or text as a size
        with pytest.raises(TypeError, match="incompatible function arguments"):
            model.generate(PROMPT, method="snapkv", budget=bad, max_new_tokens=2)
    for bad in (False, np.True_):
        with pytest.raises(TypeError, match="incompatible function arguments"):
            model.generate(PROMPT, max_new_tokens=bad)
    assert model.generate(PROMPT, method="snapkv", budget=np.int64(48), max_new_tokens=1)["ids"]
