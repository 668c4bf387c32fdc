#!/usr/bin/env python3
"""Reference loss and gradients of MatryoshkaKV's projections on SmolLM2-135M-Instruct, float64.

Model: tools/reference/grad_reference.py's reference (transformers' LlamaForCausalLM loaded from the
GGUF file itself, checked against the dequantized GGUF tensors, converted to float64 with its float64
RMSNorm / eager attention / rotary patches; eager attention, eval(), no BOS, 2 threads). The base
model's weights are frozen.

MatryoshkaKV as its reference code computes attention (The-kamisato/MatryoshkaKV-cache,
modeling_pcallama_trial.py): per layer l (0..29), KV head h (0..2) and kind z in {K, V}, an orthogonal
Q = A @ cayley(X) with cayley(X) = solve(I - S/2, I + S/2), S = X - X^T (A: the anchor, the PCA basis
in kvbench; a fixed orthogonal matrix here). Keys after RoPE and values (d = 64 per head, row vectors,
kvbench's GGUF order within the head: GGUF index 2i + j = HF index j*32 + i):
    k' = k Q_r Q_r^T                (the reference projects q and k by Q_r; q.k' is the same score)
    v' = mu + (v - mu) Q_r Q_r^T    (the reference's output (A v~) Q_r^T + mu)
with r = r[l][h][z]. The transform wraps the float64 eager attention, which receives post-RoPE keys.

Objective (the reference trainer's, T = 1), teacher = the unmodified model on the same ids:
    CE   = mean over t = 0..n-2 of cross_entropy(student[t], ids[t+1])
    KL   = sum over t = 0..n-1 and the vocabulary of p_t (log p_t - log_softmax(student[t])) / n
    loss = 0.75 CE + 0.25 KL
Gradients by torch autograd for X (every l, h, z) and mu (every l, h).

Deterministic parameters (numpy, float64), i, j < 64:
    u[i]    = sin(0.7 (i+1) + 1.1 l + 0.3 h + 0.5 z) + 0.2;  A = I - 2 u u^T / (u^T u)
    X[i][j] = 0.05 sin(0.37 (i+1)(j+2) + 1.3 l + 0.7 h + 0.5 z)
    mu[i]   = 0.1 cos(0.3 (i+1) + l + 0.5 h)
    r       = 8 (1 + (3 l + 5 h + 7 z) mod 8)

Self-checks (asserted): the projections change the logits; at r = 64 everywhere the loss's CE equals
the unmodified model's (an orthogonal Q projects nothing away) to 1e-9; central finite differences at
the step 1e-4 of X (layer 29 head 2 V) and mu (layer 0 head 1) within 1e-6 relative of autograd.

Fixture (--fixture, default methods/matryoshkakv/fixtures/matryoshkakv_128_f64.json; the same bytes on
every run): settings, model_sha256, versions, n_tokens, ids, ce, kl, loss, ce_unmodified, and for
layers 0, 14, 29 and heads 0, 2: X of K and V and mu: frobenius, max_abs and 16 samples [[flat, value]]
at flat = 257 k (X) or 4 k (mu), k = 0..15.

Usage (from the repo root; needs torch, transformers 5.x, gguf, numpy):
    python3 methods/matryoshkakv/reference.py [--n 128]
"""
import json
import os
import resource
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
import grad_reference as gr  # noqa: E402  (model loading, checks, float64 mode, JSON writing)

KINDS = ("K", "V")
FIXTURE_LAYERS = (0, 14, 29)
FIXTURE_HEADS = (0, 2)
N_SAMPLES = 16
KL_WEIGHT = 0.25


def init_params(L, H, d):
    i = np.arange(d, dtype=np.float64)
    params = {}
    for l in range(L):
        for h in range(H):
            for z in range(2):
                u = np.sin(0.7 * (i + 1) + 1.1 * l + 0.3 * h + 0.5 * z) + 0.2
                A = np.eye(d) - 2.0 * np.outer(u, u) / np.dot(u, u)
                X = 0.05 * np.sin(0.37 * np.outer(i + 1, i + 2) + 1.3 * l + 0.7 * h + 0.5 * z)
                r = 8 * (1 + (3 * l + 5 * h + 7 * z) % 8)
                params[(l, h, z)] = (A, X, r)
            params[(l, h, "mu")] = 0.1 * np.cos(0.3 * (i + 1) + l + 0.5 * h)
    return params


class Matryoshka:
    """Wraps the float64 eager attention: projects the post-RoPE keys and the values when enabled."""

    def __init__(self, params, L, H, d):
        import torch
        from transformers.models.llama import modeling_llama as ml
        self.torch, self.L, self.H, self.d = torch, L, H, d
        self.enabled = False
        self.full_rank = False
        self.calls = 0
        self.A, self.X, self.r, self.mu = {}, {}, {}, {}
        for key, val in params.items():
            if key[2] == "mu":
                self.mu[key[:2]] = torch.tensor(val, dtype=torch.float64, requires_grad=True)
            else:
                A, X, r = val
                self.A[key] = torch.tensor(A, dtype=torch.float64)
                self.X[key] = torch.tensor(X, dtype=torch.float64, requires_grad=True)
                self.r[key] = r
        # Per head: GGUF index g = 2i + j holds HF index j*32 + i.
        half = d // 2
        self.perm = torch.tensor([(g % 2) * half + g // 2 for g in range(d)], dtype=torch.long)
        inner = ml.eager_attention_forward

        def wrapped(module, query, key, value, *args, **kwargs):
            if self.enabled:
                self.calls += 1
                key, value = self.transform(module.layer_idx, key, value)
            return inner(module, query, key, value, *args, **kwargs)
        ml.eager_attention_forward = wrapped

    def Q(self, key):
        torch = self.torch
        X = self.X[key]
        S = X - X.T
        eye = torch.eye(self.d, dtype=torch.float64)
        return self.A[key] @ torch.linalg.solve(eye - S / 2, eye + S / 2)

    def transform(self, l, key, value):
        """key, value: [batch, H, n, d] (HF order within the head; key post-RoPE)."""
        ks, vs = [], []
        for h in range(self.H):
            outs = []
            for z, x in enumerate((key[:, h], value[:, h])):
                x = x[..., self.perm] if z == 0 else x
                r = self.d if self.full_rank else self.r[(l, h, z)]
                Qr = self.Q((l, h, z))[:, :r]
                if z == 0:
                    y = (x @ Qr) @ Qr.T
                else:
                    mu = self.mu[(l, h)]
                    y = mu + ((x - mu) @ Qr) @ Qr.T
                if z == 0:
                    inv = self.torch.empty_like(self.perm)
                    inv[self.perm] = self.torch.arange(self.d)
                    y = y[..., inv]
                outs.append(y)
            ks.append(outs[0])
            vs.append(outs[1])
        return self.torch.stack(ks, dim=1), self.torch.stack(vs, dim=1)


def run(model, mk, ids, enabled, cfg, grad, teacher=None):
    """One forward. Returns (logits, ce, kl, loss); kl and loss None without a teacher."""
    import torch
    import torch.nn.functional as F
    mk.enabled = enabled
    mk.calls = 0
    for k in gr.F64_CALLS:
        gr.F64_CALLS[k] = 0
    x = torch.tensor([ids], dtype=torch.long)
    with torch.set_grad_enabled(grad):
        logits = model(input_ids=x, use_cache=False).logits[0]
        assert logits.dtype == torch.float64
        ce = F.cross_entropy(logits[:-1], x[0, 1:], reduction="mean")
        kl = loss = None
        if teacher is not None:
            pt = torch.log_softmax(teacher, dim=-1)
            kl = (pt.exp() * (pt - torch.log_softmax(logits, dim=-1))).sum() / logits.shape[0]
            loss = (1 - KL_WEIGHT) * ce + KL_WEIGHT * kl
    if enabled:
        assert mk.calls == cfg.num_hidden_layers, mk.calls
    gr.check_float64_calls(cfg, False)
    mk.enabled = False
    return logits, ce, kl, loss


def summary(g, samples):
    flat = g.reshape(-1)
    return {"frobenius": float(np.sqrt(np.sum(np.square(flat)))), "max_abs": float(np.max(np.abs(flat))),
            "samples": [[k, float(flat[k])] for k in samples]}


def main():
    args, ids = gr.method_reference_args(__doc__.split("\n")[0], "methods/matryoshkakv/fixtures/matryoshkakv_128_f64.json")

    import torch

    t0 = time.perf_counter()
    model, gg, model_sha = gr.frozen_float64_model(args.gguf, args.threads)
    cfg = model.config
    L, H = cfg.num_hidden_layers, cfg.num_key_value_heads
    d = cfg.hidden_size // cfg.num_attention_heads
    assert (L, H, d) == (30, 3, 64), (L, H, d)
    params = init_params(L, H, d)
    mk = Matryoshka(params, L, H, d)

    teacher, ce0, _, _ = run(model, mk, ids, False, cfg, grad=False)
    teacher = teacher.detach().clone()
    ce0 = float(ce0)

    # Full rank: the orthogonal Q projects nothing away.
    mk.full_rank = True
    _, ce_full_rank, kl_full_rank, _ = run(model, mk, ids, True, cfg, grad=False, teacher=teacher)
    mk.full_rank = False
    print("full rank: ce %.15f, unmodified %.15f, kl %.3e" % (float(ce_full_rank), ce0, float(kl_full_rank)))
    assert abs(float(ce_full_rank) - ce0) < 1e-9 and abs(float(kl_full_rank)) < 1e-9

    t1 = time.perf_counter()
    logits, ce, kl, loss = run(model, mk, ids, True, cfg, grad=True, teacher=teacher)
    logits_changed = float((logits.detach() - teacher).abs().max())
    assert logits_changed > 1e-3, logits_changed
    loss.backward()
    t2 = time.perf_counter()
    assert all(p.grad is None for p in model.parameters())
    ce, kl, loss = float(ce.detach()), float(kl.detach()), float(loss.detach())
    print(json.dumps({"ce_unmodified": ce0, "ce": ce, "kl": kl, "loss": loss, "logits_changed": logits_changed}),
          flush=True)

    def loss_value():
        return float(run(model, mk, ids, True, cfg, grad=False, teacher=teacher)[3])

    step = 1e-4
    for t, flat, label in ((mk.X[(29, 2, 1)], 5 * d + 9, "X[29,2,V]"), (mk.mu[(0, 1)], 17, "mu[0,1]")):
        ag = float(t.grad.reshape(-1)[flat])
        vals = []
        for s in (+1.0, -1.0):
            with torch.no_grad():
                orig = t.view(-1)[flat].item()
                t.view(-1)[flat] = orig + s * step
            vals.append(loss_value())
            with torch.no_grad():
                t.view(-1)[flat] = orig
        fd = (vals[0] - vals[1]) / (2 * step)
        rel = abs(fd - ag) / abs(ag)
        print("finite difference %s[%d]: autograd %.12e fd %.12e rel %.2e" % (label, flat, ag, fd, rel), flush=True)
        assert rel < 1e-6, rel

    entries = []
    for l in FIXTURE_LAYERS:
        for h in FIXTURE_HEADS:
            for z in range(2):
                e = {"layer": l, "head": h, "kind": KINDS[z], "param": "X", "rank": mk.r[(l, h, z)]}
                e.update(summary(mk.X[(l, h, z)].grad.numpy(), [257 * k for k in range(N_SAMPLES)]))
                entries.append(e)
            e = {"layer": l, "head": h, "kind": "V", "param": "mu"}
            e.update(summary(mk.mu[(l, h)].grad.numpy(), [4 * k for k in range(N_SAMPLES)]))
            entries.append(e)
    doc = {
        "description": "MatryoshkaKV reference: loss = 0.75 CE + 0.25 KL(teacher || student) of SmolLM2-135M-Instruct "
                       "(Q4_1 GGUF) in float64 with per-head projections of post-RoPE K and of V at fixed ranks; torch "
                       "autograd gradients of X and mu (methods/matryoshkakv/reference.py)",
        "settings": {
            "model": "grad_reference.py's float64 model (eager attention, float32 RoPE angles, float64 cos/sin)",
            "bos_added": False, "head_dim": d,
            "transform": "Q = A solve(I - S/2, I + S/2), S = X - X^T; k' = k Q_r Q_r^T (post-RoPE, GGUF order); "
                         "v' = mu + (v - mu) Q_r Q_r^T",
            "init": "u[i] = sin(0.7(i+1) + 1.1l + 0.3h + 0.5z) + 0.2, A = I - 2uu^T/u^Tu; "
                    "X[i][j] = 0.05 sin(0.37(i+1)(j+2) + 1.3l + 0.7h + 0.5z); mu[i] = 0.1 cos(0.3(i+1) + l + 0.5h); "
                    "r = 8(1 + (3l + 5h + 7z) mod 8); z = 0 for K, 1 for V",
            "loss": "0.75 CE (mean over n-1 targets) + 0.25 KL (sum over the vocabulary, mean over n positions)",
            "samples": "X: flat = 257 k; mu: 4 k; k = 0..15",
        },
        "model_file": os.path.basename(args.gguf),
        "model_sha256": model_sha,
        "versions": gr.versions(),
        "n_tokens": len(ids),
        "ids": ids,
        "ce_unmodified": ce0,
        "ce": ce,
        "kl": kl,
        "loss": loss,
        "logits_changed": logits_changed,
        "params": entries,
    }
    gr.write_json(args.fixture, doc)
    print("fixture %s: %d bytes" % (args.fixture, os.path.getsize(args.fixture)))
    print(json.dumps({"forward_backward_s": round(t2 - t1, 2), "total_s": round(time.perf_counter() - t0, 2),
                      "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024}), flush=True)


if __name__ == "__main__":
    main()
