#!/usr/bin/env python3
"""QJL's key cache run by its authors' code on fixed keys, for test_qjl.cpp.

amirzandieh/QJL (commit 421d61c), models/llama2_utils_qjl.py: `QJLSketch` draws the projection (a Gaussian
[head_dim, m], each block of head_dim columns replaced by its QR factor Q times sqrt(head_dim)) and
`QJLKeyQuantizer` keeps the cache: `build_sketch` on the prompt's keys, then per decoded token
`update_sketch` (the key joins the buffer; a full buffer is sketched in groups, each with its own outlier
channels) and `attention_score` (estimates for the sketched keys, exact products for the buffer). Those
classes run here unchanged. Their two CUDA entry points, `qjl_kernel.qjl_quant` and `qjl_kernel.qjl_score`
(qjl_kernel/csrc/qjl_quant_kernel.cu, qjl_score_kernel.cu), cannot run on a CPU; the functions below
compute what the kernels compute, in float64:

  quant: bit j of a token's code is [sum over non-outlier channels c of S[c, j] k[c] > 0] (m bits, bit j of
         byte j // 8 at j % 8), the outliers' code the same over the group's outlier channels and the first
         m_o columns, and the outlier norm sqrt(sum over outlier channels of k[c]^2);
  score: sqrt(pi/2)/m sqrt(|k|^2 - |k_out|^2) sum_j (+-1)_j (S^T q - S_out^T q_out)_j
         + sqrt(pi/2)/m_o |k_out| sum_{j < m_o} (+-1)_j (S_out^T q_out)_j.

The projection is rounded to fp16 after it is drawn (so that the fixture stores it compactly; both sides
use the rounded one), and the stored norms are rounded to fp16 after each call, as the authors' fp16 runs
store them. Written: the keys (fp16-representable float32), and per case (sketch sizes of the later and of the
first layers of run_longbench.py's defaults) the projection, the queries and QJL's scores at chosen decode
steps, and the final codes, outlier channels and norms.

    python3 methods/qjl/reference.py --qjl DIR   (a checkout of amirzandieh/QJL; needs torch and scipy)
"""
import argparse
import base64
import json
import math
import pathlib
import sys
import types

import torch

ROOT = pathlib.Path(__file__).resolve().parents[2]
OUT = ROOT / "methods/qjl/fixtures/qjl_reference.json"
D, OUTLIERS, GROUP, BUFFER = 64, 8, 32, 128
# sketch bits, outlier sketch bits, prompt tokens, decode steps, steps whose scores are written
CASES = [(256, 256, 200, 80, [1, 55, 56, 80]), (512, 128, 130, 12, [1, 12])]


def b64(t, dtype):
    return base64.b64encode(t.contiguous().numpy().astype(dtype).tobytes()).decode()


def pack(bits):  # [..., n] bool -> [..., n / 8] uint8, bit j of byte j // 8 at j % 8
    w = 2 ** torch.arange(8, dtype=torch.int64)
    return (bits.view(*bits.shape[:-1], -1, 8).long() * w).sum(-1).to(torch.uint8)


def unpack(codes, n):  # -> [..., n] of +-1.0
    bits = (codes.long().unsqueeze(-1) >> torch.arange(8)) & 1
    return (2.0 * bits - 1.0).view(*codes.shape[:-1], -1)[..., :n].double()


def qjl_quant(data, outlier_indices, rand_prj, outlier_sketch_dim):
    """qjl_quant_kernel.cu: data [b, h, n, group, d], outlier_indices [b, h, n, o], rand_prj [m, d]."""
    x = data.double()
    mask = torch.zeros(*x.shape[:3], x.shape[-1], dtype=torch.float64)
    mask.scatter_(-1, outlier_indices.long(), 1.0)
    mask = mask.unsqueeze(-2)
    S = rand_prj.double()
    inlier = torch.einsum("bhngd,md->bhngm", x * (1 - mask), S)
    outlier = torch.einsum("bhngd,md->bhngm", x * mask, S[:outlier_sketch_dim])
    norms = ((x * mask) ** 2).sum(-1).sqrt().half().to(data.dtype)
    return pack(inlier > 0), pack(outlier > 0), norms


def qjl_score(key_quant, key_outlier_quant, key_norm, key_outlier_norm, outlier_indices, query_sketch, query_states,
              rand_prj):
    """qjl_score_kernel.cu: scores [b, h, n * group, 1] of one query against the sketched keys."""
    S = rand_prj.double()  # [d, m]
    m = S.shape[1]
    mo = 8 * key_outlier_quant.shape[-1]
    q = query_states.double()[:, :, 0, :]
    qs = query_sketch.double()[:, :, 0, :]
    mask = torch.zeros(*outlier_indices.shape[:3], S.shape[0], dtype=torch.float64)
    mask.scatter_(-1, outlier_indices.long(), 1.0)
    qo = torch.einsum("bhnd,bhd,dm->bhnm", mask, q, S)  # the query's sketch over each group's outliers
    ip = (unpack(key_quant, m) * (qs[:, :, None, None, :] - qo[:, :, :, None, :])).sum(-1)
    op = (unpack(key_outlier_quant, mo) * qo[:, :, :, None, :mo]).sum(-1)
    n, no = key_norm.double(), key_outlier_norm.double()
    score = math.sqrt(math.pi / 2) / m * (n ** 2 - no ** 2).sqrt() * ip + math.sqrt(math.pi / 2) / mo * no * op
    return score.reshape(*score.shape[:2], -1, 1).float()


def load_qjl(checkout):
    kernel = types.ModuleType("qjl_kernel.qjl_kernel")
    kernel.qjl_quant, kernel.qjl_score = qjl_quant, qjl_score
    package = types.ModuleType("qjl_kernel")
    package.qjl_kernel = kernel
    sys.modules["qjl_kernel"], sys.modules["qjl_kernel.qjl_kernel"] = package, kernel
    sys.path.insert(0, str(checkout))
    from models import llama2_utils_qjl
    return llama2_utils_qjl


def round_norms(kq):
    for name in ("key_states_norm", "key_outliers_norm"):
        if getattr(kq, name, None) is not None:
            setattr(kq, name, getattr(kq, name).half().float())


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--qjl", required=True, type=pathlib.Path)
    args = ap.parse_args()
    qjl = load_qjl(args.qjl)

    g = torch.Generator().manual_seed(7)
    tokens = max(n0 + steps for _, _, n0, steps, _ in CASES)
    keys = torch.randn(tokens, D, generator=g) * torch.linspace(0.3, 2.0, D)
    # Channels that run large for stretches of tokens, as keys' outlier channels do.
    for c, t0, t1, scale in [(5, 0, 120, 8.0), (17, 60, 200, 6.0), (40, 0, tokens, 4.0), (63, 150, 260, 9.0)]:
        keys[t0:t1, c] *= scale
    keys = keys.half().float()
    out = {"head_dim": D, "outliers": OUTLIERS, "group": GROUP, "buffer": BUFFER, "tokens": tokens,
           "keys": b64(keys, "<f2"), "cases": []}
    for m, mo, n0, steps, checks in CASES:
        sketch = qjl.QJLSketch(dim=(D, m), dim_outlier=mo, device=torch.device("cpu"),
                               rng=torch.Generator().manual_seed(m), rot=True)
        sketch.proj_dir_score = sketch.proj_dir_score.half().float().contiguous()
        sketch.proj_dir_quant = sketch.proj_dir_score.transpose(0, 1).contiguous()
        kq = qjl.QJLKeyQuantizer(sketch, OUTLIERS, BUFFER, GROUP, m)
        k = keys.view(1, 1, tokens, D)
        kq.build_sketch(k[:, :, :n0].contiguous())
        round_norms(kq)
        case = {"sketch": m, "outlier_sketch": mo, "prompt": n0, "steps": steps,
                "projection": b64(sketch.proj_dir_score, "<f2"), "checks": []}
        for step in range(1, steps + 1):
            kq.update_sketch(k[:, :, n0 + step - 1:n0 + step].contiguous())
            round_norms(kq)
            if step in checks:
                q = torch.randn(1, 1, 1, D, generator=g) * 0.5
                scores = kq.attention_score(q)[0, 0, 0]
                assert scores.numel() == n0 + step
                case["checks"].append({"step": step, "query": b64(q.view(D), "<f4"), "scores": b64(scores, "<f4")})
        n = kq.key_states_quant.shape[2] * GROUP
        case["sketched"] = n
        case["codes"] = b64(kq.key_states_quant.reshape(n, m // 8), "u1")
        case["outlier_codes"] = b64(kq.key_outliers_quant.reshape(n, mo // 8), "u1")
        case["outlier_channels"] = b64(kq.outlier_indices.reshape(-1, OUTLIERS), "u1")
        case["norms"] = b64(kq.key_states_norm.reshape(n), "<f4")
        case["outlier_norms"] = b64(kq.key_outliers_norm.reshape(n), "<f4")
        out["cases"].append(case)
    OUT.parent.mkdir(parents=True, exist_ok=True)
    OUT.write_text(json.dumps(out, indent=1) + "\n")
    print(f"wrote {OUT} ({len(CASES)} cases)")


if __name__ == "__main__":
    main()
