#!/usr/bin/env python3
"""Palu's whitened low-rank K/V projections on SmolLM2-135M-Instruct in float64: golden logits for kvbench's palu.

Palu (Chang et al., ICLR 2025; code shadowpa0327/Palu), the path of its compress script with the
`whiten` decomposition and the `uniform` rank search, written again here from its description (its
code is not imported or copied):
  1. Calibration windows (palu/data_utils.py get_calib_data): random.seed(3); the training text is
     joined by "\\n\\n"; for each of nsamples windows i = random.randint(0, len(text) - seqlen - 1),
     the characters text[i : i + 10 seqlen] are tokenized (the tokenizer's default special tokens)
     and cut to the first seqlen ids. --make-ids applies this to set-up's data/python-docs (the files
     sorted by name; the paper's WikiText-2 cannot be fetched here), nsamples 8, seqlen 256.
  2. Whitening (palu/decomposition.py get_whiten_scale_matrix): per layer, X^T X of the inputs of
     k_proj and v_proj over every calibration token (one matrix: both read the same input), summed
     in float64 here (Palu sums float32 products of fp16 activations); S = cholesky(X^T X), lower; if
     that fails, X^T X + (1e-3 - lambda_min) I, as Palu does.
  3. Decomposition (palu/model/modules/svd_linear.py _per_head_whiten_decomposition_from_weight)
     with one group holding all KV heads (J-LRD): W S = U diag(s) V^T, R = sqrt(s_r) V_r^T S^-1,
     L = U_r sqrt(s_r); the layer's k_proj (v_proj) becomes x -> L (R x), so the cache holds R x and
     the keys are rebuilt, then rotated, at attention time.
  4. Rank (palu/rank_search.py, uniform then rounding_search_result): r = 32 max(1, round(ratio d /
     32)) with Python's round, d = n_kv_heads x head_dim = 192: ratio 0.4 keeps 64.
Model: grad_reference.py's (transformers' LlamaForCausalLM from the GGUF, checked bit for bit against
gguf-py's dequantization, then float64 with its float64 RMSNorm / softmax / rotary patches; eager
attention, eval(), 2 threads). Singular values do not depend on the order of k_proj's rows, so the
HF / GGUF row orders of attn_k need no mapping.

Evaluation: the first --n (64) ids of tests/fixtures/engine/grad_ids_256.json, one forward without a
cache (the ids as given, no BOS), once with the model's own k_proj / v_proj and once with Palu's; the
logits of positions --prefill - 1 .. n - 1 (a prefill of --prefill ids and forced decode steps).

Fixture (--fixture, default methods/palu/fixtures/palu_r64_f64.json; ASCII JSON, the same bytes on
every run, timings on stdout): model_sha256, versions, settings, calibration_tokens, rank,
ids (evaluation), prefill, eigenvalues: for layers 0, 1, 14, 29 and K, V the first rank + 1 values of
s^2 / calibration_tokens (the eigenvalues of the keys' (values') uncentred second moment, which
kvbench's calibration computes), kept_energy per layer and kind (sum of the kept s^2 over all),
sample_ids (64 vocabulary ids, numpy default_rng(20261206)), and per evaluated position: top8 [[id,
logit]], the logits at sample_ids, logsumexp, for Palu (`palu`) and the unmodified model (`full`).

--fisher writes a second fixture (default methods/palu/fixtures/palu_fisher_g1_f64.json) for Palu's
default rank search and a grouped decomposition:
  5. Fisher information (palu/rank_search.py calib_fisher_info): for each of the first --fisher-windows
     calibration windows s, the loss of model(input_ids=s[:-1], labels=s[1:]) (the call Palu makes:
     transformers shifts the labels once more, so position t predicts s[t + 2]; the cross-entropy is
     written out in float64 where transformers would cast to float32) backpropagated to every
     k_proj and v_proj weight; per weight sqrt(mean over windows of grad^2); per module the mean of that
     (fisher_uniform's single group), and per KV head the mean over the head's rows (kvbench's artifact).
  6. fisher_uniform: ranks per module (layer 0 k_proj, v_proj, layer 1, ...) by Palu's loop (floor of
     target x f / sum f, then +1 in ascending order of the fraction cut off while dif > 0, the loop's
     `dif == 0` test on a float included), split_values over the groups (integer division), then
     rounding_search_result per group.
  7. G-LRD with --group-size heads per group (1: every KV head apart): each group's rows of k_proj
     (v_proj) decomposed as in step 3 at its own rank, with the same whitening.
  8. The `fisher` search: the same loop over each group's mean Fisher information (module by module,
     groups of `group_dims` dimensions), then rounding_search_result per group; no split.
Its contents: fisher per layer ([K heads], [V heads]) and per module, the module ranks and per-group
ranks at rank ratios 0.2-0.6 (group sizes 1 and 3) of fisher_uniform (`allocations`) and the group
ranks of fisher (`allocations_fisher`), the eigenvalues of the groups' moments (layers 0 and 29, K and
V, each group's first 9), and the logits at --rank-ratio with --group-size of fisher_uniform (`palu`),
of fisher (`palu_fisher`) and of the unmodified model (`full`) in the first fixture's layout.

--quant writes a third fixture (default methods/palu/fixtures/palu_quant_f64.json):
  9. Latent quantization (palu/quant_utils.py configure_latent_quantizer, quant.py quantize_tensor,
     svd_linear.py fused_hadamard_matrix): each k_proj / v_proj of step 3 becomes x -> L Q(R x) with
     R <- H R, L <- L H^T for the rotated settings (H Palu's: Sylvester's at rank 64, Palu's order-12
     factor times Sylvester's of order 8 at rank 96), Q quantize_tensor per token in float64. L's
     columns (R's rows) are first turned so that each one's largest entry is positive, as kvbench fixes
     the signs. Settings at --rank-ratio (rank 64): 3 bits asymmetric with and without H, 4 bits
     symmetric in groups of 32 with H; at 0.5 (rank 96): 3 bits asymmetric with H, and unquantized
     (16 bits), that setting's neighbour.
Its contents: per setting the logits in the first fixture's layout and layer 0's v_proj output for the
first 12 tokens (`layer0_values`).

Usage (from the repo root; needs torch, transformers 5.x, gguf, numpy):
    python3 methods/palu/reference.py --make-ids      # methods/palu/fixtures/palu_calib_ids.json
    python3 methods/palu/reference.py                 # the fixture
    python3 methods/palu/reference.py --fisher --rank-ratio 0.5 --group-size 1   # the second fixture
    python3 methods/palu/reference.py --quant                                      # the third
"""

import argparse
import json
import math
import os
import random
import sys
import time

import numpy as np

sys.path.insert(0, os.path.join(os.path.dirname(os.path.abspath(__file__)), "..", "..", "tools", "reference"))
import grad_reference as gr  # noqa: E402  (model loading, checks, float64 mode, JSON writing)

FIXTURE_LAYERS = (0, 1, 14, 29)
SAMPLE_SEED = 20261206
N_SAMPLE_IDS = 64


def palu_rank(ratio, d, block=32):
    return min(d, max(1, round(ratio * d / block)) * block)


def make_ids(args):
    """Palu's get_calib_data on set-up's python-docs."""
    tok = gr.gguf_tokenizer(args.gguf)
    tot_text = "\n\n".join(gr.python_docs_texts())
    random.seed(3)
    seqs = []
    for _ in range(args.nsamples):
        i = random.randint(0, len(tot_text) - args.seqlen - 1)
        ids = tok(tot_text[i:i + args.seqlen * 10])["input_ids"][:args.seqlen]
        assert len(ids) == args.seqlen
        seqs.append([int(t) for t in ids])
    doc = {"description": "Palu's get_calib_data windows (seed 3) over data/python-docs, SmolLM2's tokenizer",
           "nsamples": args.nsamples, "seqlen": args.seqlen, "sequences": seqs}
    gr.write_json(args.calib_ids, doc)
    print(json.dumps({"calib_ids": args.calib_ids, "sequences": len(seqs), "tokens": sum(map(len, seqs))}))


def whitened_factors(W, XtX, rank):
    """Palu's whitened SVD of one projection W [out, in]: (L [out, r], R [r, in], s)."""
    import torch
    try:
        S = torch.linalg.cholesky(XtX)
        shifted = False
    except RuntimeError:
        lam = torch.linalg.eigvalsh(XtX)[0]
        S = torch.linalg.cholesky(XtX + (1e-3 - lam) * torch.eye(XtX.shape[0], dtype=XtX.dtype))
        shifted = True
    U, s, Vt = torch.linalg.svd(W @ S, full_matrices=False)
    V = Vt @ torch.linalg.inv(S)
    root = torch.diag(torch.sqrt(s[:rank]))
    return U[:, :rank] @ root, root @ V[:rank, :], s, shifted


def fisher_uniform_ranks(fisher, dims, ratio, per_module=1):
    """Palu's rank loop over mean Fisher information values of `dims` dimensions each: the modules' in
    fisher_uniform (one group per module), the groups' (per_module of them, module by module) in fisher,
    whose fisher_sum adds each module's sum(fisher_list)."""
    total_rank = 0
    fisher_sum = 0.0
    select = []
    for i in range(0, len(fisher), per_module):
        fisher_list = fisher[i:i + per_module]
        total_rank += dims * per_module
        select += [dims] * per_module
        fisher_sum += sum(fisher_list)
    target_rank = total_rank * ratio
    wanted = []
    for i, f in enumerate(fisher):
        rank_float = target_rank * f / fisher_sum
        wanted.append(rank_float)
        select[i] = min(select[i], math.floor(rank_float))
    indexes = sorted(range(len(fisher)), key=lambda i: wanted[i] - select[i])
    dif = target_rank - sum(select)
    while dif > 0:
        for i in indexes:
            if select[i] == dims:
                continue
            select[i] += 1
            dif -= 1
            if dif == 0:
                break
    return select


def round_ranks(ranks, block=32):
    """rounding_search_result on one module's list of group ranks."""
    return [max(1, round(r / block)) * block for r in ranks]


def split_and_round(module_ranks, groups, block=32):
    """split_values, then rounding_search_result: each module's rank // groups per group, rounded."""
    return [[max(1, round((r // groups) / block)) * block for _ in range(groups)] for r in module_ranks]


def fisher_information(model, windows):
    """calib_fisher_info on float64 weights: per k_proj / v_proj weight sqrt(mean grad^2)."""
    import torch
    projs = []
    for layer in model.model.layers:
        projs += [layer.self_attn.k_proj, layer.self_attn.v_proj]
    for p in projs:
        p.weight.requires_grad_(True)
    acc = [torch.zeros_like(p.weight) for p in projs]
    losses = []
    for s in windows:
        # model(input_ids=s[:-1], labels=s[1:]): transformers' loss shifts the labels again, so the
        # logits of s[:-1] at t are scored against s[t + 2]; written out here because transformers'
        # loss casts the logits to float32.
        t = torch.tensor([s])
        logits = model(input_ids=t[:, :-1], use_cache=False).logits[0]
        loss = torch.nn.functional.cross_entropy(logits[:-1], t[0, 2:])
        loss.backward()
        losses.append(float(loss.detach()))
        for a, p in zip(acc, projs):
            a.add_(p.weight.grad.detach() ** 2)
            p.weight.grad = None
    for p in projs:
        p.weight.requires_grad_(False)
    return [(a / len(windows)).sqrt() for a in acc], losses


def sylvester_signs(n):
    """The Sylvester matrix of a power-of-two order in natural order (Palu's butterflies,
    fast_hadamard_transform): S[i, j] = (-1)^popcount(i & j)."""
    import torch
    assert n & (n - 1) == 0
    i = torch.arange(n)
    parity = torch.zeros(n, n, dtype=torch.int64)
    and_ij = i[:, None] & i[None, :]
    while bool(and_ij.any()):
        parity ^= and_ij & 1
        and_ij = and_ij >> 1
    return (1 - 2 * parity).to(torch.float64)


def paley_signs(K):
    """Paley's first construction for the prime q = K - 1 = 3 mod 4, I + [[0, -1^T], [1, Q]] with
    Q[i, j] = chi(i - j): the orientation of Palu's stored order-12 table (hadamard_utils.py get_had12),
    compared element by element when this script was written (as its orders 20, 60, 108, 140, 180)."""
    import torch
    q = K - 1
    squares = {x * x % q for x in range(1, q)}
    chi = lambda x: 0 if x % q == 0 else (1 if x % q in squares else -1)  # noqa: E731
    H = torch.eye(K, dtype=torch.float64)
    for i in range(K):
        for j in range(K):
            H[i, j] += (0 if j == 0 else -1) if i == 0 else (1 if j == 0 else chi(i - j))
    return H


PALU_ORDERS = (244, 180, 172, 156, 140, 108, 92, 84, 76, 68, 60, 52, 44, 36, 28, 40, 20, 12)


def palu_hadamard(n):
    """Palu's rotation of a rank-n latent (hadamard_utils.py get_hadK, matmul_hadU): the first listed
    order K dividing n, H = (H_K (x) S_{n/K}) / sqrt(n), S on the low index bits; K = 1 for a power of
    two. This script builds H_12 only, the factor the fixture's ranks need."""
    import torch
    K = next((k for k in PALU_ORDERS if n % k == 0), 1)
    assert K in (1, 12) and (n // K) & (n // K - 1) == 0, f"no Hadamard matrix of order {n} here"
    hk = torch.ones(1, 1, dtype=torch.float64) if K == 1 else paley_signs(K)
    return torch.kron(hk, sylvester_signs(n // K)) / math.sqrt(n)


def palu_quantize(x, bits, group, sym):
    """palu/model/modules/quant.py quantize_tensor on the latent's last dimension, in float64; 16 bits
    and more leave it as it is (its Quantizer's forward)."""
    import torch
    if bits >= 16:
        return x
    shape = x.shape
    w = x.reshape(-1, group if group > 0 else shape[-1])
    if sym:
        w_max = w.abs().amax(dim=-1, keepdim=True).clamp(min=1e-5)
        q_max, q_min = 2 ** (bits - 1) - 1, -2 ** (bits - 1)
        scales = w_max / q_max
        base = torch.zeros_like(scales)
    else:
        w_max = w.amax(dim=-1, keepdim=True)
        w_min = w.amin(dim=-1, keepdim=True)
        q_max, q_min = 2 ** bits - 1, 0
        scales = (w_max - w_min).clamp(min=1e-5) / q_max
        base = torch.round(-w_min / scales).clamp_(min=q_min, max=q_max)
    w = (torch.clamp(torch.round(w / scales) + base, q_min, q_max) - base) * scales
    return w.reshape(shape)


def quantized_low_rank(L, R, bits, group, sym, hadamard):
    """Palu's HeadwiseLowRankModule of one group with its latent quantizer: x -> L Q(R x), the Hadamard
    matrix fused as Palu's fused_hadamard_matrix fuses it (R <- H R, L <- L H^T). The columns of L are
    first turned so that each one's entry of largest magnitude is positive (R's rows with them): the SVD
    leaves the signs open and kvbench fixes them so."""
    import torch

    class QuantizedLowRank(torch.nn.Module):
        def __init__(self):
            super().__init__()
            l, r = L.clone(), R.clone()
            for c in range(l.shape[1]):
                if l[int(torch.argmax(l[:, c].abs())), c] < 0:
                    l[:, c], r[c, :] = -l[:, c], -r[c, :]
            if hadamard:
                H = palu_hadamard(l.shape[1])
                l, r = l @ H.T, H @ r
            self.l, self.r = l, r

        def forward(self, x):
            return palu_quantize(x @ self.r.T, bits, group, sym) @ self.l.T

    return QuantizedLowRank()


QUANT_VALUE_TOKENS = 12  # layer 0's values of the first tokens, where both sides quantize nearly exact inputs
# bits, group, sym, hadamard, rank ratio (None: --rank-ratio)
QUANT_SETTINGS = ((3, 0, False, True, None), (3, 0, False, False, None), (4, 32, True, True, None),
                  (3, 0, False, True, 0.5), (16, 0, False, False, 0.5))


def quant_fixture(args, model, ids, xtx, n_tokens, full_logits, model_sha):
    """Step 9: Palu's latent quantization on the J-LRD factors, one setting after another."""
    import torch
    layers = model.model.layers
    d = model.config.num_key_value_heads * (model.config.hidden_size // model.config.num_attention_heads)
    factors = {}  # rank -> per layer, K and V: (L, R)
    runs = {}
    for bits, group, sym, hadamard, ratio in QUANT_SETTINGS:
        ratio = args.rank_ratio if ratio is None else ratio
        rank = palu_rank(ratio, d)
        if rank not in factors:
            factors[rank] = [[whitened_factors(p.weight.data, xtx[l], rank)[:2]
                              for p in (layer.self_attn.k_proj, layer.self_attn.v_proj)]
                             for l, layer in enumerate(layers)]
        name = f"b{bits}_g{group}_{'sym' if sym else 'asym'}{'_had' if hadamard else ''}_r{rank}"
        saved = []
        for l, layer in enumerate(layers):
            for z, attr in enumerate(("k_proj", "v_proj")):
                proj = getattr(layer.self_attn, attr)
                saved.append((layer.self_attn, attr, proj))
                q = quantized_low_rank(*factors[rank][l][z], bits, group, sym, hadamard)
                setattr(layer.self_attn, attr, q)
        values = []
        hook = layers[0].self_attn.v_proj.register_forward_hook(lambda mod, inp, out: values.append(out[0]))
        with torch.no_grad():
            runs[name] = (model(torch.tensor([ids]), use_cache=False).logits[0].numpy(),
                          {"bits": bits, "group_size": group, "sym": sym, "hadamard": hadamard,
                           "rank_ratio": ratio, "rank": rank,
                           "layer0_values": [[float(v) for v in row] for row in values[0][:QUANT_VALUE_TOKENS]]})
        hook.remove()
        for parent, attr, proj in saved:
            setattr(parent, attr, proj)
    first = next(iter(runs.values()))[0]
    entries, _, _ = logit_entries(model.config.vocab_size, args, first, full_logits)
    doc = {
        "description": "Palu's latent quantization (J-LRD, uniform rank) against the unmodified model, "
                       "SmolLM2-135M-Instruct in float64 (methods/palu/reference.py --quant)",
        "model_sha256": model_sha,
        "versions": gr.versions(),
        "settings": {"dtype": "float64", "attn_implementation": "eager", "rank_ratio": args.rank_ratio,
                     "rank_block": 32, "calib_ids": os.path.relpath(args.calib_ids, gr.REPO_ROOT)},
        "calibration_tokens": n_tokens,
        "ids": ids,
        "prefill": args.prefill,
        "sample_ids": entries["sample_ids"],
        "positions": entries["positions"],
        "full": entries["full"],
        "quantized": [{"name": name, **setting,
                       "logits": [position_summary(lg[p], entries["sample_ids"]) for p in entries["positions"]]}
                      for name, (lg, setting) in runs.items()],
    }
    gr.write_json(args.quant_fixture, doc)
    pos = entries["positions"]
    print(json.dumps({"fixture": args.quant_fixture,
                      "max_abs_vs_full": {n: float(np.abs(lg[pos] - full_logits[pos]).max())
                                          for n, (lg, _) in runs.items()}}))


def position_summary(row, sample_ids):
    row = row.astype(np.float64)
    top = np.argsort(-row, kind="stable")[:8]
    m = row.max()
    return {"top8": [[int(i), float(row[i])] for i in top],
            "samples": [float(row[i]) for i in sample_ids],
            "logsumexp": float(m + np.log(np.sum(np.exp(row - m))))}


def logit_entries(vocab_size, args, palu_logits, full_logits):
    """The fixtures' compared positions: sample ids, positions, Palu's and the unmodified model's summaries;
    and the largest difference and argmax agreement between the two over those positions."""
    sample_ids = sorted(int(i) for i in np.random.default_rng(SAMPLE_SEED).choice(vocab_size, N_SAMPLE_IDS,
                                                                                   replace=False))
    positions = list(range(args.prefill - 1, args.n))
    entries = {"sample_ids": sample_ids, "positions": positions,
               "palu": [position_summary(palu_logits[p], sample_ids) for p in positions],
               "full": [position_summary(full_logits[p], sample_ids) for p in positions]}
    diff = float(np.abs(palu_logits[positions] - full_logits[positions]).max())
    agree = float(np.mean(palu_logits[positions].argmax(-1) == full_logits[positions].argmax(-1)))
    return entries, diff, agree


def fisher_fixture(args, model, calib, ids, xtx, n_tokens, full_logits, model_sha, t0):
    """Steps 5-7: Palu's Fisher information and fisher_uniform ranks, G-LRD at --group-size."""
    import torch
    cfg = model.config
    layers = model.model.layers
    head_dim = cfg.hidden_size // cfg.num_attention_heads
    H = cfg.num_key_value_heads
    d = H * head_dim
    assert H % args.group_size == 0
    groups = H // args.group_size
    gd = d // groups

    fisher, losses = fisher_information(model, calib[:args.fisher_windows])
    module = [float(torch.mean(f)) for f in fisher]
    heads = [[float(v) for v in f.reshape(H, -1).mean(1)] for f in fisher]
    t_fisher = time.perf_counter() - t0

    def group_means(g_count):
        """Palu's fisher search: torch.mean of each group's rows of each module, module by module."""
        return [float(torch.mean(x)) for f in fisher for x in f.reshape(g_count, -1, f.shape[1])]

    def fisher_group_ranks(g_count, ratio):
        flat = fisher_uniform_ranks(group_means(g_count), d // g_count, ratio, g_count)
        return [round_ranks(flat[i:i + g_count]) for i in range(0, len(flat), g_count)]

    allocations, allocations_fisher = {}, {}
    for g_size in sorted({1, H}):
        for ratio in (0.2, 0.3, 0.4, 0.5, 0.6):
            ranks = fisher_uniform_ranks(module, d, ratio)
            allocations[f"g{g_size}_r{ratio}"] = {"group_size": g_size, "rank_ratio": ratio, "module_ranks": ranks,
                                                  "group_ranks": split_and_round(ranks, H // g_size)}
            allocations_fisher[f"g{g_size}_r{ratio}"] = {"group_size": g_size, "rank_ratio": ratio,
                                                         "group_ranks": fisher_group_ranks(H // g_size, ratio)}
    group_ranks = split_and_round(fisher_uniform_ranks(module, d, args.rank_ratio), groups)
    group_ranks_fisher = fisher_group_ranks(groups, args.rank_ratio)

    originals = [(layer.self_attn.k_proj.weight.data.clone(), layer.self_attn.v_proj.weight.data.clone())
                 for layer in layers]
    eigen = {}
    for l in (0, 29):
        for z, kind in enumerate(("K", "V")):
            W = originals[l][z]
            eigen.setdefault(str(l), {})[kind] = [
                [float(v) for v in (whitened_factors(W[g * gd:(g + 1) * gd], xtx[l], 1)[2][:9] ** 2).numpy() / n_tokens]
                for g in range(groups)]

    def logits_with(ranks):
        """The model with Palu's factored k_proj / v_proj at these group ranks (from the original weights)."""
        with torch.no_grad():
            for l, layer in enumerate(layers):
                for z, proj in enumerate((layer.self_attn.k_proj, layer.self_attn.v_proj)):
                    W = originals[l][z]
                    proj.weight.data = W.clone()
                    for g in range(groups):
                        L, R, _, shifted = whitened_factors(W[g * gd:(g + 1) * gd], xtx[l], ranks[2 * l + z][g])
                        assert not shifted
                        proj.weight.data[g * gd:(g + 1) * gd] = L @ R
            return model(torch.tensor([ids]), use_cache=False).logits[0].numpy()

    palu_logits = logits_with(group_ranks)
    fisher_logits = logits_with(group_ranks_fisher)

    entries, diff, agree = logit_entries(cfg.vocab_size, args, palu_logits, full_logits)
    doc = {
        "description": "Palu's Fisher information, fisher_uniform ranks and G-LRD against the unmodified model, "
                       "SmolLM2-135M-Instruct in float64 (methods/palu/reference.py --fisher)",
        "model_sha256": model_sha,
        "versions": gr.versions(),
        "settings": {"dtype": "float64", "attn_implementation": "eager", "rank_ratio": args.rank_ratio,
                     "group_size": args.group_size, "rank_block": 32,
                     "calib_ids": os.path.relpath(args.calib_ids, gr.REPO_ROOT),
                     "fisher_windows": args.fisher_windows, "target_offset": 2},
        "calibration_tokens": n_tokens,
        "fisher_losses": losses,
        "fisher_heads": [{"K": heads[2 * l], "V": heads[2 * l + 1]} for l in range(len(layers))],
        "fisher_modules": module,
        "allocations": allocations,
        "group_ranks": group_ranks,
        "fisher_group_means": {str(g_size): group_means(H // g_size) for g_size in sorted({1, H})},
        "allocations_fisher": allocations_fisher,
        "group_ranks_fisher": group_ranks_fisher,
        "group_eigenvalues": eigen,
        "ids": ids,
        "prefill": args.prefill,
        **entries,
        "palu_fisher": [position_summary(fisher_logits[p], entries["sample_ids"]) for p in entries["positions"]],
    }
    gr.write_json(args.fisher_fixture, doc)
    kept = sum(sum(g) for g in group_ranks) / (2 * len(layers) * d)
    print(json.dumps({"fixture": args.fisher_fixture, "kept_share": kept, "fisher_losses": losses,
                      "max_abs_palu_vs_full": diff, "argmax_agreement_palu_vs_full": agree,
                      "module_ranks": fisher_uniform_ranks(module, d, args.rank_ratio),
                      "kept_share_fisher": sum(sum(g) for g in group_ranks_fisher) / (2 * len(layers) * d),
                      "max_abs_fisher_vs_full": float(np.abs(fisher_logits[entries["positions"]] -
                                                             full_logits[entries["positions"]]).max()),
                      "seconds": {"fisher": round(t_fisher, 1), "total": round(time.perf_counter() - t0, 1)}}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(gr.REPO_ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--make-ids", action="store_true", help="write the calibration windows and stop")
    ap.add_argument("--calib-ids", default=os.path.join(gr.REPO_ROOT, "methods/palu/fixtures/palu_calib_ids.json"))
    ap.add_argument("--nsamples", type=int, default=8)
    ap.add_argument("--seqlen", type=int, default=256)
    ap.add_argument("--ids", default=os.path.join(gr.REPO_ROOT, "tests/fixtures/engine/grad_ids_256.json"))
    ap.add_argument("--n", type=int, default=64, help="evaluate the first N ids")
    ap.add_argument("--prefill", type=int, default=48, help="positions before the first compared one")
    ap.add_argument("--rank-ratio", type=float, default=0.4)
    ap.add_argument("--fixture", default=os.path.join(gr.REPO_ROOT, "methods/palu/fixtures/palu_r64_f64.json"))
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--fisher", action="store_true", help="write the Fisher / G-LRD fixture instead")
    ap.add_argument("--fisher-windows", type=int, default=4, help="calibration windows of the Fisher pass")
    ap.add_argument("--group-size", type=int, default=1, help="KV heads per group of the --fisher fixture")
    ap.add_argument("--fisher-fixture",
                    default=os.path.join(gr.REPO_ROOT, "methods/palu/fixtures/palu_fisher_g1_f64.json"))
    ap.add_argument("--quant", action="store_true", help="write the latent quantization fixture instead")
    ap.add_argument("--quant-fixture",
                    default=os.path.join(gr.REPO_ROOT, "methods/palu/fixtures/palu_quant_f64.json"))
    args = ap.parse_args()
    if args.make_ids:
        make_ids(args)
        return

    import torch

    with open(args.calib_ids, encoding="utf-8") as f:
        calib = json.load(f)["sequences"]
    with open(args.ids, encoding="utf-8") as f:
        ids = [int(i) for i in json.load(f)][:args.n]
    assert len(ids) == args.n and 1 <= args.prefill < args.n

    t0 = time.perf_counter()
    model, _, model_sha = gr.frozen_float64_model(args.gguf, args.threads)
    cfg = model.config
    layers = model.model.layers
    d = cfg.num_key_value_heads * (cfg.hidden_size // cfg.num_attention_heads)
    rank = palu_rank(args.rank_ratio, d)
    assert all(0 <= t < cfg.vocab_size for s in calib for t in s)

    # Step 2: X^T X of every layer's k_proj / v_proj input under the unmodified model.
    xtx = [torch.zeros(cfg.hidden_size, cfg.hidden_size, dtype=torch.float64) for _ in layers]

    def tap(l):
        def hook(mod, inp):
            x = inp[0].reshape(-1, inp[0].shape[-1])
            xtx[l].add_(x.T @ x)
        return hook

    handles = [layer.self_attn.k_proj.register_forward_pre_hook(tap(l)) for l, layer in enumerate(layers)]
    n_tokens = 0
    with torch.no_grad():
        for s in calib:
            model(torch.tensor([s]), use_cache=False)
            n_tokens += len(s)
    for h in handles:
        h.remove()
    with torch.no_grad():
        full_logits = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    t_calib = time.perf_counter() - t0

    if args.fisher:
        fisher_fixture(args, model, calib, ids, xtx, n_tokens, full_logits, model_sha, t0)
        return
    if args.quant:
        quant_fixture(args, model, ids, xtx, n_tokens, full_logits, model_sha)
        return

    # Steps 3-4: the factored projections, rank r for every layer, K and V.
    eigen, energy, shifted_any = {}, {"K": [], "V": []}, False
    for l, layer in enumerate(layers):
        for kind, proj in (("K", layer.self_attn.k_proj), ("V", layer.self_attn.v_proj)):
            L, R, s, shifted = whitened_factors(proj.weight.data, xtx[l], rank)
            shifted_any |= shifted
            s2 = (s ** 2).numpy()
            energy[kind].append(float(s2[:rank].sum() / s2.sum()))
            if l in FIXTURE_LAYERS:
                eigen.setdefault(str(l), {})[kind] = [float(v) for v in s2[:rank + 1] / n_tokens]
            proj.weight.data = L @ R
    with torch.no_grad():
        palu_logits = model(torch.tensor([ids]), use_cache=False).logits[0].numpy()
    t_done = time.perf_counter() - t0

    entries, diff, agree = logit_entries(cfg.vocab_size, args, palu_logits, full_logits)
    doc = {
        "description": "Palu (whitened SVD of k_proj and v_proj, J-LRD, uniform rank) against the unmodified "
                       "model, SmolLM2-135M-Instruct in float64 (methods/palu/reference.py)",
        "model_sha256": model_sha,
        "versions": gr.versions(),
        "settings": {"dtype": "float64", "attn_implementation": "eager", "rank_ratio": args.rank_ratio,
                     "rank_block": 32, "calib_ids": os.path.relpath(args.calib_ids, gr.REPO_ROOT),
                     "cholesky_shifted": shifted_any},
        "calibration_tokens": n_tokens,
        "rank": rank,
        "ids": ids,
        "prefill": args.prefill,
        "eigenvalues": eigen,
        "kept_energy": energy,
        **entries,
    }
    gr.write_json(args.fixture, doc)
    print(json.dumps({"fixture": args.fixture, "rank": rank, "calibration_tokens": n_tokens,
                      "cholesky_shifted": shifted_any, "max_abs_palu_vs_full": diff,
                      "argmax_agreement_palu_vs_full": agree,
                      "kept_energy_min": {k: min(v) for k, v in energy.items()},
                      "seconds": {"calibration": round(t_calib, 1), "total": round(t_done, 1)}}))


if __name__ == "__main__":
    main()
