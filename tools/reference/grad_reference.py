#!/usr/bin/env python3
"""Reference gradients of the next-token loss of SmolLM2-135M-Instruct (Q4_1 GGUF), by torch autograd.

Reference: Hugging Face transformers' LlamaForCausalLM loaded from the GGUF file itself
(from_pretrained(dir, gguf_file=...)): the loader dequantizes every tensor to float32 with gguf-py,
so the reference sees exactly the weights kvbench reads, and torch autograd gives the gradients.

Settings: dtype=torch.float32 (float64 with --float64, below), attn_implementation="eager",
model.eval() (no dropout), torch.set_num_threads(2) (--threads), use_cache=False. No BOS is
added: the ids are used as given.
Loss: L = mean over t = 0..n-2 of cross_entropy(logits[t], ids[t+1]), in float32 (float64)
(torch.nn.functional.cross_entropy, reduction="mean"); n_targets = n - 1. One backward gives the
gradient of every parameter.

Layout of the gradients: GGUF naming and layout. A GGUF matrix with ne = [cols, rows] is a numpy
array of shape (rows, cols), the same as nn.Linear's weight [out, in]; flat index = row*cols + col.
  token_embd.weight          <- model.embed_tokens.weight (tied: lm_head.weight is the same tensor,
                                so its gradient is the sum of the embedding and the head parts)
  output_norm.weight         <- model.norm.weight
  blk.L.attn_norm.weight     <- layers.L.input_layernorm.weight
  blk.L.ffn_norm.weight      <- layers.L.post_attention_layernorm.weight
  blk.L.attn_q/k/v.weight    <- layers.L.self_attn.q_proj/k_proj/v_proj.weight (q, k: rows permuted)
  blk.L.attn_output.weight   <- layers.L.self_attn.o_proj.weight
  blk.L.ffn_gate/up/down.weight <- layers.L.mlp.gate_proj/up_proj/down_proj.weight
Q/K rows: llama.cpp's converter permutes the rows of q and k so that each RoPE pair is adjacent
(2i, 2i+1); HF uses rotate_half pairs (i, i + d/2), and transformers' GGUF loader undoes the
permutation when it loads attn_q / attn_k. With head dim d = 64, head h, i < d/2, j in {0, 1}:
    GGUF row h*d + 2*i + j  ==  HF row h*d + j*(d/2) + i
over n_heads = 9 heads for attn_q and n_kv_heads = 3 heads for attn_k. In numpy:
    gguf = hf.reshape(nh, 2, d//2, cols).swapaxes(1, 2).reshape(rows, cols).
The script asserts that every HF weight, mapped this way, equals the dequantized GGUF tensor
(gguf.GGUFReader + gguf.quants.dequantize) bit for bit, that the raw q/k weights do not (so the
check can tell the orders apart), and that the head really is tied to the embedding.

Modes (any combination; --make-ids runs alone):
  --make-ids --n N --ids FILE
      Deterministic token ids for the tests: the fixed English prose below (no digits, no
      whitespace runs, ASCII only), paragraphs joined by "\\n\\n", tokenized with transformers'
      GGUF tokenizer (add_special_tokens=False), the whole text repeated (joined by "\\n\\n")
      until it has at least N tokens, then cut to exactly N. The ids are checked against the
      reference SmolLM2 tokenizer (b) of tokenize_reference.py; they agree.
  --fixture OUT.json
      Golden file for a C++ test: model sha256, versions, settings, the ids, n_targets, loss,
      the largest |gradient| of the model (tensor, flat index, value), the model's total
      Frobenius norm, and for every tensor in GGUF file order: name, ne, shape, frobenius norm
      (float64 sum of squares, then sqrt), max_abs, argmax [flat, value] (the first
      largest-magnitude entry), 24 samples [[flat, value], ...] at sorted distinct indices from
      numpy.random.default_rng(zlib.crc32(b"kvbench-grad:" + name)).choice(n, 24, replace=False).
      Timings go to stdout only, so two runs give the same bytes.
  --kvbench DIR
      Compares gradients written by kvbench: DIR/meta.json {"loss", "ids", "n_targets",
      "tensors": [names]} and DIR/<name>.npy (float32, (rows, cols) or (n,)). --ids may be
      left out; the ids of meta.json are used then. Per tensor: max|g_kvbench - g_torch|
      divided by the model's largest |g_torch| (rel_global) and by the tensor's own (rel_tensor),
      and ||diff||_F / ||g_torch||_F (rel_fro); the loss difference. A table goes to stdout and,
      with --summary, to OUT.json. For attn_q/attn_k with a large error, the error of the HF
      (un-permuted) row order is shown too, to spot a layout mix-up.
  --dump DIR
      Writes torch's own gradients in the kvbench format above (all 272 tensors), e.g. to test
      --kvbench or to look at full gradients (float64 .npy and "dtype": "float64" in meta.json
      with --float64).
  --float64 [--checkpointing] [--exact-rope]
      Loads and checks the model as above (float32, bit-exact GGUF weights), then converts it to
      float64 (the weights keep exactly the dequantized values; checked) and computes the logits,
      the loss and every gradient in float64: a ground truth for the float32 results. transformers
      rounds to float32 in three places whatever the dtype (LlamaRMSNorm, the eager softmax, the
      rotary cos/sin); in this mode they are replaced by float64 versions of the same formulas, and
      forward hooks assert that every floating tensor of the forward is float64. RoPE angles stay
      the float32 product float32(position) x inv_freq[i] (float32 inv_freq = 1/theta^(2i/d)), which
      is how transformers and kvbench both define them; cos/sin are then taken in float64.
      --exact-rope computes inv_freq and the angle in float64 instead (at 256 tokens this moves
      the float32 errors below by under 2%). --checkpointing recomputes each layer in the backward
      (transformers' activation checkpointing, use_reentrant=False; the model is put in train()
      mode for it, which changes nothing here: no dropout, checked); the gradients are bit for bit
      the same as without it (checked at 256 tokens). Memory, max RSS: 256 tokens 4.8 GiB
      (3.2 GiB float32); 2048 tokens float32 11.2 GiB, float64 with --checkpointing 8.0 GiB
      (without it, about 26 GiB by the estimate). The script prints a rough peak estimate and
      stops, before the forward, when it exceeds MemAvailable. With --fixture the fixture holds
      the float64 values.
  --kvbench DIR --float64 --torch32 DIR2
      Both float32 results against the float64 gradients: kvbench's (DIR) and torch's own float32
      ones (DIR2, written by --dump without --float64, same ids). Per tensor and for each of the
      two: max|g - g_f64| (and its flat index), divided by the model's largest |g_f64|
      (rel_global), by the tensor's own largest (rel_tensor), and ||g - g_f64||_F / ||g_f64||_F
      (rel_fro); also max|g_kvbench - g_torch32| / max|g_f64| and the ratio of the two
      rel_globals. Overall: the largest rel_global and rel_tensor of each (and the tensors), the
      model-wide relative Frobenius error, the three losses. stdout gets the 15 tensors with the
      largest kvbench rel_global and the overall lines; --summary OUT.json gets all of it (every
      tensor), with the settings, timings and versions. Without --torch32, --kvbench --float64
      is the plain --kvbench comparison against the float64 gradients.
Every float32 value is written as the shortest float64 repr, so it reads back bit-exactly as
float32; float64 values (norms, loss_f64) as their own shortest repr. ASCII JSON.

Usage (from the repo root; needs torch, transformers 5.x, accelerate, gguf, numpy, tokenizers):
    python3 tools/reference/grad_reference.py --make-ids --n 256 \\
        --ids tests/fixtures/engine/grad_ids_256.json
    python3 tools/reference/grad_reference.py --ids tests/fixtures/engine/grad_ids_256.json \\
        --float64 --fixture tests/fixtures/engine/grad_reference_256_f64.json
    python3 tools/reference/grad_reference.py --kvbench DIR [--ids FILE] [--summary OUT.json]
    python3 tools/reference/grad_reference.py --ids IDS.json --dump /tmp/gradtorch
    python3 tools/reference/grad_reference.py --ids IDS.json --kvbench DIR --float64 \\
        --torch32 /tmp/gradtorch [--checkpointing] --summary OUT.json
  --gguf defaults to models/SmolLM2-135M-Instruct.Q4_1.gguf. --threads defaults to 2.
"""

import argparse
import glob
import json
import os
import platform
import resource
import sys
import time
import zlib
from importlib.metadata import version as pkg_version

import numpy as np

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))
from hf_logits import f32, sha256_file  # noqa: E402  (the same model hash and float32 writing)

N_SAMPLES = 24
SAMPLE_SEED_PREFIX = b"kvbench-grad:"

# --------------------------------------------------------------------------------------
# Fixed prose for --make-ids. Plain ASCII English, no digits, single spaces, paragraphs
# joined by a blank line, so transformers' GGUF tokenizer and the reference tokenizer agree.
# --------------------------------------------------------------------------------------

PROSE = [
    "The harbour town woke slowly on winter mornings. Before the sun rose over the grey water, "
    "the bakers had already lit their ovens, and the smell of warm bread drifted down the narrow "
    "streets toward the docks. Fishermen checked their nets by lantern light, talking quietly "
    "about the weather and the price of salt. Nobody hurried, because the tide would not turn "
    "for another hour, and the boats could not leave before it did.",

    "At the top of the hill stood an old stone library with a copper roof that had turned green "
    "long ago. The librarian, a patient woman who had lived in the town all her life, opened the "
    "heavy doors at the same time every day. She kept a small notebook on her desk in which she "
    "wrote the name of every visitor and the title of every book they asked for. Over the years "
    "the notebook had become a kind of history of the town, recording which families read poetry, "
    "which children loved maps, and which sailors borrowed books about distant islands before a "
    "long voyage.",

    "In the spring the river that ran through the valley grew wide and fast with melted snow. "
    "Farmers moved their sheep to higher fields, and the miller watched the water rise against "
    "the wooden wheel of his mill. Some years the river flooded the lower meadows, leaving behind "
    "a thin layer of dark soil that made the summer grass grow thick and sweet. The older people "
    "said that a flood was both a curse and a gift, and that a wise farmer learned to wait for the "
    "second half of that saying.",

    "Learning a new language is a little like exploring a city without a map. At first every "
    "street looks the same, and the signs seem to point in every direction at once. Slowly, the "
    "traveller begins to recognise a corner, a fountain, a familiar shop window. Words that once "
    "sounded like noise begin to carry meaning, and sentences that were walls become doors. The "
    "moment when a joke in the new language finally makes sense is one of the quiet pleasures of "
    "a patient mind.",

    "A good clock is a strange machine. It has no idea what time it is, yet it tells everyone "
    "else. Inside the case, a spring slowly gives up the energy that was wound into it, and a "
    "small wheel rocks back and forth, letting the gears move forward one tooth at a time. The "
    "clockmaker who repaired the tower clock in the market square liked to say that his work was "
    "not really about time at all. It was about patience, about small movements repeated without "
    "complaint until they added up to something that a whole town could trust.",

    "When the first railway line reached the valley, people walked for hours just to watch the "
    "train arrive. Children climbed onto walls and fences to see the engine breathe out clouds of "
    "white steam. Merchants soon discovered that they could send cheese and wool to the city in a "
    "single day, and the city sent back newspapers, letters, and strangers with new ideas. Within "
    "a generation the town had changed more than it had in the previous century, and yet the "
    "market still opened on the same morning of the week, and the bells still rang at noon.",

    "Science often begins with a simple question asked carefully. Why does bread rise? Why do "
    "some stones float on water while others sink? Why do birds leave in autumn and return in "
    "spring? Each answer leads to another question, and the chain of questions can stretch across "
    "many lifetimes. What matters is not knowing everything but learning how to test an idea, how "
    "to admit a mistake, and how to share what was found so that others can build on it.",

    "On summer evenings the whole village gathered on the green to listen to music. Someone "
    "always brought a fiddle, someone else an old accordion, and the children danced in circles "
    "until they fell over laughing. As the light faded, lanterns were hung from the branches of "
    "the great oak tree, and the older people told stories about storms, shipwrecks, and lost "
    "treasure. Most of the stories were not true, but everyone agreed that they were better that "
    "way.",
]


def prose_text():
    return "\n\n".join(PROSE)


# --------------------------------------------------------------------------------------


def python_docs_texts():
    """Set-up's data/python-docs, the files sorted by name: the text calibration references draw windows from."""
    files = sorted(glob.glob(os.path.join(REPO_ROOT, "data", "python-docs", "*.txt")))
    assert files, "data/python-docs is missing (scripts/setup.sh fetches it)"
    texts = []
    for f in files:
        with open(f, encoding="utf-8") as fh:
            texts.append(fh.read())
    return texts


def gguf_tokenizer(gguf_path):
    """transformers' tokenizer of a GGUF file."""
    from transformers import AutoTokenizer
    gdir, gname = os.path.split(os.path.abspath(gguf_path))
    return AutoTokenizer.from_pretrained(gdir, gguf_file=gname)


def write_json(path, doc):
    d = os.path.dirname(os.path.abspath(path))
    os.makedirs(d, exist_ok=True)
    with open(path + ".tmp", "w", encoding="ascii", newline="\n") as f:
        json.dump(doc, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")
    os.replace(path + ".tmp", path)


def versions():
    v = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "accelerate", "tokenizers", "gguf", "numpy"):
        try:
            v[pkg] = pkg_version(pkg)
        except Exception:
            v[pkg] = None
    return v


# ---- GGUF <-> HF mapping ----------------------------------------------------------------

LAYER_MAP = {
    "input_layernorm.weight": "attn_norm.weight",
    "post_attention_layernorm.weight": "ffn_norm.weight",
    "self_attn.q_proj.weight": "attn_q.weight",
    "self_attn.k_proj.weight": "attn_k.weight",
    "self_attn.v_proj.weight": "attn_v.weight",
    "self_attn.o_proj.weight": "attn_output.weight",
    "mlp.gate_proj.weight": "ffn_gate.weight",
    "mlp.up_proj.weight": "ffn_up.weight",
    "mlp.down_proj.weight": "ffn_down.weight",
}


def gguf_name(hf_name):
    if hf_name == "model.embed_tokens.weight":
        return "token_embd.weight"
    if hf_name == "model.norm.weight":
        return "output_norm.weight"
    pre = "model.layers."
    if hf_name.startswith(pre):
        layer, rest = hf_name[len(pre):].split(".", 1)
        if rest in LAYER_MAP:
            return "blk.%d.%s" % (int(layer), LAYER_MAP[rest])
    raise KeyError("no GGUF name for HF parameter %r" % hf_name)


def hf_rows_to_gguf(a, n_head):
    """Rows of an HF q_proj/k_proj weight (or its gradient) in llama.cpp's GGUF order:
    GGUF row h*d + 2i + j = HF row h*d + j*(d/2) + i."""
    rows = a.shape[0]
    d = rows // n_head
    assert d * n_head == rows and d % 2 == 0
    return np.ascontiguousarray(a.reshape(n_head, 2, d // 2, *a.shape[1:]).swapaxes(1, 2)
                                .reshape(a.shape))


def gguf_rows_to_hf(a, n_head):
    """The inverse (what transformers' GGUF loader does)."""
    rows = a.shape[0]
    d = rows // n_head
    return np.ascontiguousarray(a.reshape(n_head, d // 2, 2, *a.shape[1:]).swapaxes(1, 2)
                                .reshape(a.shape))


def q_k_heads(name, cfg):
    if name.endswith(".attn_q.weight"):
        return cfg.num_attention_heads
    if name.endswith(".attn_k.weight"):
        return cfg.num_key_value_heads
    return None


def to_gguf_layout(name, a, cfg):
    nh = q_k_heads(name, cfg)
    return hf_rows_to_gguf(a, nh) if nh is not None else a


def read_gguf_tensors(path):
    """{name: (ne list, dequantized float32 array of shape reversed(ne))} in file order."""
    import gguf
    reader = gguf.GGUFReader(path)
    out = {}
    for t in reader.tensors:
        ne = [int(x) for x in t.shape]
        arr = gguf.quants.dequantize(t.data, t.tensor_type)
        arr = np.asarray(arr, dtype=np.float32).reshape(tuple(reversed(ne)))
        out[t.name] = (ne, arr, t.tensor_type.name)
    return out


# ---- model, loss, gradients ------------------------------------------------------------


def load_model(gguf_path, threads):
    import torch
    from transformers import AutoModelForCausalLM
    torch.set_num_threads(threads)
    torch.manual_seed(0)
    gdir, gname = os.path.split(os.path.abspath(gguf_path))
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    return model


def check_model(model, gg):
    """Tying, parameter coverage and exact weight equality with the GGUF (Q/K permuted back).
    Returns {gguf_name: hf_parameter_name}."""
    cfg = model.config
    emb = model.model.embed_tokens.weight
    head = model.lm_head.weight
    assert cfg.tie_word_embeddings, "config does not tie the embeddings"
    assert head is emb or head.data_ptr() == emb.data_ptr(), "lm_head is not tied to embed_tokens"
    assert "output.weight" not in gg
    names = {}
    for hf_name, p in model.named_parameters():  # tied lm_head.weight is listed once
        if hf_name == "lm_head.weight":
            raise AssertionError("lm_head.weight listed separately: not tied")
        g = gguf_name(hf_name)
        assert g not in names, g
        names[g] = hf_name
    assert set(names) == set(gg), (sorted(set(names) ^ set(gg)))[:10]
    params = dict(model.named_parameters())
    n_qk_differs = 0
    for g, hf_name in names.items():
        w = params[hf_name].detach().numpy()
        ref = gg[g][1]
        mapped = to_gguf_layout(g, w, cfg)
        assert mapped.shape == ref.shape, (g, mapped.shape, ref.shape)
        assert np.array_equal(mapped.view(np.uint32), ref.view(np.uint32)), \
            "HF weight %s != dequantized GGUF %s" % (hf_name, g)
        if q_k_heads(g, cfg) is not None:
            # The raw HF order must differ, or the check above cannot tell the orders apart.
            assert not np.array_equal(w, ref), g
            n_qk_differs += 1
    assert n_qk_differs == 2 * cfg.num_hidden_layers
    return names


def forward_backward(model, ids, dtype=None):
    """Loss and one backward. dtype: the expected dtype of the logits and the loss (float32 by
    default, float64 after to_float64)."""
    import torch
    import torch.nn.functional as F
    dtype = dtype or torch.float32
    x = torch.tensor([ids], dtype=torch.long)
    model.zero_grad(set_to_none=True)
    t0 = time.perf_counter()
    logits = model(input_ids=x, use_cache=False).logits[0]
    assert logits.dtype == dtype, (logits.dtype, dtype)
    y = x[0, 1:]
    loss = F.cross_entropy(logits[:-1], y, reduction="mean")
    assert loss.dtype == dtype
    t1 = time.perf_counter()
    loss.backward()
    t2 = time.perf_counter()
    with torch.no_grad():
        lp = torch.log_softmax(logits[:-1].double(), dim=-1)
        loss64 = float(-lp.gather(1, y[:, None]).mean())
    del logits, lp
    return float(loss.detach()), loss64, t1 - t0, t2 - t1


# ---- float64 reference (--float64) -------------------------------------------------------
# transformers' Llama computes three things in float32 whatever the model dtype: LlamaRMSNorm
# (hidden_states.to(torch.float32)), the eager attention softmax (softmax(..., dtype=torch.float32))
# and the rotary cos/sin (position.float() * inv_freq.float(), cos/sin in float32). A plain
# model.to(torch.float64) would therefore still round there. to_float64 replaces these three with
# versions that keep float64 (the same formulas otherwise), and checks with forward hooks and call
# counters that every floating tensor of the forward is float64.

F64_CALLS = {"rmsnorm": 0, "attention": 0, "rotary": 0}


def install_float64_patches(exact_rope):
    import torch
    from torch import nn
    from transformers.models.llama import modeling_llama as ml

    def rmsnorm_forward(self, hidden_states):
        F64_CALLS["rmsnorm"] += 1
        assert hidden_states.dtype == torch.float64, hidden_states.dtype
        variance = hidden_states.pow(2).mean(-1, keepdim=True)
        hidden_states = hidden_states * torch.rsqrt(variance + self.variance_epsilon)
        return self.weight * hidden_states

    def eager_attention_forward(module, query, key, value, attention_mask, scaling, dropout=0.0,
                                **kwargs):
        F64_CALLS["attention"] += 1
        assert query.dtype == key.dtype == value.dtype == torch.float64
        key_states = ml.repeat_kv(key, module.num_key_value_groups)
        value_states = ml.repeat_kv(value, module.num_key_value_groups)
        attn_weights = torch.matmul(query, key_states.transpose(2, 3)) * scaling
        if attention_mask is not None:
            assert attention_mask.dtype in (torch.float64, torch.bool), attention_mask.dtype
            if attention_mask.dtype == torch.bool:
                attn_weights = attn_weights.masked_fill(~attention_mask, float("-inf"))
            else:
                attn_weights = attn_weights + attention_mask
        attn_weights = nn.functional.softmax(attn_weights, dim=-1)  # float64 in, float64 out
        assert dropout == 0.0
        attn_output = torch.matmul(attn_weights, value_states)
        attn_output = attn_output.transpose(1, 2).contiguous()
        return attn_output, attn_weights

    def rotary_forward(self, x, position_ids):
        F64_CALLS["rotary"] += 1
        assert x.dtype == torch.float64
        if exact_rope:
            # angle = position x inv_freq with inv_freq = 1 / theta^(2i/d), both in float64
            freqs = position_ids[..., None].to(torch.float64) * self.inv_freq_f64.to(x.device)
        else:
            # the model's definition in transformers and kvbench alike: the float32 product of the
            # float32 position and the float32 inv_freq; only cos/sin are taken in float64
            freqs = (position_ids[..., None].float() * self.inv_freq.float()).to(torch.float64)
        emb = torch.cat((freqs, freqs), dim=-1)
        return emb.cos() * self.attention_scaling, emb.sin() * self.attention_scaling

    ml.LlamaRMSNorm.forward = rmsnorm_forward
    ml.eager_attention_forward = eager_attention_forward
    ml.LlamaRotaryEmbedding.forward = rotary_forward


def to_float64(model, gg, names, exact_rope, checkpointing):
    """Converts the (checked, float32) model to float64 in place and installs the float64 patches.
    The float64 weights are the float32 ones exactly (checked against the GGUF again)."""
    import torch
    from transformers.models.llama import modeling_llama as ml
    cfg = model.config
    rot = model.model.rotary_emb
    assert rot.rope_type == "default" and rot.attention_scaling == 1.0, (rot.rope_type,)
    assert cfg._attn_implementation == "eager", cfg._attn_implementation
    inv32 = rot.inv_freq.detach().clone()
    assert inv32.dtype == torch.float32
    model.to(torch.float64)
    base = float(cfg.rope_parameters["rope_theta"])
    d = rot.inv_freq.numel() * 2
    rot.inv_freq_f64 = 1.0 / (base ** (torch.arange(0, d, 2, dtype=torch.float64) / d))
    # keep the float32 inv_freq bit for bit (model.to cast the buffer; the values are unchanged)
    assert torch.equal(rot.inv_freq.float(), inv32)
    rot.inv_freq = inv32
    install_float64_patches(exact_rope)
    assert model.lm_head.weight is model.model.embed_tokens.weight \
        or model.lm_head.weight.data_ptr() == model.model.embed_tokens.weight.data_ptr()
    params = dict(model.named_parameters())
    for g, hf_name in names.items():
        w = params[hf_name].detach()
        assert w.dtype == torch.float64, hf_name
        mapped = to_gguf_layout(g, w.numpy(), cfg)
        assert np.array_equal(mapped, gg[g][1].astype(np.float64)), g

    def check_out(mod, inp, out):
        stack = [out]
        while stack:
            o = stack.pop()
            if isinstance(o, torch.Tensor):
                assert not o.is_floating_point() or o.dtype == torch.float64, \
                    (type(mod).__name__, o.dtype)
            elif isinstance(o, (tuple, list)):
                stack.extend(o)
            elif isinstance(o, dict):
                stack.extend(o.values())
    for m in model.modules():
        m.register_forward_hook(check_out)

    if checkpointing:
        # transformers checkpoints a layer only in training mode; this model has no dropout, so
        # train() changes nothing else (checked).
        assert float(getattr(cfg, "attention_dropout", 0.0)) == 0.0
        assert not any(isinstance(m, torch.nn.Dropout) and m.p > 0 for m in model.modules())
        if hasattr(model, "activation_checkpointing_enable"):
            model.activation_checkpointing_enable({"use_reentrant": False})
        else:
            model.gradient_checkpointing_enable(gradient_checkpointing_kwargs={"use_reentrant": False})
        model.train()


def frozen_float64_model(gguf_path, threads):
    """The method references' model: loaded from the GGUF, checked against its tensors, converted to
    float64 (float32 RoPE angles) and frozen. Returns (model, gguf tensors, the file's sha256)."""
    from hf_logits import sha256_file
    model_sha = sha256_file(gguf_path)
    gg = read_gguf_tensors(gguf_path)
    model = load_model(gguf_path, threads)
    names = check_model(model, gg)
    to_float64(model, gg, names, exact_rope=False, checkpointing=False)
    for p in model.parameters():
        p.requires_grad_(False)
    return model, gg, model_sha


def method_reference_args(description, fixture):
    """The command line the method references share: the model, the ids and how many, the fixture."""
    ap = argparse.ArgumentParser(description=description)
    ap.add_argument("--gguf", default=os.path.join(REPO_ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ids", default=os.path.join(REPO_ROOT, "tests/fixtures/engine/grad_ids_256.json"))
    ap.add_argument("--n", type=int, default=128, help="use the first N ids")
    ap.add_argument("--fixture", default=os.path.join(REPO_ROOT, fixture))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()
    with open(args.ids, encoding="utf-8") as f:
        ids = [int(i) for i in json.load(f)][:args.n]
    assert len(ids) == args.n >= 2
    return args, ids


def check_float64_calls(cfg, checkpointing):
    """Every RMSNorm, attention and rotary call of the last forward (and recompute) went through
    the float64 versions."""
    L = cfg.num_hidden_layers
    k = 2 if checkpointing else 1  # checkpointing recomputes every layer in the backward
    want = {"rmsnorm": k * 2 * L + 1, "attention": k * L, "rotary": 1}
    assert F64_CALLS == want, (F64_CALLS, want)


def estimate_peak_bytes(cfg, n_params, n, itemsize, checkpointing):
    """A rough estimate of this script's peak memory (eager attention keeps one [heads, n, n]
    probability tensor per layer; plus transients, parameters, gradients, the dequantized GGUF
    copy and about 0.6 GiB for the runtime). Observed max RSS at 256 tokens: float32 3.2 GiB,
    float64 4.8 GiB, float64 with --checkpointing 4.2 GiB."""
    h, inter, L = cfg.hidden_size, cfg.intermediate_size, cfg.num_hidden_layers
    hq, v = cfg.num_attention_heads, cfg.vocab_size
    per_layer = hq * n * n + n * (16 * h + 6 * inter)
    kept_layers = 1 if checkpointing else L
    acts = kept_layers * per_layer + L * n * h + 3 * hq * n * n
    logits = 5 * n * v
    return itemsize * (3 * n_params + acts + logits) + 4 * n_params + int(0.6 * 2**30)


def mem_available_bytes():
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except OSError:
        pass
    return None


def gradients_gguf(model, names):
    cfg = model.config
    params = dict(model.named_parameters())
    out = {}
    for g, hf_name in names.items():
        gr = params[hf_name].grad
        assert gr is not None, hf_name
        a = gr.detach().numpy()
        assert a.dtype in (np.float32, np.float64) and a.dtype == params[hf_name].detach().numpy().dtype
        out[g] = to_gguf_layout(g, a, cfg)
        assert np.all(np.isfinite(out[g])), g
    return out


# ---- outputs -----------------------------------------------------------------------------


def tensor_entry(name, ne, g, value=None):
    value = value or f32
    flat = g.reshape(-1)
    n = flat.size
    rng = np.random.default_rng(zlib.crc32(SAMPLE_SEED_PREFIX + name.encode("ascii")))
    idx = np.sort(rng.choice(n, size=N_SAMPLES, replace=False))
    am = int(np.argmax(np.abs(flat)))
    return {
        "name": name,
        "ne": ne,
        "shape": list(g.shape),
        "frobenius": float(np.sqrt(np.sum(np.square(flat.astype(np.float64))))),
        "max_abs": value(abs(flat[am])),
        "argmax": [am, value(flat[am])],
        "samples": [[int(i), value(flat[i])] for i in idx],
    }


def global_max(grads):
    best = None
    for name, g in grads.items():
        flat = g.reshape(-1)
        i = int(np.argmax(np.abs(flat)))
        v = abs(float(flat[i]))
        if best is None or v > best[2]:
            best = (name, i, v, float(flat[i]))
    return best


def compare_kvbench(kdir, grads, loss, ids, cfg):
    with open(os.path.join(kdir, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    problems = []
    if list(meta.get("ids", ids)) != list(ids):
        problems.append("meta.json ids differ from the ids used")
    if int(meta.get("n_targets", len(ids) - 1)) != len(ids) - 1:
        problems.append("n_targets %s != %d" % (meta.get("n_targets"), len(ids) - 1))
    gname, gidx, gmax, _ = global_max(grads)
    rows = []
    for name in meta["tensors"]:
        if name not in grads:
            problems.append("unknown tensor %s" % name)
            continue
        ref = grads[name]
        k = np.load(os.path.join(kdir, name + ".npy"))
        row = {"name": name, "shape": list(ref.shape)}
        if k.shape != ref.shape:
            row["error"] = "shape %s, expected %s%s" % (
                list(k.shape), list(ref.shape),
                " (transposed?)" if k.shape == ref.shape[::-1] else "")
            problems.append("%s: %s" % (name, row["error"]))
            rows.append(row)
            continue
        k = k.astype(np.float32, copy=False)
        diff = np.abs(k.astype(np.float64) - ref.astype(np.float64))
        tmax = float(np.max(np.abs(ref)))
        fro = float(np.sqrt(np.sum(np.square(ref.astype(np.float64)))))
        md = float(np.max(diff))
        row.update({
            "max_abs_torch": tmax,
            "max_abs_diff": md,
            "rel_global": md / gmax,
            "rel_tensor": md / tmax if tmax > 0 else (0.0 if md == 0 else float("inf")),
            "rel_fro": float(np.sqrt(np.sum(np.square(diff)))) / fro if fro > 0 else None,
            "nonfinite": int(np.size(k) - np.count_nonzero(np.isfinite(k))),
        })
        nh = q_k_heads(name, cfg)
        if nh is not None and row["rel_tensor"] > 1e-2:
            alt = gguf_rows_to_hf(ref, nh)  # torch's gradient in HF (rotate_half) row order
            row["rel_tensor_if_hf_row_order"] = float(np.max(np.abs(k - alt))) / tmax
        rows.append(row)
    missing = [n for n in grads if n not in set(meta["tensors"])]
    ok_rows = [r for r in rows if "error" not in r]
    worst = max(ok_rows, key=lambda r: r["rel_global"]) if ok_rows else None
    kl = float(meta["loss"])
    summary = {
        "kvbench_dir": os.path.abspath(kdir),
        "n_tokens": len(ids),
        "n_targets": len(ids) - 1,
        "loss_torch": loss,
        "loss_kvbench": kl,
        "loss_abs_diff": abs(kl - loss),
        "loss_rel_diff": abs(kl - loss) / abs(loss),
        "global_max_abs_grad": {"tensor": gname, "flat_index": gidx, "value": gmax},
        "max_rel_global": max((r["rel_global"] for r in ok_rows), default=None),
        "max_rel_tensor": max((r["rel_tensor"] for r in ok_rows), default=None),
        "worst_tensor": worst["name"] if worst else None,
        "n_compared": len(ok_rows),
        "not_in_kvbench": missing,
        "problems": problems,
        "tensors": rows,
    }
    print("%-26s %14s %11s %11s %11s %11s" % ("tensor", "max|g_torch|", "max|diff|",
                                               "rel_global", "rel_tensor", "rel_fro"))
    for r in rows:
        if "error" in r:
            print("%-26s ERROR %s" % (r["name"], r["error"]))
            continue
        extra = ""
        if "rel_tensor_if_hf_row_order" in r:
            extra = "  (HF row order: %.3e)" % r["rel_tensor_if_hf_row_order"]
        print("%-26s %14.6e %11.3e %11.3e %11.3e %11.3e%s" % (
            r["name"], r["max_abs_torch"], r["max_abs_diff"], r["rel_global"], r["rel_tensor"],
            r["rel_fro"] if r["rel_fro"] is not None else float("nan"), extra))
    print("loss torch %.9g  kvbench %.9g  |diff| %.3e" % (loss, kl, abs(kl - loss)))
    print("global max|g_torch| %.6e in %s[%d]" % (gmax, gname, gidx))
    print("max rel_global %s (%s)  max rel_tensor %s  compared %d  not in kvbench %d" % (
        summary["max_rel_global"], summary["worst_tensor"], summary["max_rel_tensor"],
        len(ok_rows), len(missing)))
    for p in problems:
        print("PROBLEM: " + p)
    return summary


def error_stats(g, ref, gmax):
    """max|g - ref| over the tensor (and where), relative to the model's largest |ref| (rel_global),
    to the tensor's own (rel_tensor), and ||g - ref||_F / ||ref||_F (rel_fro); all in float64."""
    diff = np.abs(g.astype(np.float64) - ref.astype(np.float64))
    i = int(np.argmax(diff))
    md = float(diff.reshape(-1)[i])
    tmax = float(np.max(np.abs(ref)))
    fro = float(np.sqrt(np.sum(np.square(ref.astype(np.float64)))))
    sq = float(np.sum(np.square(diff)))
    return {
        "max_abs_diff": md,
        "argmax_diff": i,
        "rel_global": md / gmax,
        "rel_tensor": md / tmax if tmax > 0 else (0.0 if md == 0 else float("inf")),
        "rel_fro": float(np.sqrt(sq)) / fro if fro > 0 else None,
        "nonfinite": int(np.size(g) - np.count_nonzero(np.isfinite(g))),
    }, sq


def read_grad_dir(d, ids, label, problems):
    with open(os.path.join(d, "meta.json"), encoding="utf-8") as f:
        meta = json.load(f)
    if list(meta.get("ids", ids)) != list(ids):
        problems.append("%s: meta.json ids differ from the ids used" % label)
    if int(meta.get("n_targets", len(ids) - 1)) != len(ids) - 1:
        problems.append("%s: n_targets %s != %d" % (label, meta.get("n_targets"), len(ids) - 1))
    return meta


def compare_vs_float64(kdir, tdir, grads, loss, ids):
    """--kvbench DIR --float64 --torch32 DIR2: kvbench's gradients (DIR) and torch's float32 ones
    (DIR2, written by --dump without --float64), both against the float64 gradients `grads`."""
    problems = []
    kmeta = read_grad_dir(kdir, ids, "kvbench", problems)
    tmeta = read_grad_dir(tdir, ids, "torch32", problems)
    gname, gidx, gmax, _ = global_max(grads)
    rows = []
    sq = {"kvbench": 0.0, "torch32": 0.0}
    fro2 = 0.0
    kset, tset = set(kmeta["tensors"]), set(tmeta["tensors"])
    for name in grads:
        if name not in kset or name not in tset:
            problems.append("%s missing in %s" % (name, "kvbench" if name not in kset else "torch32"))
            continue
        ref = grads[name]
        row = {"name": name, "shape": list(ref.shape), "max_abs_f64": float(np.max(np.abs(ref)))}
        arrs = {}
        for label, d in (("kvbench", kdir), ("torch32", tdir)):
            a = np.load(os.path.join(d, name + ".npy"))
            if a.shape != ref.shape:
                row["error"] = "%s: shape %s, expected %s" % (label, list(a.shape), list(ref.shape))
                problems.append("%s: %s" % (name, row["error"]))
                break
            if a.dtype != np.float32:
                problems.append("%s: %s dtype %s, expected float32" % (name, label, a.dtype))
            arrs[label] = a
            row[label], s2 = error_stats(a, ref, gmax)
            sq[label] += s2
        if "error" in row:
            rows.append(row)
            continue
        fro2 += float(np.sum(np.square(ref.astype(np.float64))))
        kt = float(np.max(np.abs(arrs["kvbench"].astype(np.float64) - arrs["torch32"])))
        row["kvbench_vs_torch32_rel_global"] = kt / gmax
        k_rg, t_rg = row["kvbench"]["rel_global"], row["torch32"]["rel_global"]
        row["ratio_kvbench_torch32"] = k_rg / t_rg if t_rg > 0 else None
        rows.append(row)
    for label, meta in (("kvbench", kmeta), ("torch32", tmeta)):
        extra = [n for n in meta["tensors"] if n not in grads]
        if extra:
            problems.append("%s: unknown tensors %s" % (label, extra[:5]))
    ok = [r for r in rows if "error" not in r]

    def overall(label):
        if not ok:
            return None
        w = max(ok, key=lambda r: r[label]["rel_global"])
        wt = max(ok, key=lambda r: r[label]["rel_tensor"])
        return {"max_rel_global": w[label]["rel_global"], "worst_tensor": w["name"],
                "worst_flat_index": w[label]["argmax_diff"],
                "max_rel_tensor": wt[label]["rel_tensor"], "worst_tensor_rel_tensor": wt["name"],
                "rel_fro_model": float(np.sqrt(sq[label] / fro2)) if fro2 > 0 else None}

    kl, tl = float(kmeta["loss"]), float(tmeta["loss"])
    kt_worst = max(ok, key=lambda r: r["kvbench_vs_torch32_rel_global"]) if ok else None
    summary = {
        "mode": "kvbench float32 and torch float32 gradients against torch float64",
        "kvbench_dir": os.path.abspath(kdir),
        "torch32_dir": os.path.abspath(tdir),
        "n_tokens": len(ids),
        "n_targets": len(ids) - 1,
        "loss": {"f64": loss, "kvbench": kl, "torch32": tl,
                 "kvbench_abs_diff": abs(kl - loss), "torch32_abs_diff": abs(tl - loss)},
        "global_max_abs_grad_f64": {"tensor": gname, "flat_index": gidx, "value": gmax},
        "kvbench": overall("kvbench"),
        "torch32": overall("torch32"),
        "kvbench_vs_torch32": {
            "max_rel_global": kt_worst["kvbench_vs_torch32_rel_global"] if kt_worst else None,
            "worst_tensor": kt_worst["name"] if kt_worst else None},
        "n_compared": len(ok),
        "problems": problems,
        "tensors": rows,
    }
    top = sorted(ok, key=lambda r: -r["kvbench"]["rel_global"])[:15]
    print("errors against torch float64 (rel_global = max|diff| / max|g_f64| of the model = %.6e, "
          "%s[%d])" % (gmax, gname, gidx))
    print("%-26s %12s | %10s %10s %7s | %10s %10s | %10s" % (
        "tensor (worst 15, kvbench)", "max|g_f64|", "kv rel_gl", "t32 rel_gl", "kv/t32",
        "kv rel_t", "t32 rel_t", "kv-t32 rg"))
    for r in top:
        ratio = r["ratio_kvbench_torch32"]
        print("%-26s %12.5e | %10.3e %10.3e %7s | %10.3e %10.3e | %10.3e" % (
            r["name"], r["max_abs_f64"], r["kvbench"]["rel_global"], r["torch32"]["rel_global"],
            "%.2f" % ratio if ratio is not None else "-", r["kvbench"]["rel_tensor"],
            r["torch32"]["rel_tensor"], r["kvbench_vs_torch32_rel_global"]))
    for label in ("kvbench", "torch32"):
        o = summary[label]
        if o:
            print("%-8s fp32 vs f64: max rel_global %.3e (%s)  max rel_tensor %.3e (%s)  "
                  "rel_fro(model) %.3e" % (label, o["max_rel_global"], o["worst_tensor"],
                                          o["max_rel_tensor"], o["worst_tensor_rel_tensor"],
                                          o["rel_fro_model"]))
    if kt_worst:
        print("kvbench vs torch32: max rel_global %.3e (%s)" % (
            kt_worst["kvbench_vs_torch32_rel_global"], kt_worst["name"]))
    print("loss f64 %.12g  kvbench %.9g (|diff| %.3e)  torch32 %.9g (|diff| %.3e)" % (
        loss, kl, abs(kl - loss), tl, abs(tl - loss)))
    print("compared %d tensors" % len(ok))
    for p in problems:
        print("PROBLEM: " + p)
    return summary


def make_ids(gguf_path, n, out_path):
    from transformers import AutoTokenizer
    import tokenize_reference as tr
    gdir, gname = os.path.split(os.path.abspath(gguf_path))
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    base = prose_text()
    copies = 1
    while True:
        text = "\n\n".join([base] * copies)
        ids = tok(text, add_special_tokens=False)["input_ids"]
        if len(ids) >= n:
            break
        copies += 1
    ids = [int(i) for i in ids[:n]]
    tokens, types, merges, _ = tr.read_gguf_vocab(gguf_path)
    ref = tr.build_reference_smollm2(tokens, types, merges)
    rids = ref.encode(text, add_special_tokens=False).ids[:n]
    assert rids == ids, "HF GGUF tokenizer and reference tokenizer (b) disagree on the prose"
    assert len(ids) == n
    write_json(out_path, ids)
    base_len = len(tok(base, add_special_tokens=False)["input_ids"])
    print(json.dumps({"ids": out_path, "n": n, "prose_tokens": base_len, "copies": copies,
                      "ref_tok_match": True}))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(REPO_ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--ids", help="JSON list of token ids (written by --make-ids)")
    ap.add_argument("--make-ids", action="store_true")
    ap.add_argument("--n", type=int, help="number of ids for --make-ids")
    ap.add_argument("--kvbench", metavar="DIR", help="gradients written by kvbench to compare")
    ap.add_argument("--fixture", metavar="OUT.json")
    ap.add_argument("--summary", metavar="OUT.json", help="comparison summary (with --kvbench)")
    ap.add_argument("--dump", metavar="DIR", help="write torch's gradients in the kvbench format")
    ap.add_argument("--threads", type=int, default=2)
    ap.add_argument("--float64", action="store_true",
                    help="compute loss and gradients in float64 (weights: the same dequantized values)")
    ap.add_argument("--torch32", metavar="DIR2",
                    help="with --kvbench and --float64: torch's float32 gradients (from --dump) to "
                         "compare against float64 too")
    ap.add_argument("--checkpointing", action="store_true",
                    help="with --float64: activation checkpointing (less memory, one more forward)")
    ap.add_argument("--exact-rope", action="store_true",
                    help="with --float64: RoPE angles in float64 too (default: the float32 product "
                         "position x inv_freq, as transformers and kvbench define it)")
    args = ap.parse_args()

    if args.make_ids:
        if not args.ids or not args.n or args.n < 2:
            ap.error("--make-ids needs --ids FILE and --n N (N >= 2)")
        make_ids(args.gguf, args.n, args.ids)
        return
    if args.summary and not args.kvbench:
        ap.error("--summary needs --kvbench")
    if args.torch32 and not (args.kvbench and args.float64):
        ap.error("--torch32 needs --kvbench and --float64")
    if (args.checkpointing or args.exact_rope) and not args.float64:
        ap.error("--checkpointing and --exact-rope need --float64")
    if args.ids:
        with open(args.ids, encoding="utf-8") as f:
            ids = [int(i) for i in json.load(f)]
    elif args.kvbench:
        with open(os.path.join(args.kvbench, "meta.json"), encoding="utf-8") as f:
            ids = [int(i) for i in json.load(f)["ids"]]
    else:
        ap.error("--ids is required (or --kvbench DIR with ids in meta.json)")
    if len(ids) < 2:
        ap.error("need at least 2 ids")

    import torch

    t0 = time.perf_counter()
    model_sha = sha256_file(args.gguf)
    gg = read_gguf_tensors(args.gguf)
    model = load_model(args.gguf, args.threads)
    cfg = model.config
    assert all(0 <= i < cfg.vocab_size for i in ids)
    names = check_model(model, gg)
    dtype = torch.float32
    if args.float64:
        to_float64(model, gg, names, args.exact_rope, args.checkpointing)
        dtype = torch.float64
    t_load = time.perf_counter() - t0
    gguf_order = list(gg)

    n_params = sum(p.numel() for p in model.parameters())
    est = estimate_peak_bytes(cfg, n_params, len(ids), 8 if args.float64 else 4,
                              args.checkpointing)
    avail = mem_available_bytes()
    print("memory: rough peak estimate %.1f GiB, available %s GiB" % (
        est / 2**30, "%.1f" % (avail / 2**30) if avail else "?"), flush=True)
    if avail is not None and est > avail:
        sys.exit("not enough memory for %d tokens (estimate %.1f GiB > %.1f GiB available)%s" % (
            len(ids), est / 2**30, avail / 2**30,
            "; try --checkpointing" if args.float64 and not args.checkpointing else ""))

    for k in F64_CALLS:
        F64_CALLS[k] = 0
    loss, loss64, t_fwd, t_bwd = forward_backward(model, ids, dtype)
    if args.float64:
        check_float64_calls(cfg, args.checkpointing)
    grads = gradients_gguf(model, names)
    grads = {n: grads[n] for n in gguf_order}
    gname, gidx, gmax, gval = global_max(grads)
    total_fro = float(np.sqrt(sum(float(np.sum(np.square(g.astype(np.float64))))
                                  for g in grads.values())))
    timings = {"load_and_check_s": round(t_load, 2), "forward_s": round(t_fwd, 2),
               "backward_s": round(t_bwd, 2), "forward_backward_s": round(t_fwd + t_bwd, 2),
               "max_rss_mib": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss // 1024,
               "threads": torch.get_num_threads()}
    print(json.dumps({"dtype": str(dtype).replace("torch.", ""),
                      "n_tokens": len(ids), "n_targets": len(ids) - 1, "loss": loss,
                      "loss_f64_from_logits": loss64,
                      "max_abs_grad": [gname, gidx, gval], "total_frobenius": total_fro,
                      **timings}), flush=True)

    if args.dump:
        os.makedirs(args.dump, exist_ok=True)
        for n, g in grads.items():
            np.save(os.path.join(args.dump, n + ".npy"), g)  # float32, or float64 with --float64
        write_json(os.path.join(args.dump, "meta.json"),
                   {"loss": loss, "ids": ids, "n_targets": len(ids) - 1, "tensors": gguf_order,
                    "dtype": str(dtype).replace("torch.", "")})

    if args.fixture:
        # With --float64 the fixture holds the float64 gradients (the ground truth both fp32
        # implementations are measured against), each value as its own float64 repr.
        value = float if args.float64 else f32
        prec = "float64" if args.float64 else "float32"
        doc = {
            "model_file": os.path.basename(args.gguf),
            "model_sha256": model_sha,
            "versions": versions(),
            "settings": {
                "reference": "torch autograd, transformers LlamaForCausalLM from "
                             "from_pretrained(dir, gguf_file=...)",
                "dtype": prec, "attn_implementation": "eager", "mode": "eval (no dropout)",
                "torch_threads": args.threads, "bos_added": False,
                "loss": "mean over t=0..n-2 of cross_entropy(logits[t], ids[t+1]), " + prec,
                "layout": "GGUF: matrices (rows, cols) = reversed ne, flat = row*cols + col; "
                          "attn_q/attn_k rows in llama.cpp order: GGUF row h*d+2i+j = HF row "
                          "h*d+j*(d/2)+i (d=64, heads 9 for q, 3 for k)",
                "tied": "token_embd.weight gradient = embedding part + lm_head part",
                "frobenius": "sqrt of float64 sum of squares",
                "samples": "%d distinct sorted flat indices from numpy default_rng("
                           "zlib.crc32(b'kvbench-grad:' + name)).choice(n, %d, replace=False)"
                           % (N_SAMPLES, N_SAMPLES),
                "argmax": "first flat index of the largest |g|",
            },
            "n_tokens": len(ids),
            "n_targets": len(ids) - 1,
            "loss": value(loss),
            "loss_f64_from_logits": loss64,
            "max_abs_grad": {"tensor": gname, "flat_index": gidx, "value": value(gval)},
            "total_frobenius": total_fro,
            "ids": ids,
            "tensors": [tensor_entry(n, gg[n][0], grads[n], value) for n in gguf_order],
        }
        write_json(args.fixture, doc)
        print("fixture %s: %d bytes" % (args.fixture, os.path.getsize(args.fixture)))

    if args.kvbench:
        if args.torch32:
            summary = compare_vs_float64(args.kvbench, args.torch32, grads, loss, ids)
        else:
            summary = compare_kvbench(args.kvbench, grads, loss, ids, cfg)
        summary["reference"] = {
            "dtype": str(dtype).replace("torch.", ""),
            "rope_angles": ("float64" if args.exact_rope else "float32 product position x inv_freq")
            if args.float64 else "float32",
            "checkpointing": bool(args.checkpointing), "torch_threads": args.threads}
        summary["timings"] = timings
        summary["versions"] = versions()
        if args.summary:
            write_json(args.summary, summary)


if __name__ == "__main__":
    main()
