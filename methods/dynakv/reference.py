#!/usr/bin/env python3
"""Reference loss and gradients of DynaKV's trainable K/V transforms on SmolLM2-135M-Instruct, float64.

Model: grad_reference.py's reference (transformers' LlamaForCausalLM loaded from the GGUF file
itself, checked bit for bit against the dequantized GGUF tensors, then converted to float64 with
its float64 RMSNorm / eager softmax / rotary patches; eager attention, eval(), no BOS, 2 threads).
The base model's weights are frozen.

DynaKV: per layer l (0..29) and kind z in {K, V}, trainable U (d x d), W (d x d), b (d), with
d = n_kv_heads * head_dim = 3 * 64 = 192. For every token, x is the k_proj output (z = K; pre-RoPE,
the 3 KV heads concatenated) or the v_proj output (z = V), in GGUF row order. Row vectors,
matrices row-major [i][j]:
    xt   = x @ U                         xt_j = sum_i x_i U[i][j]
    p    = softmax(xt @ W + b)           over j in [0, d)
    m[i] = sum_{j >= i} p[j]             reverse cumulative sum (m[0] = 1)
    xh   = xt * m                        elementwise
    xbar = xh @ inv(U)                   inv(U) = torch.linalg.inv(U), differentiable
    R_tok = sum_i m[i] / d
The model uses xbar in place of x: forward hooks on every layer's self_attn.k_proj and
self_attn.v_proj return the transformed output, so for K RoPE is applied afterwards as usual.
GGUF vs HF order (grad_reference.py): GGUF row h*64 + 2i + j == HF row h*64 + j*32 + i (h < 3,
i < 32, j in {0, 1}); for K the hook converts HF -> GGUF order, transforms, and converts back
(V: both orders are the same). The permutation is checked against the GGUF attn_k tensor.

Objective for the n ids (used as given):
    CE   = mean over t = 0..n-2 of cross_entropy(logits[t], ids[t+1])
    R    = mean over the 30 layers, both kinds and all n tokens of R_tok
    loss = CE + alpha * R**2,  alpha = 0.5
Gradients by torch autograd (one backward) for U, W, b of every layer and kind.

Deterministic initialisation (numpy, float64), layer l, kind z (0 = K, 1 = V), i, j < 192:
    U[i][j] = (i == j) + (0.3 / 192) * sin(0.37 * (i + 1) * (j + 2) + 1.3 * l + 0.7 * z)
    W[i][j] = 0.02 * cos(0.11 * (i + 1) * (j + 1) + 0.5 * l + 0.3 * z)
    b[j]    = 2.0 * j / 191 + 0.1 * sin(j + l + 2 * z)

Self-checks (stdout; asserted):
  * the hooks change the logits (logits_changed, also in the fixture);
  * softmax shift invariance: the gradient of every b, and every row of the gradient of every W,
    sums to 0;
  * central finite differences of the loss against the autograd gradient for b of layer 14
    kind V entries 0 and 100, and W of layer 0 kind K flat entry 5, at the steps 1e-6 and 1e-4.
    At 1e-6 the quotient is limited by the loss's float64 rounding (a few ulp of the loss over
    2e-6: ~1e-9 absolute, ~1e-5 relative for gradients of ~1e-4; asserted: < 5e-9 absolute);
    at 1e-4 the agreement is ~1e-7 relative (asserted: < 1e-6);
  * with U = identity, W = 0, b[d-1] = 60 (else 0) the mask keeps everything (m = 1) and the CE
    equals the unmodified model's CE (to ~1e-9; the loss then is CE + alpha).

Fixture (--fixture, default methods/dynakv/fixtures/dynakv_e2e_128_f64.json; ASCII JSON, the same
bytes on every run, timings on stdout only): description, settings, model_sha256, versions, alpha,
n_tokens, ids, ce, R, loss, R_per_layer {"K": [30], "V": [30]} (mean over tokens of R_tok),
params: for layers 0, 1, 14, 29, kinds K, V and params U, W, b: layer, kind, param, shape,
frobenius (sqrt of the float64 sum of squares), max_abs, and 16 samples [[flat, value], ...] at
flat = k*2304 + 37*k (U, W; flat = i*192 + j) or k*12 + (k % 5) (b), k = 0..15; logits_changed =
max |logits with hooks - logits without| over the sequence. Every value is a float64 repr.

Usage (from the repo root; needs torch, transformers 5.x, gguf, numpy):
    python3 methods/dynakv/reference.py [--ids tests/fixtures/engine/grad_ids_256.json]
        [--n 128] [--fixture methods/dynakv/fixtures/dynakv_e2e_128_f64.json]
"""

import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
import grad_reference as gr  # noqa: E402  (model loading, checks, float64 mode, JSON writing)

ALPHA = 0.5
KINDS = ("K", "V")
FIXTURE_LAYERS = (0, 1, 14, 29)
N_SAMPLES = 16
FD_STEPS = (1e-6, 1e-4)


def init_params(n_layers, d):
    """{(l, z): (U, W, b)} as float64 numpy arrays, exactly the documented formulas."""
    i = np.arange(d, dtype=np.float64)[:, None]
    j = np.arange(d, dtype=np.float64)[None, :]
    jj = np.arange(d, dtype=np.float64)
    out = {}
    for l in range(n_layers):
        for z in range(2):
            U = np.eye(d) + (0.3 / 192) * np.sin(0.37 * (i + 1) * (j + 2) + 1.3 * l + 0.7 * z)
            W = 0.02 * np.cos(0.11 * (i + 1) * (j + 1) + 0.5 * l + 0.3 * z)
            b = 2.0 * jj / 191 + 0.1 * np.sin(jj + l + 2 * z)
            out[(l, z)] = (U, W, b)
    return out


def hf_to_gguf_index(n_head, hd):
    """P with gguf[..., r] = hf[..., P[r]]: P[h*hd + 2i + j] = h*hd + j*(hd/2) + i."""
    P = np.empty(n_head * hd, dtype=np.int64)
    for h in range(n_head):
        for i in range(hd // 2):
            for j in range(2):
                P[h * hd + 2 * i + j] = h * hd + j * (hd // 2) + i
    return P


class DynaKV:
    """Forward hooks on k_proj / v_proj that apply the transform when enabled."""

    def __init__(self, model, params, d, perm):
        import torch
        self.torch = torch
        self.d = d
        self.enabled = False
        self.tensors = {}
        for key, (U, W, b) in params.items():
            self.tensors[key] = tuple(torch.tensor(a, dtype=torch.float64, requires_grad=True)
                                      for a in (U, W, b))
        self.perm = torch.tensor(perm, dtype=torch.long)
        inv = np.empty_like(perm)
        inv[perm] = np.arange(perm.size)
        self.inv_perm = torch.tensor(inv, dtype=torch.long)
        self.r_tok = {}
        self.calls = 0
        self.handles = []
        for l, layer in enumerate(model.model.layers):
            for z, mod in enumerate((layer.self_attn.k_proj, layer.self_attn.v_proj)):
                self.handles.append(mod.register_forward_hook(self._hook(l, z)))

    def set_values(self, params):
        with self.torch.no_grad():
            for key, arrs in params.items():
                for t, a in zip(self.tensors[key], arrs):
                    t.copy_(self.torch.from_numpy(np.ascontiguousarray(a)))

    def transform(self, x, l, z):
        """x: [..., d] in GGUF order. Returns (xbar, R_tok [...])."""
        torch = self.torch
        U, W, b = self.tensors[(l, z)]
        xt = x @ U
        p = torch.softmax(xt @ W + b, dim=-1)
        m = torch.flip(torch.cumsum(torch.flip(p, dims=[-1]), dim=-1), dims=[-1])
        xh = xt * m
        xbar = xh @ torch.linalg.inv(U)
        return xbar, m.sum(-1) / self.d

    def _hook(self, l, z):
        def hook(mod, inp, out):
            if not self.enabled:
                return None
            assert out.dtype == self.torch.float64 and out.shape[-1] == self.d, (out.dtype, out.shape)
            self.calls += 1
            x = out[..., self.perm] if z == 0 else out
            xbar, r = self.transform(x, l, z)
            self.r_tok[(l, z)] = r
            return xbar[..., self.inv_perm] if z == 0 else xbar
        return hook


def run(model, dk, ids, enabled, cfg, grad):
    """One forward. Returns (ce, R, loss, logits) as tensors (R, loss None when disabled)."""
    import torch
    import torch.nn.functional as F
    dk.enabled = enabled
    dk.r_tok = {}
    dk.calls = 0
    for k in gr.F64_CALLS:
        gr.F64_CALLS[k] = 0
    x = torch.tensor([ids], dtype=torch.long)
    with torch.set_grad_enabled(grad):
        logits = model(input_ids=x, use_cache=False).logits[0]
        assert logits.dtype == torch.float64
        ce = F.cross_entropy(logits[:-1], x[0, 1:], reduction="mean")
        R = loss = None
        if enabled:
            L = cfg.num_hidden_layers
            assert dk.calls == 2 * L and len(dk.r_tok) == 2 * L, (dk.calls, len(dk.r_tok))
            R = torch.stack([dk.r_tok[(l, z)].reshape(-1) for l in range(L) for z in range(2)]).mean()
            loss = ce + ALPHA * R * R
    gr.check_float64_calls(cfg, False)
    dk.enabled = False
    return ce, R, loss, logits


def loss_value(model, dk, ids, cfg):
    _, _, loss, _ = run(model, dk, ids, True, cfg, grad=False)
    return float(loss)


def check_permutation(model, gg, dk, cfg):
    """The k_proj output mapped with dk.perm equals the GGUF attn_k tensor applied to the input."""
    import torch
    P = gr.hf_rows_to_gguf(np.arange(dk.d), cfg.num_key_value_heads)
    assert np.array_equal(P, dk.perm.numpy())
    rng = np.random.default_rng(12345)
    h = torch.tensor(rng.standard_normal((5, cfg.hidden_size)), dtype=torch.float64)
    for l in (0, cfg.num_hidden_layers - 1):
        dk.enabled = False
        with torch.no_grad():
            out_hf = model.model.layers[l].self_attn.k_proj(h)
        w = torch.tensor(gg["blk.%d.attn_k.weight" % l][1].astype(np.float64))
        ref = h @ w.T
        assert torch.allclose(out_hf[:, dk.perm], ref, rtol=0, atol=1e-12)
        assert not torch.allclose(out_hf, ref, rtol=0, atol=1e-6)
        assert torch.equal(out_hf[:, dk.perm][:, dk.inv_perm], out_hf)


def sample_indices(param):
    if param == "b":
        return [k * 12 + (k % 5) for k in range(N_SAMPLES)]
    return [k * 2304 + 37 * k for k in range(N_SAMPLES)]


def main():
    args, ids = gr.method_reference_args(__doc__.split("\n")[0], "methods/dynakv/fixtures/dynakv_e2e_128_f64.json")

    import torch

    t0 = time.perf_counter()
    model, gg, model_sha = gr.frozen_float64_model(args.gguf, args.threads)
    cfg = model.config
    L = cfg.num_hidden_layers
    hd = cfg.hidden_size // cfg.num_attention_heads
    d = cfg.num_key_value_heads * hd
    assert (L, d, hd) == (30, 192, 64), (L, d, hd)
    assert all(0 <= i < cfg.vocab_size for i in ids)
    params = init_params(L, d)
    dk = DynaKV(model, params, d, hf_to_gguf_index(cfg.num_key_value_heads, hd))
    check_permutation(model, gg, dk, cfg)
    t_load = time.perf_counter() - t0

    # Unmodified model.
    t1 = time.perf_counter()
    ce0, _, _, logits0 = run(model, dk, ids, False, cfg, grad=False)
    ce0 = float(ce0)
    logits0 = logits0.detach().clone()

    # DynaKV forward and backward.
    t2 = time.perf_counter()
    ce, R, loss, logits = run(model, dk, ids, True, cfg, grad=True)
    r_per_layer = {KINDS[z]: [float(dk.r_tok[(l, z)].detach().mean()) for l in range(L)]
                   for z in range(2)}
    logits_changed = float((logits.detach() - logits0).abs().max())
    t3 = time.perf_counter()
    loss.backward()
    t4 = time.perf_counter()
    assert all(p.grad is None for p in model.parameters())
    grads = {key: tuple(t.grad.detach().numpy().copy() for t in ts) for key, ts in dk.tensors.items()}
    assert all(np.all(np.isfinite(g)) for gs in grads.values() for g in gs)
    # softmax shift invariance: b + c and W[i, :] + c leave p unchanged, so the gradient of b
    # and every row of the gradient of W sum to 0
    shift = max(max(abs(float(np.sum(gb))), float(np.max(np.abs(np.sum(gW, axis=1)))))
                for (_, gW, gb) in grads.values())
    print("softmax shift invariance: max |sum_j grad b_j|, |sum_j grad W_ij| = %.3e" % shift)
    assert shift < 1e-12, shift
    ce, R, loss = float(ce.detach()), float(R.detach()), float(loss.detach())
    assert abs(loss - (ce + ALPHA * R * R)) <= 1e-14 * loss
    assert logits_changed > 1e-3, logits_changed
    print(json.dumps({"ce_unmodified": ce0, "ce": ce, "R": R, "loss": loss,
                      "logits_changed": logits_changed}), flush=True)

    # Central finite differences: at the step 1e-6 and at 1e-4. The loss is a float64 sum of
    # many rounded terms and moves by a few ulp (~1e-15) when a parameter moves, so at the step
    # 1e-6 the difference quotient carries a rounding error of ~1e-9 absolute (~1e-5 relative for
    # these gradients of ~1e-4); at 1e-4 that error is 100x smaller and the truncation error
    # (~h^2) is still far below it, so the agreement there shows the gradient to ~1e-7.
    t5 = time.perf_counter()
    fd_rows = []
    for (l, z, pi, flat) in ((14, 1, 2, 0), (14, 1, 2, 100), (0, 0, 1, 5)):
        t = dk.tensors[(l, z)][pi]
        ag = float(grads[(l, z)][pi].reshape(-1)[flat])
        for step in FD_STEPS:
            vals = []
            for s in (+1.0, -1.0):
                with torch.no_grad():
                    orig = t.view(-1)[flat].item()
                    t.view(-1)[flat] = orig + s * step
                vals.append(loss_value(model, dk, ids, cfg))
                with torch.no_grad():
                    t.view(-1)[flat] = orig
            fd = (vals[0] - vals[1]) / (2 * step)
            rel = abs(fd - ag) / abs(ag)
            fd_rows.append({"layer": l, "kind": KINDS[z], "param": "UWb"[pi], "flat_index": flat,
                            "step": step, "autograd": ag, "finite_difference": fd,
                            "abs_diff": abs(fd - ag), "rel_diff": rel})
            print("finite difference: layer %2d %s %s[%3d] step %.0e  autograd %.12e  fd %.12e  "
                  "|diff| %.2e  rel %.2e" % (l, KINDS[z], "UWb"[pi], flat, step, ag, fd,
                                             abs(fd - ag), rel), flush=True)
    # the parameters are back to their initial values
    for key, ts in dk.tensors.items():
        for t, a in zip(ts, params[key]):
            assert np.array_equal(t.detach().numpy(), a)
    for r in fd_rows:
        # step 1e-6: rounding-limited (a loss error of 1e-14 would give 5e-9); step 1e-4: 1e-6
        assert (r["abs_diff"] < 5e-9 and r["rel_diff"] < 1e-4) if r["step"] == 1e-6 \
            else r["rel_diff"] < 1e-6, r

    # Identity sanity check: U = I, W = 0, b = 60 at d-1 keeps everything (m = 1, xbar = x).
    t6 = time.perf_counter()
    b_id = np.zeros(d)
    b_id[d - 1] = 60.0
    dk.set_values({key: (np.eye(d), np.zeros((d, d)), b_id) for key in params})
    ce_id, R_id, loss_id, logits_id = run(model, dk, ids, True, cfg, grad=False)
    ce_id, R_id, loss_id = float(ce_id), float(R_id), float(loss_id)
    id_logits_diff = float((logits_id - logits0).abs().max())
    dk.set_values(params)
    print("identity check: ce %.15f  unmodified ce %.15f  |diff| %.3e  R %.15f  loss %.15f  "
          "max|logits diff| %.3e" % (ce_id, ce0, abs(ce_id - ce0), R_id, loss_id, id_logits_diff),
          flush=True)
    assert abs(ce_id - ce0) < 1e-9 and abs(R_id - 1.0) < 1e-12
    t7 = time.perf_counter()

    entries = []
    for l in FIXTURE_LAYERS:
        for z in range(2):
            for pi, pname in enumerate(("U", "W", "b")):
                g = grads[(l, z)][pi]
                flat = g.reshape(-1)
                entries.append({
                    "layer": l, "kind": KINDS[z], "param": pname, "shape": list(g.shape),
                    "frobenius": float(np.sqrt(np.sum(np.square(flat)))),
                    "max_abs": float(np.max(np.abs(flat))),
                    "samples": [[k, float(flat[k])] for k in sample_indices(pname)],
                })
    doc = {
        "description": "DynaKV reference: loss = CE + alpha * R^2 of SmolLM2-135M-Instruct (Q4_1 "
                       "GGUF) in float64 with per-layer K/V transforms xbar = ((x U) * m) inv(U), "
                       "m = reverse cumsum of softmax(x U W + b), R = mean of sum(m)/d over layers, "
                       "kinds and tokens; torch autograd gradients of U, W, b "
                       "(methods/dynakv/reference.py)",
        "settings": {
            "model": "transformers LlamaForCausalLM from from_pretrained(dir, gguf_file=...), "
                     "weights checked against the dequantized GGUF, converted to float64 "
                     "(grad_reference.py --float64: float64 RMSNorm, eager softmax and cos/sin, "
                     "RoPE angle = float32 position x float32 inv_freq); base weights frozen",
            "dtype": "float64", "attn_implementation": "eager", "torch_threads": args.threads,
            "bos_added": False, "d": d,
            "x": "k_proj (pre-RoPE) / v_proj output, 3 KV heads concatenated, GGUF row order: "
                 "GGUF row h*64+2i+j = HF row h*64+j*32+i",
            "transform": "xt = x U; p = softmax(xt W + b); m[i] = sum_{j>=i} p[j]; "
                         "xbar = (xt * m) inv(U); R_tok = sum_i m[i] / d",
            "loss": "CE (mean over t=0..n-2 of cross_entropy(logits[t], ids[t+1])) + alpha * R^2, "
                    "R = mean over 30 layers, K and V, n tokens of R_tok",
            "init": "U[i][j] = (i==j) + (0.3/192) sin(0.37(i+1)(j+2) + 1.3 l + 0.7 z); "
                    "W[i][j] = 0.02 cos(0.11(i+1)(j+1) + 0.5 l + 0.3 z); "
                    "b[j] = 2j/191 + 0.1 sin(j + l + 2z); z = 0 for K, 1 for V",
            "samples": "flat = i*192 + j; U, W: k*2304 + 37*k; b: k*12 + (k % 5); k = 0..15",
            "frobenius": "sqrt of float64 sum of squares",
        },
        "model_file": os.path.basename(args.gguf),
        "model_sha256": model_sha,
        "versions": gr.versions(),
        "alpha": ALPHA,
        "n_tokens": len(ids),
        "ids": ids,
        "ce": ce,
        "R": R,
        "loss": loss,
        "R_per_layer": r_per_layer,
        "params": entries,
        "logits_changed": logits_changed,
    }
    gr.write_json(args.fixture, doc)
    print("fixture %s: %d bytes" % (args.fixture, os.path.getsize(args.fixture)))
    print(json.dumps({"load_and_check_s": round(t_load, 2), "forward_unmodified_s": round(t2 - t1, 2),
                      "forward_dynakv_s": round(t3 - t2, 2), "backward_s": round(t4 - t3, 2),
                      "finite_differences_s": round(t6 - t5, 2), "identity_check_s": round(t7 - t6, 2),
                      "total_s": round(time.perf_counter() - t0, 2),
                      "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
                      "threads": torch.get_num_threads()}), flush=True)


if __name__ == "__main__":
    main()
