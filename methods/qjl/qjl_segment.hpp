#pragma once
// QJL's cache of one KV head (Zandieh et al. 2024, arXiv:2406.03482; amirzandieh/QJL,
// models/llama2_utils_qjl.py and qjl_kernel/csrc): keys as the signs of a Johnson-Lindenstrauss sketch with
// their norms, their highest-norm channels sketched apart; values KIVI-style. README.md says what is stored.
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "harness/cache/quantized_segment.hpp"

namespace kvb {

// The projection S [head_dim, m] (QJL's proj_dir_score) and the length m_o of the outliers' sketch, which
// uses S's first m_o columns.
struct QjlSketch {
  int d = 0, m = 0, m_outlier = 0;
  std::vector<float> s;  // [d, m] row-major

  QjlSketch(int head_dim, int sketch, int outlier_sketch, std::vector<float> matrix);
  // A Gaussian [d, m] from `seed`, each block of d columns replaced by its orthonormal Q factor times
  // sqrt(d) (QJLSketch with rot=True): unbiased and with less variance than independent rows.
  static QjlSketch random(int head_dim, int sketch, int outlier_sketch, uint64_t seed);
};

// Sketched keys, in whole groups of `group` tokens: per group the `outliers` channels of the largest norm
// over its tokens; per token sign(S^T k_in) (m bits), sign(S^T k_out) over the first m_o columns, |k| and
// |k_out| as fp16.
class QjlKeys {
 public:
  QjlKeys(std::shared_ptr<const QjlSketch> sketch, int outliers, int group);
  size_t size() const { return norms_.size(); }
  size_t bytes() const;
  const QjlSketch& sketch() const { return *sk_; }
  void append(const float* k, int n, size_t stride);  // n a multiple of the group
  // scores[j * ldo + t] = QJL's estimate of q_j . k_t for the g queries q [g, d] and the tokens [t0, t1)
  // (whole groups):
  //   sqrt(pi/2)/m |k_in| <sign(S^T k_in), S^T q_in> + sqrt(pi/2)/m_o |k_out| <sign(S^T k_out), (S^T q_out)[:m_o]>
  // (the signs read once for all the queries; each query's numbers as it gets them alone).
  void logits(const float* q, int g, size_t t0, size_t t1, float* scores, size_t ldo) const;

  std::span<const uint8_t> codes(size_t t) const;          // m / 8 bytes, bit j of byte j/8 at j%8
  std::span<const uint8_t> outlier_codes(size_t t) const;  // m_o / 8 bytes
  std::span<const uint8_t> outliers(size_t group) const;   // channel indices, largest norm first
  float norm(size_t t) const;
  float outlier_norm(size_t t) const;

 private:
  std::shared_ptr<const QjlSketch> sk_;
  int outliers_, group_, bytes_, outlier_bytes_;
  std::vector<uint8_t> codes_, outlier_codes_, outlier_index_;
  std::vector<uint16_t> norms_, outlier_norms_;
};

struct QjlLayout {
  int outliers = 8;  // outlier channels per key group
  int group = 32;    // tokens per key group; channels per value group
  int buffer = 128;  // QJL's buffer_size: the newest tokens kept at full precision
  int value_bits = 2;
};

// Keys: the first n - n mod buffer of a prompt of n tokens are sketched, the rest stay at full precision
// until the buffer holds `buffer` tokens, which are then sketched at once, before the step's attention
// (QJLKeyQuantizer.update_sketch). Values: all but the newest `buffer` are quantized at prefill; a decode
// step attends with its token at full precision and the oldest of the buffer's buffer + 1 tokens is
// quantized after it, as llama2_qjl.py does.
class QjlSegment final : public Segment {
 public:
  QjlSegment(int head_dim, std::shared_ptr<const QjlSketch> sketch, const QjlLayout& layout,
             KvDtype dtype = KvDtype::F32);
  std::string format() const override;
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  // Codes, outlier indices, fp16 norms, value codes with their fp16 scales and minimums, and the
  // full-precision buffers at the cache's dtype.
  size_t bytes() const override;
  void store_as(KvDtype t) override {
    kf_.store_as(t);
    vf_.store_as(t);
  }
  void logits(const float* q, float* scores) const override { logits_group(q, 1, d_, scores); }
  void accumulate(const float* p, float* acc) const override { accumulate_group(p, 1, d_, acc); }
  // A GQA group's queries at once (the codes read once for all of them); logits cut at whole key groups
  // (the buffer with the last run), values at whole value groups.
  void logits_group(const float* q, int g, int d, float* scores) const override {
    logits_part(q, g, d, 0, size(), scores, size());
  }
  void accumulate_group(const float* p, int g, int d, float* acc) const override {
    accumulate_part(p, g, d, 0, d_, acc);
  }
  std::vector<size_t> token_cuts(int parts) const override;
  std::vector<size_t> channel_cuts(int parts, int d) const override;
  void logits_part(const float* q, int g, int d, size_t t0, size_t t1, float* scores, size_t ld) const override;
  void accumulate_part(const float* p, int g, int d, int c0, int c1, float* acc) const override;
  bool append_token(const float* k, const float* v, int32_t pos) override;

  // The prompt's n tokens (rows `stride` floats apart).
  void append(const float* k, const float* v, int n, const int32_t* pos, size_t stride);
  const QjlKeys& keys() const { return keys_; }
  size_t k_buffer() const { return size() - keys_.size(); }
  size_t v_buffer() const { return size() - values_.size(); }

 private:
  void sketch_full_buffer();
  void quantize_old_values();
  int d_;
  QjlLayout layout_;
  QjlKeys keys_;
  QuantizedValues values_;
  RowStore kf_, vf_;  // the full-precision buffers, oldest first
  std::vector<int32_t> pos_;
};

}  // namespace kvb
