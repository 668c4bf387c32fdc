#pragma once
// The shared parts methods are built from: scorers (how important each prompt token is), GQA
// reduction, top-k selection, budget allocators across layers, and the step that turns kept
// positions into a LayerCache. Conventions as in methods/snapkv/README.md (window, GQA reduction, top-k).
#include <cstdint>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/prefill_view.hpp"
#include "harness/method/method.hpp"
#include "harness/util/params.hpp"

namespace kvb {

enum class Pooling { None, Max, Avg };
enum class WindowReduce { Sum, Mean };
Pooling parse_pooling(const std::string& s);

// SnapKV's scorer: softmax attention of the last w queries (causal inside the window, over all S
// keys, fp32), reduced over the window rows, for the prefix [0, S - w).
HeadScores window_attention_scores(const PrefillView& v, int w, WindowReduce reduce);
// Reference: the same from the full S x S attention of the window rows, in double.
HeadScores window_attention_scores_ref(const PrefillView& v, int w, WindowReduce reduce);

// 1-D pooling, stride 1, padding k/2, same length. Max ignores padding; avg counts it as zeros and
// divides by k (PyTorch's count_include_pad).
std::vector<float> pool1d(const std::vector<float>& x, int kernel, Pooling p);

// SnapKV's scorer as SnapKV and PyramidKV configure it, from the parameters window_scorer_params()
// declares: window attention, reduced over the window, pooled, per query head.
std::vector<ParamSpec> window_scorer_params();
HeadScores pooled_window_scores(const PrefillView& v, const Params& p);

// Native mode: one score vector per KV head, the mean over its query heads. Repeat: unchanged.
HeadScores reduce_for_gqa(const HeadScores& per_query_head, int n_kv_heads, GqaMode mode);

// Positions of the k largest scores, ties to the lower position, returned in ascending order.
std::vector<int32_t> top_k_sorted(const std::vector<float>& scores, int k);

// The Selection of a top-k method: query-head scores reduced for the GQA mode, each stored head keeping
// the top caps[h] (all of them when caps[h] exceeds the prefix) plus the window. Caps of -k (a compression
// ratio's T below the window) keep the window's last w - k tokens alone.
Selection select_top(HeadScores query_scores, int n_kv_heads, GqaMode mode, std::vector<int> caps, int S, int w);

// A cache holding, for each stored head, exactly the listed prompt positions (Dense segments).
LayerCache gather(const PrefillView& v, GqaMode mode, const std::vector<std::vector<int32_t>>& keep);
LayerCache keep_all(const PrefillView& v, GqaMode mode);

// Per-layer token budgets (window included) that a schedule assigns for KV size T.
// HeadKV's per-head budgets (methods/headkv/README.md §3): selected (non-window) slots for every head of
// every layer from importance scores [layer][head]. With b = T - w, each head is guaranteed
// b - b//beta slots and shares a pool of (b//beta) x heads in proportion to its score raised to
// `temperature` (1 = proportional). Nearest rounds each head half to even as the reference code
// (torch.round), so the total can miss heads x b by up to heads/2 either way; ExactTotal hands out
// the rounding by largest remainders so that the capacities sum to exactly heads x b.
enum class CapRounding { Nearest, ExactTotal };
std::vector<std::vector<int>> per_head_budgets(const std::vector<std::vector<double>>& scores, int T, int w,
                                               double beta, double temperature = 1.0,
                                               CapRounding rounding = CapRounding::Nearest);

// Kept positions of every stored head when each has its own count: the top caps[h] of its scores
// (all of them when caps[h] exceeds the prefix; the surplus is not redistributed, as in HeadKV) plus
// the window [S - w, S).
std::vector<std::vector<int32_t>> select_per_head(const HeadScores& scores, const std::vector<int>& caps, int S, int w);

// Palu's quantization of low-rank latents (its --lt_bits, --lt_group_size, --lt_sym, --lt_clip_ratio,
// --lt_hadamard): the options latent_bits (16: off), latent_group_size (values per scale; 0: a group's
// whole latent), latent_sym, latent_clip and latent_hadamard, every one added later.
struct LatentQuant {
  int bits = 16, group_size = 0;
  bool sym = false, hadamard = false;
  double clip = 1.0;
  bool on() const { return bits < 16; }
  // Stored bits of a latent of n values: n codes and, per scale group, an fp16 scale (and, asymmetric,
  // an fp16 zero point, which Palu keeps as a rounded float).
  size_t stored_bits(int n) const;
};
// `params` with the latent_* options appended.
std::vector<ParamSpec> with_latent_quant(std::vector<ParamSpec> params);
LatentQuant latent_quant_of(const Params& p);
// x[0..n) quantized and dequantized in place as Palu's quantize_tensor: per scale group, asymmetric
// scale = max(max - min, 1e-5) / (2^b - 1) and zero point round(-min / scale) in [0, 2^b - 1], or
// symmetric scale = max(max |x|, 1e-5) / (2^(b-1) - 1) and codes in [-2^(b-1), 2^(b-1) - 1]; max and
// min (max |x|) times clip; rounding half to even, as torch.round.
void fake_quantize(float* x, int n, const LatentQuant& q);

}  // namespace kvb
