#!/usr/bin/env python3
"""Random-weight Falcon and Phi-3 models saved by transformers, their logits and gradients, and the same
models as GGUF files: the architectures whose checkpoints fuse projections that kvbench splits.

Falcon differs from the Llama family in its block: LayerNorm with bias, a GELU MLP without gate,
attention and MLP side by side on the layer's input, and one fused query_key_value matrix whose row
order depends on the variant. Phi-3 is a Llama block with fused qkv_proj ([Q; K; V]) and gate_up_proj
(gate, then up). One model per variant kvbench reads:

  falcon_7b_like/       Falcon-7B's settings: multi_query (one KV head), parallel_attn, one
                        input_layernorm per layer, fused rows [Q; K; V], tied embeddings
  falcon_40b_like/      new_decoder_architecture (Falcon-40B/180B): 2 KV heads for 8 query heads, the
                        fused rows grouped per KV head [its queries; K; V], ln_attn and ln_mlp
  falcon_sequential/    parallel_attn false, multi_query false: per-head fused rows [q; k; v],
                        input_layernorm then post_attention_layernorm, a separate output head
  phi3_fused/           Phi-3 with 4 query and 2 KV heads, head_dim 16 and a sliding_window (200)
                        longer than the ids, so it does not act

Each directory holds what save_pretrained wrote (config.json, model.safetensors,
generation_config.json), `logits.bin` (every position's logits, little-endian float32,
[positions, vocab]), `reference.json` (ids, shape, versions) and `grads.json`: the mean next-token
loss over the ids and its gradient for every weight by torch autograd in float64 (per tensor under
kvbench's names, the fused query_key_value's split into attn_q/k/v as kvbench splits the weight: its
norm, largest |entry| and 16 sampled entries). The first two are also written as
GGUF files (`<name>.gguf`, F32) with llama.cpp's falcon names and keys: its converter reorders the
grouped query_key_value into [Q; K; V] and names ln_mlp attn_norm_2; Phi-3's under llama.cpp's phi3
names (attn_qkv, and ffn_up holding gate and up).

    python3 tools/reference/fused_arch_parity.py [--outdir tests/fixtures/hf_config]

Needs torch, transformers 5.x, safetensors, numpy, gguf. Deterministic (fixed seeds); runs in seconds.
"""
import argparse
import json
import os
import platform
import shutil
from importlib.metadata import version as pkg_version

import numpy as np
import torch
from transformers import AutoModelForCausalLM, FalconConfig, Phi3Config

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
N_TOKENS = 96
VOCAB = 128


def configs():
    common = dict(vocab_size=VOCAB, hidden_size=64, num_hidden_layers=2, layer_norm_epsilon=1e-5,
                  max_position_embeddings=512, bias=False, alibi=False, bos_token_id=None, eos_token_id=None)
    return {
        "falcon_7b_like": FalconConfig(num_attention_heads=4, multi_query=True, parallel_attn=True,
                                       new_decoder_architecture=False, **common),
        "falcon_40b_like": FalconConfig(num_attention_heads=8, num_kv_heads=2, new_decoder_architecture=True,
                                        rope_parameters={"rope_type": "default", "rope_theta": 50000.0},
                                        **common),
        "falcon_sequential": FalconConfig(num_attention_heads=4, multi_query=False, parallel_attn=False,
                                          new_decoder_architecture=False, tie_word_embeddings=False,
                                          ffn_hidden_size=96, **common),
        "phi3_fused": Phi3Config(vocab_size=VOCAB, hidden_size=64, intermediate_size=96, num_hidden_layers=2,
                                 num_attention_heads=4, num_key_value_heads=2, rms_norm_eps=1e-5,
                                 max_position_embeddings=512, original_max_position_embeddings=512,
                                 sliding_window=200, tie_word_embeddings=False, bos_token_id=None,
                                 eos_token_id=None, pad_token_id=None),
    }


GGUF_NAMES = {"input_layernorm": "attn_norm", "ln_attn": "attn_norm", "ln_mlp": "attn_norm_2",
              "post_attention_layernorm": "ffn_norm", "self_attn.qkv_proj": "attn_qkv",
              "self_attn.o_proj": "attn_output", "mlp.gate_up_proj": "ffn_up", "mlp.down_proj": "ffn_down",
              "self_attention.query_key_value": "attn_qkv", "self_attention.dense": "attn_output",
              "mlp.dense_h_to_4h": "ffn_up", "mlp.dense_4h_to_h": "ffn_down"}


def gguf_name(name):
    if name in ("transformer.word_embeddings.weight", "model.embed_tokens.weight"):
        return "token_embd.weight"
    if name.startswith("transformer.ln_f.") or name.startswith("model.norm."):
        return "output_norm." + name.rsplit(".", 1)[1]
    if name == "lm_head.weight":
        return "output.weight"
    _, _, layer, rest = name.split(".", 3)
    module, kind = rest.rsplit(".", 1)
    return f"blk.{layer}.{GGUF_NAMES[module]}.{kind}"


def contiguous_qkv(w, cfg):
    """llama.cpp's converter turns a new_decoder_architecture query_key_value into [Q; K; V]."""
    if not cfg.new_decoder_architecture:
        return w
    d = cfg.hidden_size // cfg.num_attention_heads
    qkv = w.view(cfg.num_kv_heads, cfg.num_attention_heads // cfg.num_kv_heads + 2, d, cfg.hidden_size)
    q = qkv[:, :-2].reshape(-1, cfg.hidden_size)
    k = qkv[:, [-2]].reshape(-1, cfg.hidden_size)
    v = qkv[:, [-1]].reshape(-1, cfg.hidden_size)
    return torch.cat((q, k, v))


def split_qkv(w, cfg):
    """The fused rows as (Q, K, V) in the variant's layout."""
    hq, d, H = cfg.num_attention_heads, cfg.hidden_size // cfg.num_attention_heads, cfg.hidden_size
    if cfg.model_type == "phi3":
        kv = cfg.num_key_value_heads * d
        return w[:hq * d], w[hq * d:hq * d + kv], w[hq * d + kv:]
    if cfg.new_decoder_architecture:
        g = w.view(cfg.num_kv_heads, hq // cfg.num_kv_heads + 2, d, H)
        return g[:, :-2].reshape(-1, H), g[:, -2].reshape(-1, H), g[:, -1].reshape(-1, H)
    if cfg.multi_query:
        return w[:hq * d], w[hq * d:(hq + 1) * d], w[(hq + 1) * d:]
    g = w.view(hq, 3, d, H)
    return g[:, 0].reshape(-1, H), g[:, 1].reshape(-1, H), g[:, 2].reshape(-1, H)


def write_gradients(model_dir, ids, path):
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    cfg = model.config
    logits = model(ids[None, :], use_cache=False).logits[0]
    loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:])
    loss.backward()
    rng = np.random.default_rng(3)
    grads = {}
    for name, p in model.named_parameters():
        prefix = gguf_name(name).rsplit(".", 2)[0] if ".layers." in name or ".h." in name else ""
        if name.endswith("query_key_value.weight") or name.endswith("qkv_proj.weight"):
            for part, g in zip(("attn_q", "attn_k", "attn_v"), split_qkv(p.grad, cfg)):
                grads[f"{prefix}.{part}.weight"] = g
        elif name.endswith("gate_up_proj.weight"):
            gate, up = p.grad.chunk(2, dim=0)
            grads[f"{prefix}.ffn_gate.weight"], grads[f"{prefix}.ffn_up.weight"] = gate, up
        else:
            grads[gguf_name(name)] = p.grad
    tensors = {}
    for name, g in grads.items():
        g = g.detach().contiguous().numpy().reshape(-1)
        idx = sorted(rng.choice(g.size, size=min(16, g.size), replace=False).tolist())
        tensors[name] = {"norm": float(np.linalg.norm(g)), "max_abs": float(np.abs(g).max()),
                         "samples": [[i, float(g[i])] for i in idx]}
    with open(path, "w") as f:
        json.dump({"loss": loss.item(), "dtype": "float64", "ids": "reference.json", "tensors": tensors}, f, indent=1)
        f.write("\n")


def write_gguf(model, cfg, path):
    import gguf

    phi3 = cfg.model_type == "phi3"  # the keys as llama.cpp's Phi3MiniModel writes them
    w = gguf.GGUFWriter(path, cfg.model_type)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size if phi3 else cfg.ffn_hidden_size)
    w.add_block_count(cfg.num_hidden_layers)
    w.add_head_count(cfg.num_attention_heads)
    if phi3:
        w.add_head_count_kv(cfg.num_key_value_heads)
        w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
        w.add_rope_dimension_count(cfg.hidden_size // cfg.num_attention_heads)
        w.add_sliding_window(cfg.sliding_window)
    else:
        w.add_head_count_kv(cfg.num_kv_heads if cfg.new_decoder_architecture else 1)
        w.add_layer_norm_eps(cfg.layer_norm_epsilon)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_vocab_size(cfg.vocab_size)
    for name, t in model.state_dict().items():
        if name == "lm_head.weight" and cfg.tie_word_embeddings:
            continue
        if name.endswith("query_key_value.weight") and not phi3:
            t = contiguous_qkv(t, cfg)
        w.add_tensor(gguf_name(name), t.detach().float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outdir", default=os.path.join(REPO_ROOT, "tests", "fixtures", "hf_config"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": pkg_version("transformers"), "safetensors": pkg_version("safetensors"),
                "numpy": np.__version__, "gguf": pkg_version("gguf")}
    ids = torch.tensor(np.random.default_rng(7).integers(0, VOCAB, N_TOKENS), dtype=torch.long)
    for i, (name, cfg) in enumerate(configs().items()):
        torch.manual_seed(31 + i)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32, attn_implementation="eager")
        with torch.no_grad():  # init_std 0.02 gives near-uniform logits; wider weights make them tell apart
            for pname, p in model.named_parameters():
                if pname.endswith(".bias"):
                    p.normal_(0.0, 0.5)
                else:
                    p.normal_(1.0 if p.dim() == 1 else 0.0, 0.5 if p.dim() == 1 else 0.25)
        out = os.path.join(args.outdir, name)
        shutil.rmtree(out, ignore_errors=True)
        model.save_pretrained(out)
        model = AutoModelForCausalLM.from_pretrained(out, dtype=torch.float32, attn_implementation="eager")
        model.eval()
        with torch.no_grad():
            logits = model(ids[None, :], use_cache=False).logits[0].float().numpy()
        logits.astype("<f4").tofile(os.path.join(out, "logits.bin"))
        ref = {"model": name, "versions": versions, "ids": ids.tolist(), "logits": "logits.bin",
               "shape": list(logits.shape), "max_abs_logit": float(np.abs(logits).max())}
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        write_gradients(out, ids, os.path.join(out, "grads.json"))
        if name != "falcon_sequential":  # llama.cpp's falcon graph is always the parallel block
            write_gguf(model, model.config, os.path.join(args.outdir, name + ".gguf"))
        print(f"{name}: {len(ids)} positions, max |logit| {ref['max_abs_logit']:.3f}; wrote {out}")


if __name__ == "__main__":
    main()
