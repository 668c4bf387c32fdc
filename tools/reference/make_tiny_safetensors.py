#!/usr/bin/env python3
"""A tiny Hugging Face style model directory written by the `safetensors` package, sharded in two.

It checks that kvbench reads files as the reference library writes them (header layout, padding,
dtype names, shard index). The weights are random; the values kvbench must read back are stored in
expected.json as float32 bit patterns, indexed in ggml order (the reversed shape, first index fastest,
which for a row-major tensor is just its flat order).

    python3 tools/reference/make_tiny_safetensors.py
"""
import json
import pathlib

import numpy as np
import torch
from safetensors.torch import save_file

OUT = pathlib.Path(__file__).resolve().parents[2] / "tests/fixtures/safetensors/tiny_llama"


def main():
    OUT.mkdir(parents=True, exist_ok=True)
    g = torch.Generator().manual_seed(5)
    hidden, heads, kv_heads, head_dim, inter, vocab, layers = 16, 4, 2, 4, 24, 32, 2
    dtypes = {"F32": torch.float32, "F16": torch.float16, "BF16": torch.bfloat16}
    shapes = {"model.embed_tokens.weight": (vocab, hidden), "model.norm.weight": (hidden,),
              "lm_head.weight": (vocab, hidden)}
    for l in range(layers):
        p = f"model.layers.{l}."
        shapes.update({
            p + "input_layernorm.weight": (hidden,), p + "post_attention_layernorm.weight": (hidden,),
            p + "self_attn.q_proj.weight": (heads * head_dim, hidden),
            p + "self_attn.k_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.v_proj.weight": (kv_heads * head_dim, hidden),
            p + "self_attn.o_proj.weight": (hidden, heads * head_dim),
            p + "mlp.gate_proj.weight": (inter, hidden), p + "mlp.up_proj.weight": (inter, hidden),
            p + "mlp.down_proj.weight": (hidden, inter)})
    names = list(shapes)
    tensors, expected = {}, {}
    for i, name in enumerate(names):
        dt = list(dtypes)[i % 3]
        t = torch.randn(shapes[name], generator=g).to(dtypes[dt])
        tensors[name] = t
        expected[name] = {"dtype": dt, "shape": list(shapes[name]),
                          "bits": [int(x) for x in t.float().numpy().reshape(-1).view(np.uint32)]}
    half = len(names) // 2
    shards = {"model-00001-of-00002.safetensors": names[:half],
              "model-00002-of-00002.safetensors": names[half:]}
    weight_map = {}
    for file, keys in shards.items():
        save_file({k: tensors[k] for k in keys}, str(OUT / file), metadata={"format": "pt"})
        weight_map.update({k: file for k in keys})
    (OUT / "model.safetensors.index.json").write_text(json.dumps({"metadata": {}, "weight_map": weight_map}, indent=1))
    config = {"architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_size": hidden,
              "intermediate_size": inter, "num_hidden_layers": layers, "num_attention_heads": heads,
              "num_key_value_heads": kv_heads, "vocab_size": vocab, "max_position_embeddings": 256,
              "rms_norm_eps": 1e-5, "rope_theta": 500000.0, "tie_word_embeddings": False,
              "rope_scaling": {"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0,
                               "high_freq_factor": 4.0, "original_max_position_embeddings": 128}}
    (OUT / "config.json").write_text(json.dumps(config, indent=1))
    (OUT / "expected.json").write_text(json.dumps(expected))
    print("wrote", OUT)


if __name__ == "__main__":
    main()
