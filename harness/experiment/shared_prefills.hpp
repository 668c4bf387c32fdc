#pragma once
// Prefills of many prompts that share prefixes (NIAH's lengths and depths cut from one haystack, RULER's
// haystacks, LongBench questions on one context), each shared prefix computed once: the prompts run in
// the lexicographic order of their token ids, so the prefixes the later prompts share are nested, and
// a stack keeps the captures of those still needed. Each prompt continues the longest kept prefix
// (Engine::prefill_capture from a prefix); the captures equal fresh ones, every attention row computed
// as in the whole prompt's prefill and the accumulated attention summed in two parts.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <vector>

#include "harness/engine/prefill_view.hpp"

namespace kvb {

class Engine;
struct PrefillCapture;

class SharedPrefills {
 public:
  // The order to run `prompts` in: by their ids, ties (equal prompts) in their given order.
  static std::vector<size_t> order(const std::vector<std::span<const int32_t>>& prompts);

  // `prompts` in the order they will be asked for; each capture keeps what `needs` asks. The kept
  // prefixes hold at most `max_bytes` (the prompt being served aside): a prefix that does not fit is not
  // kept, and a later prompt starts from a shorter one. On a backend that cannot continue a prefill
  // every prompt is prefilled whole.
  SharedPrefills(Engine& engine, const PrefillNeeds& needs, std::vector<std::span<const int32_t>> prompts,
                 size_t max_bytes);
  ~SharedPrefills();

  // The capture of prompt i; prompts are asked for once each, in order.
  std::shared_ptr<const PrefillCapture> next();
  // Passes over the next prompt without prefilling it (its cells turned out to need none); a later prompt
  // may then continue a shorter prefix than it would have.
  void skip();

  size_t tokens_total() const { return total_; }          // prompt tokens of the prompts served so far
  size_t tokens_prefilled() const { return prefilled_; }  // of them, those computed

  // The limit `max_bytes` defaults to: $KVBENCH_PREFIX_CACHE_MB (0 keeps no prefix), else 4 GiB.
  static size_t default_max_bytes();

 private:
  // The index of the next prompt, the stack cut to its prefixes.
  size_t advance();

  Engine& engine_;
  PrefillNeeds needs_;
  std::vector<std::span<const int32_t>> prompts_;
  std::vector<size_t> lcp_;  // lcp_[i]: tokens prompt i shares with prompt i - 1 (lcp_[0] = 0)
  size_t max_bytes_, kept_bytes_ = 0, served_ = 0, total_ = 0, prefilled_ = 0;
  std::vector<std::shared_ptr<const PrefillCapture>> stack_;  // nested prefixes of the last prompt served
};

}  // namespace kvb
