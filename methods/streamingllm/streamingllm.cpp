// StreamingLLM (Xiao et al.), prefill variant as in KVCache-Factory and kvpress: the first n_sink
// "attention sink" tokens plus the most recent T - n_sink tokens, in every layer and head.
#include <numeric>

#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"

namespace kvb {
namespace {

class StreamingLLM final : public Method {
 public:
  void check_budget(int tokens) const override {
    if (const int sinks = params().integer("sinks"); tokens <= sinks)
      fail("streamingllm: KV size {} must exceed the {} sink tokens", tokens, sinks);
  }
  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const int sinks = params().integer("sinks");
    check_budget(b.tokens);
    std::vector<int32_t> keep(sinks);
    std::iota(keep.begin(), keep.end(), 0);
    for (int j = v.n_tokens - (b.tokens - sinks); j < v.n_tokens; ++j) keep.push_back(j);
    return gather(v, gqa(), std::vector<std::vector<int32_t>>(stored_heads(), keep));
  }
};

const bool registered =
    register_method({.name = "streamingllm",
                     .summary = "attention sinks + most recent tokens",
                     .params = {ParamSpec::integer("sinks", 4, 0, 1024, "leading tokens always kept")},
                     .make = [] { return std::make_unique<StreamingLLM>(); }});

}  // namespace
}  // namespace kvb
