#include "harness/experiment/shared_prefills.hpp"

#include <algorithm>
#include <cstdlib>
#include <numeric>
#include <string>

#include "harness/engine/engine.hpp"
#include "harness/util/error.hpp"

namespace kvb {

namespace {

size_t common_prefix(std::span<const int32_t> a, std::span<const int32_t> b) {
  const size_t n = std::min(a.size(), b.size());
  return size_t(std::mismatch(a.begin(), a.begin() + std::ptrdiff_t(n), b.begin()).first - a.begin());
}

size_t capture_bytes(const PrefillCapture& c) {
  size_t floats = c.logits.size();
  for (const auto* per_layer : {&c.k, &c.v, &c.k_pre_rope, &c.q_window, &c.attn_colsum})
    for (const auto& x : *per_layer) floats += x.size();
  return floats * sizeof(float);
}

}  // namespace

std::vector<size_t> SharedPrefills::order(const std::vector<std::span<const int32_t>>& prompts) {
  std::vector<size_t> idx(prompts.size());
  std::iota(idx.begin(), idx.end(), size_t(0));
  std::stable_sort(idx.begin(), idx.end(), [&](size_t a, size_t b) {
    return std::lexicographical_compare(prompts[a].begin(), prompts[a].end(), prompts[b].begin(), prompts[b].end());
  });
  return idx;
}

size_t SharedPrefills::default_max_bytes() {
  if (const char* mb = std::getenv("KVBENCH_PREFIX_CACHE_MB")) {
    char* end = nullptr;
    const unsigned long long v = std::strtoull(mb, &end, 10);
    if (!*mb || *end) fail("KVBENCH_PREFIX_CACHE_MB={}: expected a whole number of MiB (0 keeps no prefix)", mb);
    return size_t(v) << 20;
  }
  return size_t(4) << 30;
}

SharedPrefills::SharedPrefills(Engine& engine, const PrefillNeeds& needs, std::vector<std::span<const int32_t>> prompts,
                               size_t max_bytes)
    : engine_(engine), needs_(needs), prompts_(std::move(prompts)), lcp_(prompts_.size(), 0), max_bytes_(max_bytes) {
  for (size_t i = 1; i < prompts_.size(); ++i) lcp_[i] = common_prefix(prompts_[i - 1], prompts_[i]);
}

SharedPrefills::~SharedPrefills() = default;

size_t SharedPrefills::advance() {
  if (served_ >= prompts_.size()) fail("internal: SharedPrefills asked for more prompts than it was given");
  const size_t i = served_++;
  // What the stack holds are prefixes of the previous prompt; those no longer than the part it shares
  // with this one are prefixes of this one too.
  while (!stack_.empty() && size_t(stack_.back()->n_tokens) > lcp_[i]) {
    kept_bytes_ -= capture_bytes(*stack_.back());
    stack_.pop_back();
  }
  return i;
}

void SharedPrefills::skip() { advance(); }

std::shared_ptr<const PrefillCapture> SharedPrefills::next() {
  const size_t i = advance();
  const std::span<const int32_t> ids = prompts_[i];
  const size_t n = ids.size();
  total_ += n;
  if (!stack_.empty() && size_t(stack_.back()->n_tokens) == n) return stack_.back();  // the same prompt again
  const bool reuse = engine_.continues_prefill() && max_bytes_ > 0;
  std::shared_ptr<const PrefillCapture> from = reuse && !stack_.empty() ? stack_.back() : nullptr;
  const size_t start = from ? size_t(from->n_tokens) : 0;
  // The prefixes later prompts will continue: prompt j > i shares min(lcp_[i + 1..j]) tokens with this
  // one (the prompts are sorted), so these are the running minima, computed on the way to the whole.
  std::vector<size_t> stops;
  if (reuse)
    for (size_t j = i + 1, m = n; j < prompts_.size() && m > start; ++j) {
      m = std::min(m, lcp_[j]);
      if (m > start && (stops.empty() || stops.back() != m)) stops.push_back(m);
    }
  const bool keep_whole = !stops.empty() && stops.front() == n;
  std::reverse(stops.begin(), stops.end());
  if (stops.empty() || stops.back() != n) stops.push_back(n);
  for (size_t t : stops) {
    auto c = std::make_shared<const PrefillCapture>(engine_.prefill_capture(ids.first(t), needs_, nullptr, from.get()));
    prefilled_ += t - (from ? size_t(from->n_tokens) : 0);
    if ((t < n || keep_whole) && kept_bytes_ + capture_bytes(*c) <= max_bytes_) {
      kept_bytes_ += capture_bytes(*c);
      stack_.push_back(c);
    }
    from = std::move(c);
  }
  return from;
}

}  // namespace kvb
