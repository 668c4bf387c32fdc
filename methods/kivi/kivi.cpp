// KIVI (Liu et al. 2024, arXiv:2402.02750; jy-yuan/KIVI) as KVmix's Table 2 compares against it
// ("KIVI-2bit-r64"): keys quantized per channel in groups of `group` tokens, values per token in groups
// of `group` channels, asymmetric min-max to `bits` bits with fp16 scale and minimum, and KIVI's
// residual: keys quantized only in whole blocks of `residual` tokens (the rest at full precision until
// the block fills), values of the `residual` most recent tokens at full precision. KVmix's store is
// KIVI's quantizer; KIVI is that store under one bit width for every layer and KIVI's residual rule
// (methods/kvmix, its `residual` parameter), created through the registry.
#include "harness/method/method.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

class Kivi final : public Method {
 public:
  void setup() override {
    const std::string bits = params().get("bits");
    // Checked here too: KVmix's own message would name the inner method.
    if (const int group = params().integer("group"); model().head_dim % group != 0)
      fail("method kivi: group={} does not divide the head dimension {}", group, model().head_dim);
    inner_ = MethodRegistry::get().create("kvmix",
                                          {{"layers", "low"},
                                           {"k_low", bits},
                                           {"v_low", bits},
                                           {"group", params().get("group")},
                                           {"residual", params().get("residual")},
                                           {"fused", params().get("fused")},
                                           {"gqa", gqa_mode_name(gqa())}},
                                          model());
  }
  LayerCache compress(const PrefillView& view, const Budget& budget) override { return inner_->compress(view, budget); }
  nlohmann::json layer_stats() const override { return inner_->layer_stats(); }

 private:
  std::unique_ptr<Method> inner_;
};

const bool registered = register_method(
    {.name = "kivi",
     .summary = "KIVI: 2/4-bit keys per channel and values per token, group 32, the last R tokens at full precision "
                "(Liu et al. 2024)",
     .params = {ParamSpec::choice("bits", "2", {"2", "4"}, "bits of keys and values (KIVI-2, KIVI-4)"),
                ParamSpec::integer("group", 32, 1, 4096, "tokens per key group and channels per value group"),
                ParamSpec::integer("residual", 64, 1, 1 << 20,
                                   "residual length R: a multiple of the group (the papers' r64, r128)"),
                ParamSpec::boolean("fused", true,
                                   "attention reads the codes directly; false dequantizes first (the benchmark's "
                                   "baseline)")},
     .make = [] { return std::make_unique<Kivi>(); },
     .budgeted = false});

}  // namespace
}  // namespace kvb
