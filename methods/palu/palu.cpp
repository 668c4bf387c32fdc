// Palu (Chang et al. 2025, arXiv:2407.21118) as MixedDimKV's Table 9 and DynaKV's Tables 1-4 compare
// against it: K and V projected to a low rank, the rank-r latent cached and the keys rebuilt (then
// rotated) at attention time. With one rank for all layers (J-LRD: the layer's KV heads jointly) the
// whitened SVD of k_proj and v_proj is the projection onto the top eigenvectors of the uncentred
// second moment of the layer's pre-RoPE keys (values) over the calibration text (README.md §1), which
// is DynaKV's fixed-rank path on its PCA basis; Palu runs it on a basis of its own calibration.
#include <fmt/format.h>

#include <algorithm>
#include <cmath>
#include <filesystem>

#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

constexpr const char* kBasisDir = "palu";

int palu_rank(double ratio, int multiple, int dims) {
  // Palu's rank_search (rounding_search_result): max(1, round(ratio dims / multiple)) multiples, Python's
  // round, i.e. halves to even; never more than the layer has.
  const double blocks = std::nearbyint(ratio * dims / multiple);
  return std::min(dims, std::max(1, static_cast<int>(blocks)) * multiple);
}

class Palu final : public Method {
 public:
  void setup() override {
    std::string basis = params().get("basis");
    if (basis.empty()) basis = default_artifact_path(kBasisDir, model());
    if (!std::filesystem::exists(basis))
      fail(
          "{}: no such palu basis; make one with `kvbench calibrate palu MODEL --text FILES` (the paper fits it on "
          "WikiText-2)",
          basis);
    const int dims = model().n_kv_heads * model().head_dim;
    const int rank = palu_rank(params().get_float("rank_ratio"), params().integer("rank_multiple"), dims);
    inner_ = MethodRegistry::get().create("dynakv",
                                          {{"fixed_rate", fmt::format("{}", static_cast<double>(rank) / dims)},
                                           {"pca", basis},
                                           {"gqa", gqa_mode_name(gqa())}},
                                          model());
  }
  PrefillNeeds needs() const override { return inner_->needs(); }
  KvTransform* kv_transform() override { return inner_->kv_transform(); }
  LayerCache compress(const PrefillView& view, const Budget& budget) override { return inner_->compress(view, budget); }
  nlohmann::json artifacts() const override { return inner_->artifacts(); }
  nlohmann::json layer_stats() const override { return inner_->layer_stats(); }

 private:
  std::unique_ptr<Method> inner_;
};

// DynaKV's PCA step (through the registry) on Palu's text and sequence length, into Palu's artifact.
void calibrate(CalibrationContext& ctx) {
  if (ctx.out.empty()) ctx.out = default_artifact_path(kBasisDir, ctx.model.config());
  MethodRegistry::get().offline_step("calibrate", "dynakv-pca").run(ctx);
}

const bool registered = register_method(
    {.name = "palu",
     .summary = "low-rank K/V (Palu J-LRD, one rank for every layer): the rank-r latent cached, keys rebuilt then "
                "rotated (Chang et al. 2025)",
     .params = {ParamSpec::real("rank_ratio", 0.5, 0.001, 1.0,
                                "share of the layer's K (and V) dimensions kept: the papers' 50%, 40%, 30%, 20%"),
                ParamSpec::integer("rank_multiple", 32, 1, 4096,
                                   "the rank rounded to a multiple of this, as Palu's rank search rounds it (1: the "
                                   "share's nearest integer)")
                    .added_later("1"),
                ParamSpec::text("basis", "", "basis of kvbench calibrate palu (default: this model's)")},
     .make = [] { return std::make_unique<Palu>(); },
     .steps = {{.command = "calibrate",
                .summary = "Palu's low-rank basis per layer, K and V, from the calibration text (the paper: "
                           "WikiText-2)",
                .options = {ParamSpec::text("text", "",
                                            "text files or directories (the paper: WikiText-2; default: "
                                            "set-up's data/python-docs)"),
                            ParamSpec::integer("seq_len", 2048, 16, 1 << 20, "tokens per sequence (BOS + text)"),
                            ParamSpec::integer("tokens", 524288, 1, 1L << 40,
                                               "calibration tokens (Palu's whitening: 256 x 2,048)"),
                            id_sequences_option()},
                .run = calibrate}},
     .budgeted = false,
     .changes_model = true});

}  // namespace
}  // namespace kvb
