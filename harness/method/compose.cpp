#include "harness/method/compose.hpp"

#include <algorithm>
#include <limits>

#include "harness/method/parts.hpp"
#include "harness/util/error.hpp"

namespace kvb {

ParamSpec base_method_param(const std::string& default_base) {
  return ParamSpec::text("base", default_base,
                         "the selector this method wraps (kvbench list methods: 'can be wrapped')");
}

void WrapperMethod::setup() {
  std::map<std::string, std::string> given{{"gqa", gqa_mode_name(gqa())}};
  for (const auto& [k, v] : params().values())
    if (k.rfind("base.", 0) == 0) given[k.substr(5)] = v;
  base_ = MethodRegistry::get().create(params().get("base"), given, model());
  if (base_->acts_on_decode())
    fail(
        "method {}: its base {} also evicts during decoding, which would undo the wrapper's choice; turn that off "
        "(e.g. base.decode_eviction=false)",
        name(), base_->name());
  if (!base_->shares_prefill())
    fail("method {}: its base {} changes prefill itself and cannot be wrapped", name(), base_->name());
}

Selection WrapperMethod::base_select(const PrefillView& v, const Budget& budget) {
  auto s = base_->select(v, budget);
  if (!s) fail("internal: base method {} of {} returned no selection", base_->name(), name());
  return std::move(*s);
}

std::vector<std::vector<int32_t>> shrink_keep(const Selection& s, const std::vector<int>& tokens, int n_tokens) {
  const int first_window = n_tokens - s.window;
  std::vector<std::vector<int32_t>> out(s.keep.size());
  for (size_t h = 0; h < s.keep.size(); ++h) {
    std::vector<float> scored(s.scores[h].size(), -std::numeric_limits<float>::infinity());
    int prefix_kept = 0;
    for (int32_t p : s.keep[h])
      if (p < first_window) {
        scored[size_t(p)] = s.scores[h][size_t(p)];
        ++prefix_kept;
      }
    const int k = std::clamp(tokens[h] - s.window, 0, prefix_kept);
    out[h] = top_k_sorted(scored, k);
    for (int j = first_window; j < n_tokens; ++j) out[h].push_back(j);
  }
  return out;
}

std::vector<std::vector<int32_t>> extend_keep(const Selection& s, const std::vector<int>& extra, int n_tokens) {
  const int first_window = n_tokens - s.window;
  std::vector<std::vector<int32_t>> out(s.keep.size());
  for (size_t h = 0; h < s.keep.size(); ++h) {
    if (extra[h] == 0) {
      out[h] = s.keep[h];
      continue;
    }
    if (s.scores[h].size() != size_t(first_window))
      fail("internal: the base scored {} positions, expected {} outside its window", s.scores[h].size(), first_window);
    out[h] = top_k_sorted(s.scores[h], static_cast<int>(s.keep[h].size()) - s.window + extra[h]);
    for (int j = first_window; j < n_tokens; ++j) out[h].push_back(j);
  }
  return out;
}

}  // namespace kvb
