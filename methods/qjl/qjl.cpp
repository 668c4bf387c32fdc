// QJL (Zandieh, Daliri and Han 2024, arXiv:2406.03482; amirzandieh/QJL) as KVmix's Tables 2 and 3 compare
// against it ("QJL-3bit"): keys as a 1-bit Johnson-Lindenstrauss sketch with their norms, the highest-norm
// channels of each group sketched apart, values 2-bit per token as KIVI's, the newest `buffer` tokens at
// full precision. Defaults are run_longbench.py's: sketches of 256 bits (512 in the first 15 layers), outlier
// sketches of 256 (128), 8 outlier channels per 32 tokens, a buffer of 128.
#include "harness/method/method.hpp"
#include "harness/util/error.hpp"
#include "methods/qjl/qjl_segment.hpp"

namespace kvb {
namespace {

class Qjl final : public Method {
 public:
  void setup() override {
    const int d = model().head_dim;
    const auto seed = uint64_t(params().integer("seed"));
    // QJL draws one sketch for the later layers and one for the first ones, each shared by all their heads.
    sketch_ = std::make_shared<QjlSketch>(
        QjlSketch::random(d, int(params().integer("sketch")), int(params().integer("outlier_sketch")), seed));
    initial_sketch_ = std::make_shared<QjlSketch>(QjlSketch::random(
        d, int(params().integer("sketch_initial")), int(params().integer("outlier_sketch_initial")), seed + 1));
    layout_ = {.outliers = int(params().integer("outliers")),
               .group = int(params().integer("group")),
               .buffer = int(params().integer("buffer")),
               .value_bits = std::stoi(params().get("value_bits"))};
    QjlSegment check(d, sketch_, layout_);  // refused now, not mid-sweep
  }

  LayerCache compress(const PrefillView& v, const Budget&) override {
    const auto& sketch = v.layer < params().integer("initial_layers") ? initial_sketch_ : sketch_;
    // Native: one store per KV head, shared by its query heads. Repeat: a copy per query head.
    const int hkv = v.n_kv_heads, d = v.head_dim, stored = stored_heads(), G = stored / hkv;
    const size_t stride = size_t(hkv) * size_t(d);
    LayerCache cache(v.n_heads, stored, d);
    for (int s = 0; s < stored; ++s) {
      auto seg = std::make_unique<QjlSegment>(d, sketch, layout_, v.kv_dtype);
      const size_t g = size_t(s / G) * size_t(d);
      seg->append(v.k + g, v.v + g, v.n_tokens, v.positions, stride);
      cache.segments(s).push_back(std::move(seg));
    }
    return cache;
  }

 private:
  std::shared_ptr<const QjlSketch> sketch_, initial_sketch_;
  QjlLayout layout_;
};

const bool registered = register_method(
    {.name = "qjl",
     .summary = "QJL: keys as 1-bit Johnson-Lindenstrauss sketches with their norms and outlier channels apart, "
                "2-bit values, the newest tokens at full precision (Zandieh et al. 2024)",
     .params = {ParamSpec::integer("sketch", 256, 8, 1 << 16, "sketch bits per key (a multiple of 8)"),
                ParamSpec::integer("sketch_initial", 512, 8, 1 << 16, "sketch bits per key in the first layers"),
                ParamSpec::integer("initial_layers", 15, 0, 1 << 16, "how many first layers use sketch_initial"),
                ParamSpec::integer("outlier_sketch", 256, 8, 1 << 16,
                                   "sketch bits of the outlier channels (at most `sketch`)"),
                ParamSpec::integer("outlier_sketch_initial", 128, 8, 1 << 16,
                                   "sketch bits of the outlier channels in the first layers"),
                ParamSpec::integer("outliers", 8, 1, 255, "outlier channels per key group"),
                ParamSpec::integer("group", 32, 1, 4096, "tokens per key group and channels per value group"),
                ParamSpec::integer("buffer", 128, 1, 1 << 20,
                                   "newest tokens at full precision (a multiple of the group)"),
                ParamSpec::choice("value_bits", "2", {"2", "4"}, "bits of the values"),
                ParamSpec::integer("seed", 42, 0, int64_t(1) << 62, "seed of the sketches")},
     .make = [] { return std::make_unique<Qjl>(); },
     .budgeted = false});

}  // namespace
}  // namespace kvb
