#!/usr/bin/env python3
"""Random-weight models saved by transformers itself, and their logits, for the config.json layouts.

transformers 5 writes RoPE settings inside `rope_parameters` ({"rope_theta": ..., "rope_type": ...,
factors}); older versions wrote top-level `rope_theta` and `rope_scaling`. kvbench must read both
and compute the same model. This script builds two small models with non-default RoPE, saves each
with `save_pretrained` (safetensors, float32, transformers 5's layout), and writes the logits of every
position of a fixed sequence of token ids, computed by transformers (float32, eager attention):

  qwen2_theta1e6/    Qwen2ForCausalLM, rope_theta 1e6, q/k/v bias
  llama31_scaling/   LlamaForCausalLM shaped like Llama 3.1 (GQA, rope_theta 5e5, llama3 scaling with
                     original_max_position_embeddings 32 < the 96 positions used, so the scaling acts)
  qwen3_qknorm/      Qwen3ForCausalLM: per-head q/k RMSNorm before RoPE (weights drawn away from 1),
                     head_dim 32 with 4 heads over a hidden size of 64 (q_proj wider than the model,
                     as Qwen3-0.6B's), tied embeddings, rope_theta 1e6; also written as a GGUF file
                     (`qwen3_qknorm.gguf`, F32, llama.cpp's qwen3 names and keys, by the gguf package)
                     with Qwen3's chat-template ending, `chat.json`: transformers' rendering of a
                     conversation with enable_thinking=False (the empty think block kvpress renders),
                     and `grads.json`: the mean next-token loss over the ids and its gradient for every
                     weight by torch autograd in float64 (norms, largest entries, sampled entries)

Each directory holds the files save_pretrained wrote (config.json, model.safetensors,
generation_config.json), `config_legacy.json` (the same settings in the older layout: rope_theta and
rope_scaling at the top, no rope_parameters), `logits.bin` (the logits of every position,
little-endian float32, [positions, vocab] row-major) and `reference.json` (the ids, the shape, the
versions).
The script also loads each model again from the older layout with transformers and checks that the
logits are identical, so both layouts describe one model to transformers too.

    python3 tools/reference/hf_config_parity.py [--outdir tests/fixtures/hf_config]

Needs torch, transformers 5.x, safetensors, numpy. Deterministic (fixed seeds); runs in seconds.
"""
import argparse
import json
import os
import platform
import shutil
import tempfile
from importlib.metadata import version as pkg_version

import numpy as np
import torch
from transformers import AutoModelForCausalLM, LlamaConfig, Qwen2Config, Qwen3Config
from transformers.utils.chat_template_utils import render_jinja_template

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
N_TOKENS = 96
VOCAB = 128


def configs():
    common = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4,
                  num_key_value_heads=2, vocab_size=VOCAB, rms_norm_eps=1e-6, tie_word_embeddings=False,
                  bos_token_id=None, eos_token_id=None)
    qwen = Qwen2Config(max_position_embeddings=512, rope_parameters={"rope_type": "default", "rope_theta": 1e6},
                       **common)
    llama = LlamaConfig(max_position_embeddings=512, head_dim=16,
                        rope_parameters={"rope_type": "llama3", "rope_theta": 500000.0, "factor": 8.0,
                                         "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                         "original_max_position_embeddings": 32},
                        **common)
    qwen3 = Qwen3Config(max_position_embeddings=512, head_dim=32, rope_parameters={"rope_type": "default",
                                                                                   "rope_theta": 1e6},
                        **{**common, "tie_word_embeddings": True})
    return {"qwen2_theta1e6": qwen, "llama31_scaling": llama, "qwen3_qknorm": qwen3}


# The parts of Qwen3's chat template that decide the text of a plain conversation (system, user and
# assistant turns, the generation prompt and its empty think block when thinking is off).
QWEN3_TEMPLATE = """{%- for message in messages %}
{%- if message.role == "system" %}{{- '<|im_start|>system\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == "user" %}{{- '<|im_start|>user\\n' + message.content + '<|im_end|>\\n' }}
{%- elif message.role == "assistant" %}{{- '<|im_start|>assistant\\n' + message.content + '<|im_end|>\\n' }}
{%- endif %}
{%- endfor %}
{%- if add_generation_prompt %}
    {{- '<|im_start|>assistant\\n' }}
    {%- if enable_thinking is defined and enable_thinking is false %}
        {{- '<think>\\n\\n</think>\\n\\n' }}
    {%- endif %}
{%- endif %}"""


GGUF_NAMES = {"input_layernorm": "attn_norm", "post_attention_layernorm": "ffn_norm", "self_attn.q_proj": "attn_q",
              "self_attn.k_proj": "attn_k", "self_attn.v_proj": "attn_v", "self_attn.o_proj": "attn_output",
              "self_attn.q_norm": "attn_q_norm", "self_attn.k_norm": "attn_k_norm", "mlp.gate_proj": "ffn_gate",
              "mlp.up_proj": "ffn_up", "mlp.down_proj": "ffn_down"}


def gguf_name(name):
    if name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if name == "model.norm.weight":
        return "output_norm.weight"
    _, _, layer, rest = name.split(".", 3)
    return f"blk.{layer}.{GGUF_NAMES[rest.rsplit('.', 1)[0]]}.weight"


def write_gradients(model_dir, ids, path):
    """The mean next-token cross-entropy over the ids and its gradient for every weight, by torch
    autograd in float64 (kvbench computes in float32): per tensor (GGUF names; a tied output head's
    gradient is part of token_embd's) its Frobenius norm, largest |entry| and 16 sampled entries."""
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float64, attn_implementation="eager")
    model.eval()
    logits = model(ids[None, :], use_cache=False).logits[0]
    loss = torch.nn.functional.cross_entropy(logits[:-1], ids[1:])
    loss.backward()
    rng = np.random.default_rng(3)
    tensors = {}
    for name, p in model.named_parameters():
        g = p.grad.detach().numpy().reshape(-1)
        idx = sorted(rng.choice(g.size, size=min(16, g.size), replace=False).tolist())
        tensors[gguf_name(name)] = {"norm": float(np.linalg.norm(g)), "max_abs": float(np.abs(g).max()),
                                    "samples": [[i, float(g[i])] for i in idx]}
    with open(path, "w") as f:
        json.dump({"loss": loss.item(), "dtype": "float64", "ids": "reference.json", "tensors": tensors}, f, indent=1)
        f.write("\n")


def write_gguf(model, cfg, path):
    """The model as llama.cpp's converter names it for the qwen3 architecture (F32 tensors)."""
    import gguf

    w = gguf.GGUFWriter(path, "qwen3")
    w.add_block_count(cfg.num_hidden_layers)
    w.add_context_length(cfg.max_position_embeddings)
    w.add_embedding_length(cfg.hidden_size)
    w.add_feed_forward_length(cfg.intermediate_size)
    w.add_head_count(cfg.num_attention_heads)
    w.add_head_count_kv(cfg.num_key_value_heads)
    w.add_key_length(cfg.head_dim)
    w.add_value_length(cfg.head_dim)
    w.add_rope_freq_base(cfg.rope_parameters["rope_theta"])
    w.add_layer_norm_rms_eps(cfg.rms_norm_eps)
    w.add_vocab_size(cfg.vocab_size)
    w.add_chat_template(QWEN3_TEMPLATE)
    for name, t in model.state_dict().items():
        if name != "lm_head.weight":  # tied
            w.add_tensor(gguf_name(name), t.detach().float().numpy())
    w.write_header_to_file()
    w.write_kv_data_to_file()
    w.write_tensors_to_file()
    w.close()


def legacy_layout(cfg: dict) -> dict:
    """The same settings as transformers 4 wrote them: rope_theta and rope_scaling at the top."""
    out = {k: v for k, v in cfg.items() if k != "rope_parameters"}
    rp = dict(cfg["rope_parameters"])
    out["rope_theta"] = rp.pop("rope_theta")
    out["rope_scaling"] = None if rp.get("rope_type") == "default" else rp
    return out


def logits_of(model_dir: str, ids: torch.Tensor) -> np.ndarray:
    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32, attn_implementation="eager")
    model.eval()
    with torch.no_grad():
        return model(ids[None, :], use_cache=False).logits[0].float().numpy()


def main():
    ap = argparse.ArgumentParser()
    ap.add_argument("--outdir", default=os.path.join(REPO_ROOT, "tests", "fixtures", "hf_config"))
    args = ap.parse_args()
    torch.set_num_threads(2)
    versions = {"python": platform.python_version(), "torch": torch.__version__,
                "transformers": pkg_version("transformers"), "safetensors": pkg_version("safetensors"),
                "numpy": np.__version__}
    ids = torch.tensor(np.random.default_rng(7).integers(0, VOCAB, N_TOKENS), dtype=torch.long)
    for i, (name, cfg) in enumerate(configs().items()):
        torch.manual_seed(11 + i)
        model = AutoModelForCausalLM.from_config(cfg, dtype=torch.float32)
        with torch.no_grad():  # init_std 0.02 gives near-uniform logits; wider weights make them tell apart
            for p in model.parameters():
                p.normal_(0.0, 0.25 if p.dim() > 1 else 1.0)
        out = os.path.join(args.outdir, name)
        shutil.rmtree(out, ignore_errors=True)
        model.save_pretrained(out)
        saved = json.load(open(os.path.join(out, "config.json")))
        assert "rope_parameters" in saved and "rope_theta" not in saved and "rope_scaling" not in saved, saved
        with open(os.path.join(out, "config_legacy.json"), "w") as f:
            json.dump(legacy_layout(saved), f, indent=2, sort_keys=True)
            f.write("\n")
        logits = logits_of(out, ids)
        with tempfile.TemporaryDirectory() as tmp:  # transformers reads the older layout as the same model
            for f in os.listdir(out):
                shutil.copy(os.path.join(out, f), tmp)
            shutil.copy(os.path.join(out, "config_legacy.json"), os.path.join(tmp, "config.json"))
            legacy = logits_of(tmp, ids)
        assert np.array_equal(logits, legacy), f"{name}: transformers reads the two layouts differently"
        logits.astype("<f4").tofile(os.path.join(out, "logits.bin"))
        ref = {"model": name, "versions": versions, "ids": ids.tolist(), "logits": "logits.bin",
               "shape": list(logits.shape), "max_abs_logit": float(np.abs(logits).max())}
        with open(os.path.join(out, "reference.json"), "w") as f:
            json.dump(ref, f, indent=1)
            f.write("\n")
        if name == "qwen3_qknorm":
            write_gguf(model, cfg, os.path.join(args.outdir, name + ".gguf"))
            write_gradients(out, ids, os.path.join(out, "grads.json"))
            with open(os.path.join(out, "chat_template.jinja"), "w") as f:
                f.write(QWEN3_TEMPLATE)
            conversations = {"user": [{"role": "user", "content": "What is 2+2?"}],
                             "system_user": [{"role": "system", "content": "Be brief."},
                                             {"role": "user", "content": "Name a colour."}]}
            chat = {k: render_jinja_template([v], chat_template=QWEN3_TEMPLATE, add_generation_prompt=True,
                                             enable_thinking=False)[0][0] for k, v in conversations.items()}
            with open(os.path.join(out, "chat.json"), "w") as f:
                json.dump({"enable_thinking": False, "conversations": conversations, "rendered": chat}, f, indent=1)
                f.write("\n")
        print(f"{name}: {len(ids)} positions, max |logit| {ref['max_abs_logit']:.3f}, layouts agree; wrote {out}")


if __name__ == "__main__":
    main()
