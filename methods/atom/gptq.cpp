#include "methods/atom/gptq.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <span>

#include "harness/method/artifact.hpp"
#include "harness/util/base64.hpp"
#include "harness/util/error.hpp"
#include "harness/util/linalg.hpp"

namespace kvb {

void AtomGptqWeight::dequantize(float* w) const {
  const int nq = cols - keeper, ng = groups();
  for (int r = 0; r < rows; ++r) {
    float* row = w + size_t(r) * cols;
    const size_t sg = size_t(r / channel_group) * size_t(ng);
    for (int c = 0; c < nq; ++c) {
      const size_t at = sg + size_t(c / group);
      row[c] = scales[at] * (float(codes[size_t(r) * nq + c]) - zeros[at]);
    }
    for (int c = 0; c < keeper; ++c)
      row[nq + c] = keeper_int8 ? float(keeper_codes[size_t(r) * keeper + c]) * keeper_scales[size_t(r)]
                                : keeper_values[size_t(r) * keeper + c];
  }
}

AtomGptqWeight atom_gptq(std::vector<float> w, int rows, int cols, std::vector<double> h, const AtomQuant& q,
                         double percdamp) {
  constexpr int kBlock = 128;  // fasterquant's blocksize
  const int nq = cols - q.keeper, cg = q.channel_group, rg = rows / cg;
  if (nq < 1 || rows % cg != 0 || w.size() != size_t(rows) * cols || h.size() != size_t(cols) * cols)
    fail("atom_gptq: a {} x {} weight with keeper {} and channel groups of {} ({} weights, {} Hessian entries)", rows,
         cols, q.keeper, cg, w.size(), h.size());
  AtomGptqWeight g{.rows = rows,
                   .cols = cols,
                   .keeper = q.keeper,
                   .bits = q.bits,
                   .group = q.group > 0 ? q.group : nq,
                   .channel_group = cg,
                   .keeper_int8 = q.keeper_bits < 16};
  const int ng = g.groups();
  const float maxq = float((1 << q.bits) - 1);
  g.codes.resize(size_t(rows) * nq);
  g.scales.resize(size_t(rg) * ng);
  g.zeros.resize(size_t(rg) * ng);

  // Columns contiguous: wt[c, r] = w[r, c].
  std::vector<float> wt(size_t(cols) * rows);
  for (int r = 0; r < rows; ++r)
    for (int c = 0; c < cols; ++c) wt[size_t(c) * rows + r] = w[size_t(r) * cols + c];
  // Quantizer_GPTQ.find_params over columns [c0, c1) of wt, each row group's scale and zero point.
  auto find_params = [&](int c0, int c1, int group) {
    for (int r0 = 0; r0 < rg; ++r0) {
      float lo = 0, hi = 0;
      for (int c = c0; c < c1; ++c)
        for (int r = r0 * cg; r < (r0 + 1) * cg; ++r) {
          lo = std::min(lo, wt[size_t(c) * rows + r]);
          hi = std::max(hi, wt[size_t(c) * rows + r]);
        }
      if (q.sym) {
        hi = std::max(-lo, hi);
        if (lo < 0) lo = -hi;
      }
      if (lo == 0 && hi == 0) {
        lo = -1;
        hi = 1;
      }
      const float scale = (hi - lo) * q.clip / maxq;
      g.scales[size_t(r0) * ng + group] = scale;
      g.zeros[size_t(r0) * ng + group] = q.sym ? (maxq + 1) / 2 : std::nearbyint(-lo / scale);
    }
  };
  if (q.group <= 0) find_params(0, nq, 0);  // once, before the dead columns are zeroed, as fasterquant

  double mean_diag = 0;
  for (int c = 0; c < cols; ++c) {
    double& d = h[size_t(c) * cols + c];
    if (d == 0) {  // a channel no calibration token used
      d = 1;
      std::fill_n(wt.data() + size_t(c) * rows, rows, 0.0f);
    }
    mean_diag += d;
  }
  const double damp = percdamp * mean_diag / cols;
  for (int c = 0; c < cols; ++c) h[size_t(c) * cols + c] += damp;
  if (!inverse_cholesky_upper(h, cols))
    fail("atom_gptq: the Hessian of a {} x {} weight is not positive definite even damped by {}", rows, cols, damp);
  const std::vector<float> hinv(h.begin(), h.end());

  std::vector<float> w1, err1;
  for (int i1 = 0; i1 < nq; i1 += kBlock) {
    const int i2 = std::min(i1 + kBlock, nq), count = i2 - i1;
    w1.assign(wt.begin() + ptrdiff_t(i1) * rows, wt.begin() + ptrdiff_t(i2) * rows);
    err1.assign(size_t(count) * rows, 0.0f);
    for (int i = 0; i < count; ++i) {
      const int c = i1 + i;
      // A group's parameters come from wt, which holds the block as it stood before this loop.
      if (q.group > 0 && c % q.group == 0) find_params(c, std::min(c + q.group, nq), c / q.group);
      const int group = q.group > 0 ? c / q.group : 0;
      const float d = hinv[size_t(c) * cols + c];
      float* col = w1.data() + size_t(i) * rows;
      float* err = err1.data() + size_t(i) * rows;
      for (int r = 0; r < rows; ++r) {
        const size_t at = size_t(r / cg) * ng + group;
        const float scale = g.scales[at], zero = g.zeros[at];
        const float code = std::clamp(std::nearbyint(col[r] / scale) + zero, 0.0f, maxq);
        g.codes[size_t(r) * nq + c] = uint8_t(code);
        err[r] = (col[r] - scale * (code - zero)) / d;
      }
      for (int j = i + 1; j < count; ++j) {
        const float hij = hinv[size_t(c) * cols + i1 + j];
        float* wj = w1.data() + size_t(j) * rows;
        for (int r = 0; r < rows; ++r) wj[r] -= err[r] * hij;
      }
    }
    // The rest of the columns, the outliers' included: wt[i2:] -= Hinv[i1:i2, i2:]^T Err1.
    if (i2 < cols)
      cblas_sgemm(CblasRowMajor, CblasTrans, CblasNoTrans, cols - i2, rows, count, -1.0f,
                  hinv.data() + size_t(i1) * cols + i2, cols, err1.data(), rows, 1.0f, wt.data() + size_t(i2) * rows,
                  rows);
  }

  const int k = q.keeper;
  if (g.keeper_int8) {
    g.keeper_codes.resize(size_t(rows) * k);
    g.keeper_scales.resize(size_t(rows));
  } else {
    g.keeper_values.resize(size_t(rows) * k);
  }
  std::vector<float> row(static_cast<size_t>(k));
  for (int r = 0; r < rows; ++r) {
    for (int c = 0; c < k; ++c) row[size_t(c)] = wt[size_t(nq + c) * rows + r];
    if (!g.keeper_int8) {
      std::copy(row.begin(), row.end(), g.keeper_values.begin() + ptrdiff_t(r) * k);
      continue;
    }
    const AtomGrid grid = atom_group_grid(row.data(), row.size(), 8, true, 1.0f);
    g.keeper_scales[size_t(r)] = grid.scale;
    for (int c = 0; c < k; ++c) g.keeper_codes[size_t(r) * k + c] = int8_t(grid.code(row[size_t(c)]));
  }
  return g;
}

namespace {

std::string pack_codes(const std::vector<uint8_t>& codes, int bits) {
  if (bits > 4) return base64_encode(codes);
  std::vector<uint8_t> packed((codes.size() + 1) / 2, 0);
  for (size_t i = 0; i < codes.size(); ++i) packed[i / 2] |= uint8_t(codes[i] << (i % 2 ? 4 : 0));
  return base64_encode(packed);
}

std::vector<uint8_t> unpack_codes(const std::vector<uint8_t>& bytes, size_t n, int bits, const std::string& where) {
  const size_t want = bits > 4 ? n : (n + 1) / 2;
  if (bytes.size() != want) fail("{}: field 'codes' holds {} bytes; expected {}", where, bytes.size(), want);
  std::vector<uint8_t> codes = bits > 4 ? bytes : std::vector<uint8_t>(n);
  if (bits <= 4)
    for (size_t i = 0; i < n; ++i) codes[i] = uint8_t((bytes[i / 2] >> (i % 2 ? 4 : 0)) & 0xF);
  for (uint8_t c : codes)
    if (c >= (1u << bits)) fail("{}: field 'codes' holds {}, outside {} bits", where, int(c), bits);
  return codes;
}

}  // namespace

nlohmann::json atom_gptq_to_json(const AtomGptqWeight& g) {
  nlohmann::json j = {{"codes", pack_codes(g.codes, g.bits)},
                      {"scales", floats_to_base64(g.scales)},
                      {"zeros", floats_to_base64(g.zeros)}};
  if (g.keeper_int8) {
    j["keeper_codes"] = base64_encode(
        std::span<const uint8_t>(reinterpret_cast<const uint8_t*>(g.keeper_codes.data()), g.keeper_codes.size()));
    j["keeper_scales"] = floats_to_base64(g.keeper_scales);
  } else {
    j["keeper_values"] = floats_to_base64(g.keeper_values);
  }
  return j;
}

AtomGptqWeight atom_gptq_from_json(const nlohmann::json& j, int rows, int cols, const AtomQuant& q,
                                   const std::string& where) {
  if (!j.is_object()) fail("{}: expected an object with the codes and scales of a {} x {} weight", where, rows, cols);
  const int nq = cols - q.keeper;
  AtomGptqWeight g{.rows = rows,
                   .cols = cols,
                   .keeper = q.keeper,
                   .bits = q.bits,
                   .group = q.group > 0 ? q.group : nq,
                   .channel_group = q.channel_group,
                   .keeper_int8 = q.keeper_bits < 16};
  if (!j.contains("codes") || !j["codes"].is_string()) fail("{}: field 'codes' missing (base64)", where);
  g.codes =
      unpack_codes(base64_decode(j["codes"].get<std::string>(), where + ".codes"), size_t(rows) * nq, q.bits, where);
  const size_t params = size_t(rows / q.channel_group) * size_t(g.groups());
  g.scales = artifact_floats(j, "scales", params, where);
  g.zeros = artifact_floats(j, "zeros", params, where);
  if (g.keeper_int8) {
    if (!j.contains("keeper_codes") || !j["keeper_codes"].is_string())
      fail("{}: field 'keeper_codes' missing (base64 int8)", where);
    const std::vector<uint8_t> b = base64_decode(j["keeper_codes"].get<std::string>(), where + ".keeper_codes");
    if (b.size() != size_t(rows) * q.keeper)
      fail("{}: field 'keeper_codes' holds {} bytes; expected {}", where, b.size(), size_t(rows) * q.keeper);
    g.keeper_codes.assign(b.begin(), b.end());
    g.keeper_scales = artifact_floats(j, "keeper_scales", size_t(rows), where);
  } else {
    g.keeper_values = artifact_floats(j, "keeper_values", size_t(rows) * q.keeper, where);
  }
  return g;
}

}  // namespace kvb
