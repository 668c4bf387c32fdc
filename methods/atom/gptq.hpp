#pragma once
// Atom's GPTQ (efeslab/Atom, model/gptq.py: IST-DASLab's GPTQ with channel groups, a clip ratio and the
// outlier columns kept apart): each weight's columns quantized one at a time in the reordered order, the
// error of each pushed onto the columns not yet quantized through the inverse Hessian of the inputs, so that
// the product, not the weight, stays close. The outlier columns (last) are not quantized by GPTQ: they take
// the others' errors, then 8 bits per row (or stay as they are).
#include <cstdint>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "methods/atom/atom.hpp"

namespace kvb {

// A weight as GPTQ leaves it, in Atom's layout (rows in Atom's order, columns reordered, outliers last):
// the quantized columns as codes on the grid scale x (code - zero) of their group and row group, the
// outlier columns as 8-bit codes with a scale per row (keeper_bits 8) or as their values.
struct AtomGptqWeight {
  int rows = 0, cols = 0, keeper = 0, bits = 4;
  int group = 0;  // columns per scale (the quantized columns' count when per row)
  int channel_group = 1;
  bool keeper_int8 = true;
  std::vector<uint8_t> codes = {};             // [rows, cols - keeper]
  std::vector<float> scales = {}, zeros = {};  // [rows / channel_group, groups]
  std::vector<int8_t> keeper_codes = {};       // [rows, keeper], keeper_int8
  std::vector<float> keeper_scales = {};       // [rows], keeper_int8
  std::vector<float> keeper_values = {};       // [rows, keeper], otherwise

  int groups() const { return group > 0 ? (cols - keeper + group - 1) / group : 0; }
  // w[rows, cols] in the same layout.
  void dequantize(float* w) const;
};

// GPTQ.fasterquant (block size 128, no act-order) with Quantizer_GPTQ(perchannel, channel_group, sym,
// clip_ratio) as Atom configures it, on w[rows, cols] and h[cols, cols], the sum over calibration tokens of
// x x^T of the inputs, in the same column order (any positive multiple: GPTQ's result does not depend on it).
// Atom's quirks kept: a symmetric grid is 2^bits codes around the middle one (Quantizer_GPTQ's, not
// quant.py's), and a group's scale is found from the columns as they stood at the start of their block of 128.
AtomGptqWeight atom_gptq(std::vector<float> w, int rows, int cols, std::vector<double> h, const AtomQuant& q,
                         double percdamp);

// The artifact's form of a weight: base64 codes (two to a byte up to 4 bits) and float32 scales.
nlohmann::json atom_gptq_to_json(const AtomGptqWeight& g);
// Reads one back, checked against the shape and quantizer it must have; errors name `where`.
AtomGptqWeight atom_gptq_from_json(const nlohmann::json& j, int rows, int cols, const AtomQuant& q,
                                   const std::string& where);

}  // namespace kvb
