#pragma once
// Atom's quantizers (efeslab/Atom, model/quant.py and model/qLinearLayer.py), as the method applies them
// to every linear product of the decoder layers (README.md): round-to-nearest on a uniform integer grid,
// activations per token in groups of channels, weights per group of input channels shared by a few
// consecutive output rows, the `keeper` last channels in the reordered order (the outliers) kept at 8 bits.
#include <algorithm>
#include <array>
#include <cmath>
#include <cstddef>
#include <span>
#include <string>
#include <vector>

#include "harness/engine/prefill_view.hpp"
#include "harness/model/config.hpp"

namespace kvb {

// Atom's quantize_tensor on one group x[0, n) in place: symmetric (codes in [-2^(b-1), 2^(b-1) - 1], scale
// max|x| x clip / (2^(b-1) - 1)) or asymmetric (codes in [0, 2^b - 1] with a rounded zero point, the range
// clipped at both ends); rounding half to even, as torch.round.
void atom_quantize_group(float* x, size_t n, int bits, bool sym, float clip);
// The grid atom_quantize_group puts x[0, n) on: value (code - base) x scale, code in [lo, hi].
struct AtomGrid {
  float scale = 1, base = 0, lo = 0, hi = 0;
  float code(float x) const { return std::clamp(std::nearbyint(x / scale) + base, lo, hi); }
};
AtomGrid atom_group_grid(const float* x, size_t n, int bits, bool sym, float clip);

// What one kind of tensor is quantized with: bits, channels per group (0: the whole row), symmetric, clip
// ratio, and the outlier channels at the end of the reordered row, kept at 8 bits (symmetric, one scale per
// row, no clip) or, with keeper_bits 16, as they are.
struct AtomQuant {
  int bits = 4;
  int group = 128;
  bool sym = true;
  float clip = 1.0f;
  int keeper = 0;
  int keeper_bits = 8;
  // Rows (weights: consecutive output rows) sharing each group's scale.
  int channel_group = 1;
};

// Atom's quantize_activation_wrapper on rows x[n, cols] given in their reordered order: the keeper
// channels quantized apart, set to zero for the grouped quantization of the row, then put back.
void atom_quantize_rows(float* x, int n, int cols, const AtomQuant& q);
// QLinearLayer.quant on a weight w[rows, cols] whose columns are in the reordered order: the keeper columns
// per row at 8 bits, the rest (keeper zeroed) in groups of `group` columns over `channel_group` rows.
void atom_quantize_weight(float* w, int rows, int cols, const AtomQuant& q);

// The width of the activations entering a site: the hidden size, the attention output's, the MLP's.
int atom_site_width(const ModelConfig& m, MatrixInput s);
inline constexpr MatrixInput kAtomSites[] = {MatrixInput::Attention, MatrixInput::AttentionOutput, MatrixInput::Mlp,
                                             MatrixInput::MlpHidden};

// Layer l's reorder index of each input site: the channels in ascending order of their calibration
// statistic (outliers last), as Atom's get_reorder_index; empty sites keep the model's order.
struct AtomReorder {
  std::vector<std::array<std::vector<int>, 4>> layers;  // [layer][MatrixInput]
  const std::vector<int>& of(int layer, MatrixInput s) const { return layers[size_t(layer)][size_t(s)]; }
};

// w[rows, cols] with its rows in the order `rows` gives and its columns in the order `cols` gives (either
// empty: as they are) into `out`; atom_scatter puts such a copy back.
void atom_gather(const float* w, int rows, int cols, std::span<const int> row_order, std::span<const int> col_order,
                 std::vector<float>& out);
void atom_scatter(const float* ordered, int rows, int cols, std::span<const int> row_order,
                  std::span<const int> col_order, float* w);
// The order of layer l's matrix m's rows as Atom quantizes them, rows sharing a scale being neighbours there
// (empty: the model file's): gate's and up's in down's reordered input order, q's and k's in the Hugging Face
// checkpoint's where the file is a GGUF with llama.cpp's interleaved RoPE rows.
std::vector<int> atom_row_order(const ModelConfig& m, const AtomReorder& reorder, int layer, Matrix mat);

// Rows x[n, cols] quantized in the order `perm` gives (empty: as they are), put back in place.
void atom_quantize_rows_in_order(float* x, int n, int cols, const std::vector<int>& perm, const AtomQuant& q,
                                 std::vector<float>& scratch);
// A weight quantized with its rows and columns in the orders given (empty: as they are), put back in place.
void atom_quantize_weight_in_order(float* w, int rows, int cols, std::span<const int> row_order,
                                   std::span<const int> col_order, const AtomQuant& q);

// The permutation sorting `stat` ascending (ties by channel), Atom's torch.sort of the Hessian diagonal.
std::vector<int> atom_order(std::span<const double> stat);

}  // namespace kvb
