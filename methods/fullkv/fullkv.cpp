// FullKV: the uncompressed cache, the reference every method is compared with.
#include "harness/method/parts.hpp"

namespace kvb {
namespace {

class FullKV final : public Method {
 public:
  LayerCache compress(const PrefillView& v, const Budget&) override { return keep_all(v, gqa()); }
  bool may_exceed_budget() const override { return true; }  // keeps everything by definition
};

const bool registered =
    register_method({.name = "fullkv", .summary = "keep every prompt token (no compression)", .make = [] {
                       return std::make_unique<FullKV>();
                     }});

}  // namespace
}  // namespace kvb
