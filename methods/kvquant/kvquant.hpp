#pragma once
// KVQuant's cache (kvquant.cpp): the segment of one KV head, and the quantizers of a model as its
// calibration artifact holds them.
#include <memory>
#include <nlohmann/json.hpp>
#include <string>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/model/config.hpp"
#include "methods/kvquant/quantizer.hpp"

namespace kvb {

// Every layer's quantizers for one bit width and outlier share.
struct KvquantQuantizers {
  int bits = 3;
  double outliers = 0.01;
  std::vector<KvquantLayer> layers;
};

// The artifact's body (without header), and back; `where` names the file in errors.
nlohmann::json kvquant_json(const KvquantQuantizers& q);
KvquantQuantizers kvquant_from_json(const nlohmann::json& body, const ModelConfig& model, const std::string& where);

// The rows a layer's latest quantizer call produced (the prompt at prefill, one token per decode step),
// which the layer's segments take their codes from as the tokens enter the cache.
struct KvquantBatch {
  std::vector<int32_t> positions;
  std::vector<KvquantRow> k, v;
};

// One cache head: per token the codes of its channels packed at `bits`, its outliers (channel and fp16
// value, KVQuant's sparse rows), and the row's value offset and range; attention reads the decoded
// rows, the keys after RoPE, as the reference's simulated quantization does (RowSegment's reads: a GQA
// group at once, cut over threads).
class KvquantSegment final : public RowSegment {
 public:
  // `first`: the head's first channel in the layer's row of n_kv_heads x head_dim.
  KvquantSegment(std::shared_ptr<const KvquantLayer> q, std::shared_ptr<const KvquantBatch> batch, int bits,
                 double outliers, int head_dim, int first);
  std::string format() const override;
  size_t size() const override { return pos_.size(); }
  std::span<const int32_t> positions() const override { return pos_; }
  // Packed codes of keys and values, outliers (4-byte channel + fp16 value) with a 4-byte row start per
  // token and kind, the fp32 value offset and range: the format, not the decoded rows attention reads.
  size_t bytes() const override;
  // k and v: the token's decoded rows (the key after RoPE); its codes come from the layer's batch.
  bool append_token(const float* k, const float* v, int32_t pos) override;
  void store_as(KvDtype) override {}

  // Token t read back from its codes alone: the pre-RoPE key and the value [head_dim].
  void decode(size_t t, float* k_pre_rope, float* v) const;
  size_t outliers() const { return k_out_.size() + v_out_.size(); }

 private:
  void pack(const KvquantRow& row, std::vector<uint8_t>& codes, std::vector<KvquantOutlier>& out,
            std::vector<uint32_t>& starts) const;
  KvquantRow unpack(const std::vector<uint8_t>& codes, const std::vector<KvquantOutlier>& out,
                    const std::vector<uint32_t>& starts, size_t t) const;

  std::shared_ptr<const KvquantLayer> q_;
  std::shared_ptr<const KvquantBatch> batch_;
  int bits_, d_, first_;
  double share_;
  size_t row_bytes_;
  std::vector<uint8_t> k_codes_, v_codes_;           // [token][row_bytes_]
  std::vector<KvquantOutlier> k_out_, v_out_;        // by token, then channel
  std::vector<uint32_t> k_starts_{0}, v_starts_{0};  // each token's first outlier, and the end
  std::vector<float> v_offset_, v_range_;
  std::vector<int32_t> pos_;
};

}  // namespace kvb
