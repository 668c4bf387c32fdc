#!/usr/bin/env python3
"""Atom's quantizers and its W4A4 / KV4 model on SmolLM2-135M-Instruct: golden outputs for kvbench's atom.

Atom (Zhao et al., MLSys 2024; code efeslab/Atom). The quantizers are Atom's own: model/quant.py
(quantize_tensor, quantize_activation_wrapper) and model/qLinearLayer.py (QLinearLayer.quant) are imported
from a clone of the repository (--atom DIR, or $ATOM_REPO); bitsandbytes, which quant.py imports for its fp4
format, is replaced by an empty module (quant_type int never calls it). Atom's decoder layer
(qLlamaLayer.py) targets transformers 4's attention, so the model around the quantizers is transformers 5's
LlamaForCausalLM with hooks that do what QLlamaDecoderLayer does:
  - each linear product's input x is put in its site's reorder index order, passed to
    quantize_activation_wrapper, and put back; each weight's columns are put in the same order (gate_proj's
    and up_proj's rows also in down_proj's input order, as reorder_model_llama's out_reorder_index puts
    them), quantized by QLinearLayer.quant, and put back (Atom keeps both reordered; the product is the
    same, and the rows sharing a scale are Atom's);
  - k_proj's and v_proj's outputs (keys before RoPE, values) are quantized per token and head by
    quantize_tensor(n_bits=abits, group_size=0, sym=False, clip_ratio=kv_clip_ratio), as k_quant and v_quant
    (whose wrappers assert head_dim 128; SmolLM2's is 64, so quantize_tensor is called as they call it).
The reorder index is Atom's get_reorder_index of its 'hessian' statistic (get_act_stats_llama's stat_tensor:
diag of (sqrt(2/nsamples) x^T)(sqrt(2/nsamples) x^T)^T in float32, summed over the calibration windows;
torch.sort ascending), computed by hooks on every linear's input (its Catcher needs transformers 4). The
windows are Atom's get_wikitext2 (random.seed(0), the text joined by "\\n\\n" and tokenized whole, random
windows of seqlen ids) over set-up's data/python-docs (the files sorted by name), WikiText-2 being
unreachable here: --nsamples 4, --seqlen 256.

Settings are those of Atom's scripts/run_atom_ppl.sh (4 bits, symmetric weights and activations, clip 0.9 /
0.85 / 1.0, weight_channel_group 2, keeper 128 at INT8, reorder, KV cache) with groups of 64 channels: 128,
the script's, does not divide SmolLM2's 576, which Atom's code asserts. Weights by round to nearest (no
--use_gptq). Everything in float32, as kvbench's engine computes.

Fixture (--fixture, default methods/atom/fixtures/atom_ref.json; ASCII JSON, the same bytes on every run):
  quantizers: cases of random float32 inputs (numpy default_rng(7)) with Atom's settings and outputs, as
    little-endian float32 hex strings: activations (quantize_activation_wrapper), weights
    (QLinearLayer.quant), kv (quantize_tensor per row);
  calibration: the windows' ids; every layer's reorder index per site (`index`: base64 of little-endian
    uint16); for layers 0, 1 and 29 the index again with the statistic's float32 values;
  logits: the first --n (64) ids of tests/fixtures/engine/grad_ids_256.json in one forward without a cache,
    positions --prefill - 1 .. n - 1: top8, the logits at 64 sample ids, logsumexp, for Atom's weights alone
    (`atom_weights`: abits 16, so neither activations nor the KV cache are quantized) and for the unmodified
    model (`full`);
  layer1_input: what enters layer 1's q_proj under Atom, before its quantizer, for the first 10 tokens.
Quantized activations make the whole model's output jump wherever a value sits at a rounding boundary: at
token 10 of these ids one of layer 0's INT8 outliers is exactly halfway between two codes in float32, and
float32's last bit (which differs with the order of any sum) decides it. So the model is compared through
its weights (static, so stable to float32's rounding), through layer 1's input before that token (all of
layer 0's quantizers, where the inputs are exact) and through the quantizers' bits.

Usage (from the repo root; needs torch, transformers 5.x, gguf, numpy and a clone of efeslab/Atom):
    python3 methods/atom/reference.py --atom /path/to/Atom
"""

import argparse
import base64
import json
import os
import random
import sys
import time
import types

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
import grad_reference as gr  # noqa: E402  (model loading, checks, JSON writing)

SITES = ("attention", "attention_output", "mlp", "mlp_hidden")
SITE_OF = {"q_proj": "attention", "k_proj": "attention", "v_proj": "attention", "o_proj": "attention_output",
           "gate_proj": "mlp", "up_proj": "mlp", "down_proj": "mlp_hidden"}
FIXTURE_LAYERS = (0, 1, 29)
SAMPLE_SEED = 20261207
LAYER1_TOKENS = 10
N_SAMPLE_IDS = 64


def import_atom(path):
    """Atom's quant.py and qLinearLayer.py from a clone; bitsandbytes stubbed (fp4 only)."""
    model_dir = os.path.join(path, "model")
    assert os.path.isfile(os.path.join(model_dir, "quant.py")), "%s is not a clone of efeslab/Atom" % path
    bnb = types.ModuleType("bitsandbytes")
    bnb.functional = types.ModuleType("bitsandbytes.functional")
    bnb.functional.quantize_fp4 = bnb.functional.dequantize_fp4 = None
    sys.modules.setdefault("bitsandbytes", bnb)
    sys.modules.setdefault("bitsandbytes.functional", bnb.functional)
    sys.path.insert(0, model_dir)
    import quant  # noqa: E402
    import qLinearLayer  # noqa: E402
    return quant, qLinearLayer


def atom_args(**over):
    """The namespace Atom's main.py parses, with run_atom_ppl.sh's values (groups of 64)."""
    a = dict(wbits=4, abits=4, a_sym=True, w_sym=True, exponential=False, static=False, weight_group_size=64,
             weight_channel_group=2, act_group_size=64, reorder=True, keeper=128, keeper_precision=3, tiling=0,
             kv_cache=True, a_clip_ratio=0.9, w_clip_ratio=0.85, kv_clip_ratio=1.0, quant_type="int")
    a.update(over)
    return types.SimpleNamespace(**a)


def hex32(a):
    return np.ascontiguousarray(a, dtype="<f4").tobytes().hex()


def quantizer_cases(quant, qll):
    import torch
    rng = np.random.default_rng(7)
    cases = []

    def heavy(shape):
        x = rng.standard_normal(shape).astype(np.float32)
        x[..., -5:] *= 30  # outliers where the keeper sits
        x[..., 3] *= 8
        return x

    for name, shape, over in [("act_g64_int8", (3, 576), {}),
                              ("act_g128_fp16keeper", (2, 1536), dict(act_group_size=128, keeper_precision=0)),
                              ("act_row_asym_nokeeper", (4, 192), dict(act_group_size=0, a_sym=False, keeper=0, keeper_precision=0)),
                              ("act_3bit_clip", (2, 256), dict(abits=3, keeper=64, a_clip_ratio=0.8))]:
        x = heavy(shape)
        args = atom_args(**over)
        y = quant.quantize_activation_wrapper(torch.from_numpy(x.copy()), args).numpy()
        cases.append({"kind": "activations", "name": name, "rows": shape[0], "cols": shape[1], "bits": args.abits,
                      "group": args.act_group_size, "sym": args.a_sym, "clip": args.a_clip_ratio,
                      "keeper": args.keeper, "keeper_bits": 8 if args.keeper_precision == 3 else 16,
                      "channel_group": 1, "x": hex32(x), "y": hex32(y)})
    for name, shape, over in [("w_g64_cg2", (4, 576), {}),
                              ("w_g128_cg4_asym", (8, 256), dict(weight_group_size=128, weight_channel_group=4,
                                                                 w_sym=False, keeper=0,
                                                                 keeper_precision=0)),
                              ("w_row", (6, 192), dict(weight_group_size=0, keeper=64)),
                              ("w_g32_fp16keeper", (4, 128), dict(weight_group_size=32, keeper=32,
                                                                  keeper_precision=0))]:
        w = heavy(shape)
        args = atom_args(**over)
        lin = torch.nn.Linear(shape[1], shape[0], bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
        q = qll.QLinearLayer(lin, args)
        q.quant()
        cases.append({"kind": "weights", "name": name, "rows": shape[0], "cols": shape[1], "bits": args.wbits,
                      "group": args.weight_group_size, "sym": args.w_sym, "clip": args.w_clip_ratio,
                      "keeper": args.keeper, "keeper_bits": 8 if args.keeper_precision == 3 else 16,
                      "channel_group": args.weight_channel_group, "x": hex32(w), "y": hex32(q.weight.numpy())})
    for name, bits, clip in [("kv4", 4, 1.0), ("kv2_clip", 2, 0.9)]:
        x = heavy((6, 64))
        y = quant.quantize_tensor(torch.from_numpy(x.copy()), n_bits=bits, group_size=0, tiling=0, sym=False,
                                  clip_ratio=clip, exponential=False).numpy()
        cases.append({"kind": "kv", "name": name, "rows": 6, "cols": 64, "bits": bits, "group": 0, "sym": False,
                      "clip": clip, "keeper": 0, "keeper_bits": 16, "channel_group": 1, "x": hex32(x),
                      "y": hex32(y)})
    return cases


M32 = 0xFFFFFFFF


def mix32(i):
    """Thomas Wang's 32-bit integer hash (the C++ test computes the same inputs with it)."""
    i = ((i ^ 61) ^ (i >> 16)) & M32
    i = (i + (i << 3)) & M32
    i ^= i >> 4
    i = (i * 0x27D4EB2D) & M32
    return i ^ (i >> 15)


def hashed(tag, rows, cols, denom, outlier_every=0):
    """rows x cols of (mix32(tag * 1000003 + r * 4099 + c) % 2001 - 1000) / denom, exact in float32; every
    outlier_every-th column (from 7) 16 times larger."""
    a = np.array([[(mix32(tag * 1000003 + r * 4099 + c) % 2001) - 1000 for c in range(cols)] for r in range(rows)],
                 dtype=np.float64) / denom
    if outlier_every:
        a[:, 7::outlier_every] *= 16
    return a.astype(np.float32)


# GPTQ cases: rows, cols, calibration tokens, Atom's arguments, a column no token uses (-1: none; its weights
# 16 times larger, so that each row's range is found before the column is zeroed, as fasterquant does), and a
# block of the weight [0, r) x [0, c) made non-negative (a symmetric group without negative values keeps its
# minimum at 0 in Quantizer_GPTQ).
GPTQ_CASES = [("g32_cg2_int8keeper", 8, 200, 256,
               dict(weight_group_size=32, weight_channel_group=2, keeper=8, keeper_precision=3), -1, (0, 0)),
              ("row_asym3_fp16keeper_dead", 6, 150, 256,
               dict(wbits=3, w_sym=False, weight_group_size=0, weight_channel_group=1, w_clip_ratio=1.0, keeper=6,
                    keeper_precision=0), 5, (0, 0)),
              ("g64_cg4_nokeeper_nonneg", 8, 160, 256,
               dict(weight_group_size=64, weight_channel_group=4, w_clip_ratio=0.9, keeper=0, keeper_precision=0), -1,
               (4, 64))]


def gptq_cases(atom_dir, qll):
    """Atom's GPTQ class (model/gptq.py) as quantize_model_gptq_llama drives it: Quantizer_GPTQ configured
    per channel with the channel groups and clip ratio, add_batch on the inputs, fasterquant(percdamp 0.01,
    groupsize weight_group_size). Its imports of the decoder layer (transformers 4's) are stood in for by
    qLinearLayer's QLinearLayer, which is what they re-export."""
    import torch
    import transformers
    sys.modules.setdefault("qLlamaLayer", types.SimpleNamespace(QLinearLayer=qll.QLinearLayer))
    if not hasattr(transformers, "Conv1D"):
        transformers.Conv1D = type("Conv1D", (), {})
    torch.cuda.synchronize = lambda *a, **k: None  # fasterquant syncs a GPU; there is none here
    import gptq  # noqa: E402
    cases = []
    for name, rows, cols, n, over, dead, nonneg in GPTQ_CASES:
        args = atom_args(**over)
        x = hashed(1, n, cols, 256.0, outlier_every=41)
        w = hashed(2, rows, cols, 8192.0)
        if dead >= 0:
            x[:, dead] = 0
            w[:, dead] *= 16
        w[:nonneg[0], :nonneg[1]] = np.abs(w[:nonneg[0], :nonneg[1]])
        lin = torch.nn.Linear(cols, rows, bias=False)
        with torch.no_grad():
            lin.weight.copy_(torch.from_numpy(w))
        g = gptq.GPTQ(lin, n_out=args.keeper, keeper_precision=args.keeper_precision)
        g.quantizer = gptq.Quantizer_GPTQ()
        g.quantizer.configure(args.wbits, perchannel=True, sym=args.w_sym, mse=False,
                              channel_group=args.weight_channel_group, clip_ratio=args.w_clip_ratio,
                              quant_type=args.quant_type)
        g.add_batch(torch.from_numpy(x).unsqueeze(0), None)
        g.fasterquant(percdamp=0.01, groupsize=args.weight_group_size)
        cases.append({"name": name, "rows": rows, "cols": cols, "tokens": n, "dead": dead, "nonneg": list(nonneg),
                      "bits": args.wbits,
                      "group": args.weight_group_size, "sym": args.w_sym, "clip": args.w_clip_ratio,
                      "keeper": args.keeper, "keeper_bits": 8 if args.keeper_precision == 3 else 16,
                      "channel_group": args.weight_channel_group, "q": hex32(lin.weight.detach().numpy())})
    return cases


def calibration_windows(gguf, nsamples, seqlen):
    """Atom's get_wikitext2 windows over set-up's python-docs."""
    enc = gr.gguf_tokenizer(gguf)("\n\n".join(gr.python_docs_texts()))["input_ids"]
    random.seed(0)
    seqs = []
    for _ in range(nsamples):
        i = random.randint(0, len(enc) - seqlen - 1)
        seqs.append([int(t) for t in enc[i:i + seqlen]])
    return seqs


def linears(model):
    for l, layer in enumerate(model.model.layers):
        for owner in (layer.self_attn, layer.mlp):
            for name, mod in owner.named_children():
                if name in SITE_OF:
                    yield l, name, mod


def hessian_stats(model, windows):
    """get_act_stats_llama's stat_tensor ('hessian') on every linear's input, summed over the windows."""
    import math
    import torch
    stats = {}
    n = len(windows)

    def hook(key):
        def f(mod, inp):
            x = inp[0].reshape(-1, inp[0].shape[-1]).detach()
            th = math.sqrt(2 / n) * x.float().t()
            d = torch.diag(th.matmul(th.t()))
            stats[key] = stats[key] + d if key in stats else d
        return f

    handles = [mod.register_forward_pre_hook(hook((l, SITE_OF[name]))) for l, name, mod in linears(model)
               if name in ("k_proj", "o_proj", "gate_proj", "down_proj")]
    with torch.no_grad():
        for s in windows:
            model(torch.tensor([s]), use_cache=False)
    for h in handles:
        h.remove()
    return stats


def install_atom(model, quant, qll, args, order):
    """QLlamaDecoderLayer's quantizers as hooks; the weights quantized in place. Returns the handles."""
    import torch
    cfg = model.config
    d = cfg.hidden_size // cfg.num_attention_heads
    handles = []
    for l, name, mod in linears(model):
        idx = order[(l, SITE_OF[name])]
        inv = torch.argsort(idx)
        # reorder_model_llama also reorders gate_proj's and up_proj's rows as down_proj's input.
        rows = order[(l, "mlp_hidden")] if name in ("gate_proj", "up_proj") else None
        with torch.no_grad():
            w = torch.index_select(mod.weight, 1, idx)
            if rows is not None:
                w = torch.index_select(w, 0, rows)
            lin = torch.nn.Linear(w.shape[1], w.shape[0], bias=False)
            lin.weight.copy_(w.contiguous())
            q = qll.QLinearLayer(lin, args)
            q.quant()
            w = q.weight
            if rows is not None:
                w = torch.index_select(w, 0, torch.argsort(rows))
            mod.weight.copy_(torch.index_select(w, 1, inv))

        def pre(m, inp, idx=idx, inv=inv):
            x = torch.index_select(inp[0], -1, idx).contiguous()
            x = quant.quantize_activation_wrapper(x, args)
            return (torch.index_select(x, -1, inv),)
        handles.append(mod.register_forward_pre_hook(pre))
        if name in ("k_proj", "v_proj") and args.kv_cache and args.abits < 16:
            def post(m, inp, out):
                shape = out.shape
                rows = out.reshape(-1, d).contiguous()
                y = quant.quantize_tensor(rows, n_bits=args.abits, group_size=0, tiling=0, sym=False,
                                          clip_ratio=args.kv_clip_ratio, exponential=False)
                return y.reshape(shape)
            handles.append(mod.register_forward_hook(post))
    return handles


def position_summary(row, sample_ids):
    top = np.argsort(-row, kind="stable")[:8]
    m = float(np.max(row))
    return {"top8": [[int(i), float(row[i])] for i in top],
            "samples": [float(row[i]) for i in sample_ids],
            "logsumexp": float(m + np.log(np.sum(np.exp(row.astype(np.float64) - m))))}


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--atom", default=os.environ.get("ATOM_REPO", ""), help="a clone of efeslab/Atom")
    ap.add_argument("--gguf", default=os.path.join(gr.REPO_ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--nsamples", type=int, default=4)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--ids", default=os.path.join(gr.REPO_ROOT, "tests/fixtures/engine/grad_ids_256.json"))
    ap.add_argument("--n", type=int, default=64, help="evaluate the first N ids")
    ap.add_argument("--prefill", type=int, default=48, help="positions before the first compared one")
    ap.add_argument("--fixture", default=os.path.join(gr.REPO_ROOT, "methods/atom/fixtures/atom_ref.json"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    assert args.atom, "give --atom DIR (a clone of efeslab/Atom) or set ATOM_REPO"
    import torch
    from hf_logits import sha256_file
    quant, qll = import_atom(args.atom)
    t0 = time.perf_counter()
    doc = {"atom_settings": vars(atom_args()), "quantizers": quantizer_cases(quant, qll),
           "gptq": gptq_cases(args.atom, qll)}

    model = gr.load_model(args.gguf, args.threads)
    gr.check_model(model, gr.read_gguf_tensors(args.gguf))
    for p in model.parameters():
        p.requires_grad_(False)
    cfg = model.config
    windows = calibration_windows(args.gguf, args.nsamples, args.seqlen)
    stats = hessian_stats(model, windows)
    order = {key: torch.sort(v, descending=False)[1] for key, v in stats.items()}
    doc["calibration"] = {
        "description": "Atom's get_wikitext2 windows (seed 0) over data/python-docs, SmolLM2's tokenizer",
        "sequences": windows,
        "index": [{s: base64.b64encode(order[(l, s)].numpy().astype("<u2").tobytes()).decode("ascii") for s in SITES}
                  for l in range(cfg.num_hidden_layers)],
        "layers": {str(l): {s: {"order": [int(i) for i in order[(l, s)]],
                                "stat": hex32(stats[(l, s)].numpy())} for s in SITES} for l in FIXTURE_LAYERS}}

    with open(args.ids, encoding="utf-8") as f:
        ids = [int(i) for i in json.load(f)][:args.n]
    assert len(ids) == args.n and 1 <= args.prefill < args.n
    base = {k: v.clone() for k, v in model.state_dict().items()}
    with torch.no_grad():
        full = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    # Weights alone (abits 16: activations and KV cache as they are), the whole model, and what enters
    # layer 1 (its q_proj's input before the quantizer: all of layer 0's quantizers behind it).
    handles = install_atom(model, quant, qll, atom_args(abits=16), order)
    with torch.no_grad():
        weights_only = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    for h in handles:
        h.remove()
    model.load_state_dict(base)
    handles = install_atom(model, quant, qll, atom_args(), order)

    def tap(m, i):
        seen["x"] = i[0].detach().clone()
    seen = {}
    handles.append(model.model.layers[1].self_attn.q_proj.register_forward_pre_hook(tap, prepend=True))
    with torch.no_grad():
        model(torch.tensor([ids]), use_cache=False)
    for h in handles:
        h.remove()
    sample_ids = sorted(int(i) for i in np.random.default_rng(SAMPLE_SEED).choice(cfg.vocab_size, N_SAMPLE_IDS,
                                                                                   replace=False))
    positions = list(range(args.prefill - 1, args.n))
    doc.update({
        "model_sha256": sha256_file(args.gguf),
        "versions": gr.versions(),
        "ids": ids, "prefill": args.prefill, "positions": positions, "sample_ids": sample_ids,
        "layer1_input": hex32(seen["x"][0, :LAYER1_TOKENS].numpy()),
        "atom_weights": [position_summary(weights_only[p], sample_ids) for p in positions],
        "full": [position_summary(full[p], sample_ids) for p in positions]})
    gr.write_json(args.fixture, doc)
    print(json.dumps({"fixture": args.fixture, "seconds": round(time.perf_counter() - t0, 1)}))


if __name__ == "__main__":
    main()
