"""The default GGUF as transformers loads it, with the tokenizer made SmolLM2's own again.

transformers' GGUF conversion (4.57.1) builds a tokenizer that adds BOS whatever the file says (this
file's tokenizer.ggml.add_bos_token is false, as the model's own tokenizer.json) and that does not
split digits as SmolLM2's tokenizer.json does (Digits, then ByteLevel: "  6" is a two-space token and
a digit). Both are restored, so that its ids are kvbench's. The model: float32, eager attention, the
GGUF dequantized. Needs torch, transformers and gguf.
"""
import pathlib


def load(gguf):
    import torch
    from tokenizers import pre_tokenizers
    from transformers import AutoModelForCausalLM, AutoTokenizer

    path = pathlib.Path(gguf)
    tok = AutoTokenizer.from_pretrained(path.parent, gguf_file=path.name)
    tok.add_bos_token = False
    tok.backend_tokenizer.pre_tokenizer = pre_tokenizers.Sequence([
        pre_tokenizers.Digits(individual_digits=True),
        pre_tokenizers.ByteLevel(add_prefix_space=False, use_regex=True)])
    model = AutoModelForCausalLM.from_pretrained(path.parent, gguf_file=path.name, dtype=torch.float32,
                                                 attn_implementation="eager").eval()
    return tok, model
