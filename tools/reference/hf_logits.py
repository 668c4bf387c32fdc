#!/usr/bin/env python3
"""Golden end-to-end logits and greedy continuations for SmolLM2-135M-Instruct (Q4_1 GGUF).

Reference: Hugging Face transformers running the GGUF itself. transformers' GGUF loader
dequantizes every tensor to float32 (with gguf-py) and builds a LlamaForCausalLM, so the
reference sees exactly the weights kvbench reads, only dequantized, and computes in float32.

Settings: dtype=torch.float32, attn_implementation="eager" (no SDPA kernels), model.eval(),
torch.set_num_threads(2), torch.no_grad(). No BOS is added (add_special_tokens=False).

For each prompt (deterministic, built below; no network, no data files):
  1. One forward over the whole prompt (use_cache=False, logits_to_keep=1: the lm_head is
     applied to the last position only). The final-position logits go into the .bin file.
  2. model.generate greedy, exactly 32 new tokens: do_sample=False, max_new_tokens=32,
     min_new_tokens=32, eos_token_id=None (also cleared in model.generation_config, so
     no EOS masking and no stopping: EOS, id 2, may be generated and generation goes on),
     pad_token_id=2. output_logits=True gives the raw (unprocessed) logits of every step;
     greedy_margins[i] = top1 - top2 of step i. The script checks greedy[i] == argmax of
     step i's raw logits.
  3. Cross-check without a KV cache: one forward over prompt + greedy[:31] (use_cache=False).
     Its last 32 positions must give the same argmax as the cached generation; the largest
     logit difference between the two paths is recorded ("tf_max_abs_diff").

Outputs (in --outdir, default tests/fixtures/engine/):
  hf_logits.bin   final-position logits of every prompt, in prompt order,
                  little-endian float32, shape [n_prompts, 49152], row-major.
  hf_logits.json  {"model_sha256", "versions", "settings", "bin", "prompts": [...]}
                  Per prompt: name, kind, text (null for id-slices), ids, n, max_abs_logit,
                  top5 [[id, logit]...], greedy [32 ids], greedy_margins [32 floats],
                  greedy_text, argmax_prompt_forward, tf_greedy_agree, tf_max_abs_diff,
                  step0_vs_prompt_forward_max_abs_diff, ref_tok_match.
                  (Timings go to stdout only, so two runs give the same bytes.)
  Every float is a float32 value written as the shortest float64 repr, so it reads back
  bit-exactly as float32.

The prompts are tokenized with transformers' GGUF tokenizer. That tokenizer is not SmolLM2's
real one (it lacks the Digits split; see README, tokenize_reference.py), so the script also
tokenizes every prompt with the reference tokenizer (b) and records whether they agree
(ref_tok_match). The prompts avoid the known differing patterns; all agree.

Usage (from the repo root; needs torch, transformers 5.x, accelerate, gguf, tokenizers):
    python3 tools/reference/hf_logits.py [--gguf models/SmolLM2-135M-Instruct.Q4_1.gguf]
        [--outdir tests/fixtures/engine]
"""

import argparse
import hashlib
import json
import os
import platform
import random
import sys
import time
from importlib.metadata import version as pkg_version

import numpy as np

REPO_ROOT = os.path.abspath(os.path.join(os.path.dirname(__file__), "..", ".."))
sys.path.insert(0, os.path.dirname(os.path.abspath(__file__)))

N_NEW = 32
VOCAB = 49152

# --------------------------------------------------------------------------------------
# Deterministic prose: a fictional chronicle built from hand-written word lists and
# sentence templates with random.Random(fixed seed). Sentences are distinct. Digits only
# ever follow a single ASCII space or a letter/punctuation, never a whitespace run or a
# newline, so transformers' GGUF tokenizer and the reference tokenizer agree.
# --------------------------------------------------------------------------------------

PEOPLE = ["Ada Marsh", "Bruno Kell", "Clara Voss", "Dmitri Hale", "Elena Quist", "Felix Orr",
          "Greta Lund", "Hugo Brandt", "Iris Pell", "Jonas Reyes", "Katya Moss", "Leo Fenwick",
          "Mira Solberg", "Nils Achterberg", "Olga Tamm", "Pavel Ruiz", "Quinn Abara",
          "Rosa Delacroix", "Samuel Ito", "Tess Okafor", "Ulrich Bauer", "Vera Lindqvist",
          "Walter Price", "Yara Haddad", "Zoe Carrington", "Arthur Penn", "Beatrice Nolan",
          "Cyrus Webb", "Dora Kowalski", "Emil Sato"]
TOWNS = ["Ashford", "Brackenridge", "Coldwater", "Dunmore", "Eastleigh", "Fairhaven",
         "Glenrock", "Harrowgate", "Ironbridge", "Juniper Falls", "Kestrel Bay", "Larkspur",
         "Millbrook", "Northwick", "Oakhollow", "Pinecrest", "Queensferry", "Redcliff",
         "Stonebury", "Thornfield"]
ROLES = ["baker", "blacksmith", "schoolteacher", "mayor", "ferryman", "clockmaker",
         "librarian", "shepherd", "miller", "carpenter", "physician", "cartographer",
         "stationmaster", "weaver", "beekeeper", "glassblower", "fisherman", "archivist",
         "gardener", "potter"]
THINGS = ["bridge", "lighthouse", "mill", "library", "clock tower", "market hall", "school",
          "observatory", "granary", "chapel", "harbour wall", "railway station", "bakery",
          "printing press", "orchard", "water tower", "museum", "theatre", "post office",
          "greenhouse", "windmill", "boathouse", "town hall", "canal lock", "stone well"]
ADJS = ["old", "new", "crooked", "famous", "quiet", "painted", "ruined", "enormous", "narrow",
        "forgotten", "beautiful", "wooden", "stone", "copper-roofed", "leaning", "busy",
        "abandoned", "restored", "tiny", "ancient", "windy", "cheerful", "gloomy", "sturdy",
        "elegant"]
PLACES = ["river", "northern hills", "old quarry", "market square", "harbour", "pine forest",
          "salt marsh", "eastern gate", "village green", "railway line", "stone bridge",
          "frozen lake", "apple orchards", "southern cliffs", "chalk downs", "cathedral steps",
          "fishing docks", "iron works", "meadow", "crossroads"]
SEASONS = ["spring", "summer", "autumn", "winter", "harvest season", "rainy season"]
ACTIVITIES = ["trade wool and cheese", "race small wooden boats", "sing old songs",
              "repair the fishing nets", "plant new trees", "argue about the weather",
              "count the migrating geese", "bake bread in a shared oven", "tell ghost stories",
              "elect a new council", "paint the fences", "clean the streets",
              "play chess in the open air", "measure the height of the river",
              "light lanterns along the shore"]
MAXIMS = ["a patient hand builds a steady wall", "the river always remembers its banks",
          "a town is only as strong as its oldest bridge", "bread shared is bread doubled",
          "every map is a promise and a guess", "the quietest bell is the one nobody rings",
          "good roads make good neighbours", "a clock that is never wound is right twice a day",
          "the sea keeps no accounts", "you cannot plough a field by turning it over in your mind",
          "the best stories are told in winter", "a lantern is no use in a locked cupboard",
          "the wind carries news faster than the post", "books are seeds that grow slowly",
          "nobody ever regretted planting a tree"]
MATERIALS = ["brass", "glass", "oak", "clay", "silver", "linen", "tin", "walnut", "iron", "wax"]
SMALL = ["key", "bead", "button", "marble", "coin", "thimble", "spoon", "bell", "candle", "compass"]
FURNITURE = ["bed", "stairs", "kitchen table", "counter", "floorboards", "workbench", "piano"]
VERBS = ["rebuilt", "painted", "designed", "sold", "repaired", "opened", "closed", "inherited",
         "photographed", "measured", "described", "visited", "restored", "guarded", "abandoned"]
FEELINGS = ["admired", "ignored", "feared", "celebrated", "complained about", "cherished",
            "photographed", "avoided", "decorated", "talked about"]
WEATHER = ["a storm flooded the lower streets", "the snow lay deep for six weeks",
           "a drought dried the wells", "fog hid the harbour for days",
           "a warm wind melted the ice early", "hail broke half the windows",
           "the river froze from bank to bank", "an early frost ruined the apples"]


def _sentence(rng):
    p, p2 = rng.sample(PEOPLE, 2)
    t, t2 = rng.sample(TOWNS, 2)
    k = rng.randrange(14)
    year = rng.randrange(1700, 1990)
    if k == 0:
        return "In %d, %s %s the %s %s of %s." % (year, p, rng.choice(VERBS), rng.choice(ADJS),
                                                 rng.choice(THINGS), t)
    if k == 1:
        return "%s was a %s who lived near the %s in %s." % (p, rng.choice(ROLES),
                                                             rng.choice(PLACES), t)
    if k == 2:
        return "The %s %s in %s was %s by everyone who saw it." % (
            rng.choice(ADJS), rng.choice(THINGS), t, rng.choice(FEELINGS))
    if k == 3:
        return "Every %s, the people of %s gathered by the %s to %s." % (
            rng.choice(SEASONS), t, rng.choice(PLACES), rng.choice(ACTIVITIES))
    if k == 4:
        return "%s once said that %s." % (p, rng.choice(MAXIMS))
    if k == 5:
        return "The road from %s to %s took %d days on foot, or %d hours by train." % (
            t, t2, rng.randrange(2, 15), rng.randrange(2, 30))
    if k == 6:
        return "By %d, the population of %s had grown to %s people." % (
            year, t, format(rng.randrange(800, 90000), ","))
    if k == 7:
        return "%s wrote a long letter to %s about the %s %s." % (p, p2, rng.choice(ADJS),
                                                                 rng.choice(THINGS))
    if k == 8:
        return "Nobody in %s remembered who had first %s the %s." % (t, rng.choice(VERBS),
                                                                     rng.choice(THINGS))
    if k == 9:
        return "The %s kept a box of %s %ss under the %s." % (
            rng.choice(ROLES), rng.choice(MATERIALS), rng.choice(SMALL), rng.choice(FURNITURE))
    if k == 10:
        return "In the %s of %d, %s, and the %s of %s had to %s." % (
            rng.choice(SEASONS), year, rng.choice(WEATHER), rng.choice(ROLES), t,
            rng.choice(ACTIVITIES))
    if k == 11:
        return "%s and %s spent %d years drawing a map of the %s." % (
            p, p2, rng.randrange(2, 40), rng.choice(PLACES))
    if k == 12:
        return "When %s arrived in %s, the %s had already been %s twice." % (
            p, t, rng.choice(THINGS), rng.choice(VERBS))
    return "According to the archive, the %s of %s charged %d pennies for a loaf of bread." % (
        rng.choice(ROLES), t, rng.randrange(1, 60))


def chronicle(n_sentences=900, seed=20250311):
    """The fixed generated text: a list of paragraphs, each a list of distinct sentences."""
    rng = random.Random(seed)
    seen, paras, cur = set(), [], []
    target = rng.randrange(4, 9)
    while len(seen) < n_sentences:
        s = _sentence(rng)
        if s in seen:
            continue
        seen.add(s)
        cur.append(s)
        if len(cur) == target:
            paras.append(cur)
            cur, target = [], rng.randrange(4, 9)
    if cur:
        paras.append(cur)
    return paras


class ProseCursor:
    """Hands out disjoint stretches of the chronicle, whole sentences at a time, so that
    different prompts do not share text."""

    def __init__(self, paras):
        self.items = []  # (sentence, ends_paragraph)
        for p in paras:
            for i, s in enumerate(p):
                self.items.append((s, i == len(p) - 1))
        self.pos = 0

    def take(self, count_tokens, target):
        out = ""
        while True:
            s, end = self.items[self.pos]
            self.pos += 1
            out += s + ("\n\n" if end else " ")
            if count_tokens(out.rstrip()) >= target:
                return out.rstrip()


# --------------------------------------------------------------------------------------
# Hand-written prompts.
# --------------------------------------------------------------------------------------

CODE_PY = '''def fibonacci(n):
    """Return the n-th Fibonacci number."""
    a, b = 0, 1
    for _ in range(n):
        a, b = b, a + b
    return a


def is_prime(n):
    if n < 2:
        return False
    i = 2
    while i * i <= n:
        if n % i == 0:
            return False
        i += 1
    return True


if __name__ == "__main__":
    primes = [p for p in range(50) if is_prime(p)]
    print("primes:", primes)
    print("fib(10) =",'''

CODE_CPP = '''#include <cstdint>
#include <string>
#include <vector>

// A small ring buffer with a fixed capacity.
template <typename T>
class RingBuffer {
public:
    explicit RingBuffer(std::size_t capacity) : data_(capacity), head_(0), size_(0) {}

    bool push(const T& value) {
        if (size_ == data_.size()) {
            return false;
        }
        data_[(head_ + size_) % data_.size()] = value;
        ++size_;
        return true;
    }

    bool pop(T& out) {
        if (size_ == 0) {
            return false;
        }
        out = data_[head_];
        head_ = (head_ + 1) % data_.size();
        --size_;
        return true;
    }

    std::size_t size() const { return size_; }
    bool empty() const { return size_ == 0; }

private:
    std::vector<T> data_;
    std::size_t head_;
    std::size_t size_;
};

int main() {
    RingBuffer<int> rb(4);
    for (int i = 0; i < 6; ++i) {
        rb.push(i * i);
    }
    int x = 0;
    while (rb.pop(x)) {
        // Print each value on its own line.
'''

CODE_JSON = ('{"name": "kvbench", "version": "0.3.1", "layers": 30, "heads": 9, "kv_heads": 3, '
             '"head_dim": 64, "vocab": 49152, "context": 8192, "rope_theta": 100000.0, '
             '"tied_embeddings": true, "quant": "Q4_1", "files": ["model.gguf", "tokenizer.json"], '
             '"authors": [{"name": "Ada", "role": "kernels"}, {"name": "Bruno", "role": "cache"}], '
             '"benchmarks": {"prefill_tokens": 2048, "decode_tokens": 128, "batch": 1}, "notes": "')

RECIPE = """Recipe: Simple Tomato Soup

Ingredients:
- 6 ripe tomatoes, chopped
- 1 onion, diced
- 2 cloves of garlic, crushed
- 2 tablespoons of olive oil
- 500 ml of vegetable stock
- salt and pepper to taste
- a handful of fresh basil leaves

Method:
Step one: heat the olive oil in a large pot over a medium flame.
Step two: add the onion and cook for 5 minutes until soft.
Step three: add the garlic and cook for 1 more minute.
Step four: add the tomatoes and the stock, then simmer for 20 minutes.
Step five: blend the soup until smooth and season it with salt and pepper.
Step six:"""

PLAY = """THE LIGHTHOUSE KEEPER

A play in one act.

CHARACTERS:
MARTHA, the keeper of the lighthouse, about sixty years old.
TOM, her nephew, a young sailor.
THE INSPECTOR, a man from the harbour office.

SCENE: The lamp room at the top of the lighthouse. Night. Wind outside.

MARTHA: Close the door, Tom. You are letting the whole sea in.
TOM: It is only a little rain, aunt.
MARTHA: A little rain, he says. In my day a little rain took the roof off the boathouse.
TOM: In your day everything was bigger. The waves, the storms, the fish.
MARTHA: The fish were bigger. That part is true.
(A knock at the door below.)
TOM: Who could that be at this hour?
MARTHA: Nobody good. Good people are asleep.
(THE INSPECTOR enters, shaking water from his coat.)
THE INSPECTOR: Good evening. I am looking for the keeper of this light.
MARTHA: You have found her. What do you want?
THE INSPECTOR: The harbour office has decided to replace the lamp with an electric one. It will run itself. No keeper will be needed.
TOM: No keeper? But who will watch the ships?
THE INSPECTOR: The machine will watch them.
MARTHA: A machine cannot see a small boat in the fog. A machine does not hear a bell.
THE INSPECTOR: It is already decided, madam. I am sorry.
MARTHA: (after a long pause) Then you had better sit down, Inspector, and let me tell you about the night of the great storm.
THE INSPECTOR: I do not have much time.
MARTHA:"""

REPEAT_WORDS = ["apple", "river", "stone", "cloud", "lamp", "violin", "anchor", "meadow"]


def repetition_prompt():
    # An induction pattern: a fixed 8-word cycle repeated, ending mid-cycle.
    words = (REPEAT_WORDS * 7)[:53]
    return " ".join(words)


def numbers_prompt():
    return ", ".join(str(i) for i in range(1, 21)) + ","


def arithmetic_prompt():
    return ("12 + 30 = 42. 7 * 8 = 56. 100 - 37 = 63. 81 / 9 = 9. 15 + 27 = 42. "
            "6 * 7 = 42. 144 / 12 = 12. 250 - 125 =")


def build_prompts(tok, count_tokens):
    """Return a list of dicts {name, kind, text} or {name, kind, ids, source} (id slices)."""
    paras = chronicle()
    cur = ProseCursor(paras)
    P = []

    def add(name, kind, text):
        P.append({"name": name, "kind": kind, "text": text})

    def chat(msgs):
        return tok.apply_chat_template(msgs, add_generation_prompt=True, tokenize=False)

    add("fact_capital", "fact", "Question: What is the capital of France?\nAnswer:")
    add("fact_planets", "fact",
        "The largest planet in our solar system is Jupiter, and the planet closest to the Sun is")
    add("fact_water", "fact",
        "Water is made of hydrogen and oxygen. At sea level, pure water boils at a temperature of")
    add("numbers_count", "numbers", numbers_prompt())
    add("numbers_arith", "numbers", arithmetic_prompt())
    add("repeat_cycle", "pattern", repetition_prompt())
    add("prose_50", "prose", cur.take(count_tokens, 50))
    add("code_json", "code", CODE_JSON)
    add("prose_100", "prose", cur.take(count_tokens, 100))
    add("code_python", "code", CODE_PY)
    add("recipe", "prose", RECIPE)
    add("prose_200", "prose", cur.take(count_tokens, 200))
    add("code_cpp", "code", CODE_CPP)
    add("play", "prose", PLAY)
    add("prose_500", "prose", cur.take(count_tokens, 500))
    add("prose_1000", "prose", cur.take(count_tokens, 1000))
    add("prose_1500", "prose", cur.take(count_tokens, 1500))
    add("prose_2000", "prose", cur.take(count_tokens, 2000))
    add("chat_capital", "chat", chat([{"role": "user", "content": "What is the capital of France?"}]))
    add("chat_system", "chat", chat([
        {"role": "system", "content": "You are a terse assistant. Answer in one word."},
        {"role": "user", "content": "Name a primary colour."}]))
    add("chat_multiturn", "chat", chat([
        {"role": "user", "content": "Hi! Can you add 12 and 30?"},
        {"role": "assistant", "content": "Sure: 12 + 30 = 42."},
        {"role": "user", "content": "And multiply that by 3?"}]))
    add("chat_code", "chat", chat([
        {"role": "user", "content": "Write a Python function that reverses a string."}]))
    doc = cur.take(count_tokens, 520)
    add("chat_summarize", "chat", chat([
        {"role": "system", "content": "You are a helpful assistant who writes short summaries."},
        {"role": "user", "content": "Summarize the following text in three sentences.\n\n" + doc}]))
    return P


# --------------------------------------------------------------------------------------


def sha256_file(path):
    h = hashlib.sha256()
    with open(path, "rb") as f:
        for chunk in iter(lambda: f.read(1 << 20), b""):
            h.update(chunk)
    return h.hexdigest()


def f32(x):
    """A float32 value as a Python float (exact; its repr reads back to the same float32)."""
    return float(np.float32(x))


def top_k(logits, k):
    # Stable ordering: by logit descending, ties by lower id first.
    order = np.lexsort((np.arange(logits.size), -logits.astype(np.float64)))[:k]
    return [[int(i), f32(logits[i])] for i in order]


def margin(logits):
    t = np.partition(logits, -2)[-2:]
    return f32(np.float32(max(t)) - np.float32(min(t)))


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--gguf", default=os.path.join(REPO_ROOT, "models/SmolLM2-135M-Instruct.Q4_1.gguf"))
    ap.add_argument("--outdir", default=os.path.join(REPO_ROOT, "tests/fixtures/engine"))
    ap.add_argument("--threads", type=int, default=2)
    args = ap.parse_args()

    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer
    import tokenize_reference as tr

    torch.set_num_threads(args.threads)
    torch.manual_seed(0)
    gdir, gname = os.path.split(os.path.abspath(args.gguf))

    t0 = time.time()
    model_sha = sha256_file(args.gguf)
    tok = AutoTokenizer.from_pretrained(gdir, gguf_file=gname)
    t_tok = time.time() - t0
    t0 = time.time()
    model = AutoModelForCausalLM.from_pretrained(gdir, gguf_file=gname, dtype=torch.float32,
                                                 attn_implementation="eager")
    model.eval()
    t_load = time.time() - t0
    assert model.config.vocab_size == VOCAB
    # No EOS anywhere: no stopping and no min_new_tokens EOS masking.
    model.generation_config.eos_token_id = None

    tokens, types, merges, _ = tr.read_gguf_vocab(args.gguf)
    ref = tr.build_reference_smollm2(tokens, types, merges)

    def hf_ids(text):
        return tok(text, add_special_tokens=False)["input_ids"]

    prompts = build_prompts(tok, lambda s: len(hf_ids(s)))
    rows = []
    for p in prompts:
        ids = hf_ids(p["text"])
        rids = ref.encode(p["text"], add_special_tokens=False).ids
        rows.append({"name": p["name"], "kind": p["kind"], "text": p["text"], "ids": ids,
                     "ref_tok_match": ids == rids})
    # Two exact-length id slices (chunk-boundary sizes) from the longest prose prompt.
    longest = next(r for r in rows if r["name"] == "prose_2000")
    for n in (512, 1024):
        rows.append({"name": "prose_2000_prefix_%d" % n, "kind": "slice", "text": None,
                     "ids": longest["ids"][:n], "ref_tok_match": None})
    bad = [r["name"] for r in rows if r["ref_tok_match"] is False]
    if bad:
        print("WARNING: HF GGUF tokenizer != reference tokenizer for: %s" % bad, file=sys.stderr)

    logits_rows = []
    t_all = time.time()
    with torch.no_grad():
        for r in rows:
            ts = time.time()
            ids = r["ids"]
            n = len(ids)
            x = torch.tensor([ids], dtype=torch.long)
            out = model(input_ids=x, use_cache=False, logits_to_keep=1)
            last = out.logits[0, -1].float().numpy().astype(np.float32)
            assert last.shape == (VOCAB,)
            logits_rows.append(last.copy())

            g = model.generate(input_ids=x, attention_mask=torch.ones_like(x), do_sample=False,
                               max_new_tokens=N_NEW, min_new_tokens=N_NEW, eos_token_id=None,
                               pad_token_id=2, output_logits=True, return_dict_in_generate=True,
                               num_beams=1, temperature=None, top_p=None, top_k=None)
            new = g.sequences[0, n:].tolist()
            assert len(new) == N_NEW, len(new)
            steps = [s[0].float().numpy().astype(np.float32) for s in g.logits]
            assert len(steps) == N_NEW
            for i, s in enumerate(steps):
                assert int(np.argmax(s)) == new[i], (r["name"], i)

            # No-cache cross-check: prompt + first 31 generated tokens in one forward.
            xt = torch.tensor([ids + new[:-1]], dtype=torch.long)
            tf = model(input_ids=xt, use_cache=False, logits_to_keep=N_NEW).logits[0].float().numpy()
            tf_arg = [int(a) for a in tf.argmax(-1)]
            tf_diff = max(float(np.max(np.abs(tf[i] - steps[i]))) for i in range(N_NEW))

            r.update({
                "n": n,
                "max_abs_logit": f32(np.max(np.abs(last))),
                "top5": top_k(last, 5),
                "argmax_prompt_forward": int(np.argmax(last)),
                "greedy": new,
                "greedy_margins": [margin(s) for s in steps],
                "greedy_text": tok.decode(new, skip_special_tokens=False),
                "tf_greedy_agree": tf_arg == new,
                "tf_max_abs_diff": tf_diff,
                "step0_vs_prompt_forward_max_abs_diff": float(np.max(np.abs(steps[0] - last))),
                "seconds": round(time.time() - ts, 2),
            })
            print("%-24s n=%5d  %6.1fs  top1=%d margin_min=%.4f tf_agree=%s tf_diff=%.2e  %r"
                  % (r["name"], n, r["seconds"], r["argmax_prompt_forward"],
                     min(r["greedy_margins"]), r["tf_greedy_agree"], tf_diff,
                     r["greedy_text"][:60]), flush=True)
    t_all = time.time() - t_all

    os.makedirs(args.outdir, exist_ok=True)
    bin_path = os.path.join(args.outdir, "hf_logits.bin")
    arr = np.stack(logits_rows).astype("<f4")
    with open(bin_path + ".tmp", "wb") as f:
        f.write(arr.tobytes(order="C"))
    os.replace(bin_path + ".tmp", bin_path)

    versions = {"python": platform.python_version()}
    for pkg in ("torch", "transformers", "accelerate", "tokenizers", "gguf", "numpy"):
        try:
            versions[pkg] = pkg_version(pkg)
        except Exception:
            versions[pkg] = None
    order = ["name", "kind", "n", "max_abs_logit", "top5", "argmax_prompt_forward", "greedy",
             "greedy_margins", "greedy_text", "tf_greedy_agree", "tf_max_abs_diff",
             "step0_vs_prompt_forward_max_abs_diff", "ref_tok_match", "text", "ids"]
    doc = {
        "model_file": gname,
        "model_sha256": model_sha,
        "versions": versions,
        "settings": {
            "loader": "AutoModelForCausalLM.from_pretrained(dir, gguf_file=...)",
            "dtype": "float32", "attn_implementation": "eager", "torch_threads": args.threads,
            "add_special_tokens": False, "bos_added": False,
            "prompt_forward": "single forward, use_cache=False, logits_to_keep=1",
            "generation": "greedy, exactly 32 new tokens, no EOS stop or masking, KV cache (DynamicCache)",
            "greedy_margins": "top1 - top2 of the raw logits at each generation step (cached path)",
            "tokenizer": "transformers AutoTokenizer from the GGUF; ref_tok_match compares with "
                         "tokenize_reference.py tokenizer (b)",
        },
        "bin": {"file": "hf_logits.bin", "dtype": "float32", "endian": "little",
                "shape": [len(rows), VOCAB], "sha256": hashlib.sha256(arr.tobytes()).hexdigest()},
        "prompts": [{k: r[k] for k in order} for r in rows],
    }
    json_path = os.path.join(args.outdir, "hf_logits.json")
    with open(json_path + ".tmp", "w", encoding="ascii", newline="\n") as f:
        json.dump(doc, f, ensure_ascii=True, indent=None, separators=(",", ":"))
        f.write("\n")
    os.replace(json_path + ".tmp", json_path)

    print(json.dumps({"model_sha256": model_sha, "n_prompts": len(rows),
                      "lengths": [r["n"] for r in rows],
                      "tokenizer_load_s": round(t_tok, 1), "model_load_s": round(t_load, 1),
                      "prompts_s": round(t_all, 1), "versions": versions,
                      "ref_tok_mismatch": bad}, indent=1))


if __name__ == "__main__":
    main()
