#pragma once
// Page-level eviction as the KVCrush paper's paged setting and OpenVINO GenAI's cache eviction
// (continuous_batching/cache/cache_eviction.cpp) run it. A layer's cache slots form pages of P tokens;
// the first `start` tokens and the `recent` newest full pages are never evicted, nor the last, partly
// filled page. Every slot carries a score: the attention it has received, summed over all query heads of
// the layer (one score per slot, so all heads of a layer evict the same pages) and over every query
// row since it entered the cache. When the layer holds start + middle + recent + P tokens or more, the
// lowest-scoring full pages of the evictable range go until `middle` tokens of it remain: the cache then
// holds at most start + middle + recent + P - 1 tokens.
#include <cstdint>
#include <span>
#include <string>
#include <utility>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/prefill_view.hpp"
#include "harness/util/params.hpp"

namespace kvb {

struct PagingConfig {
  int page = 0;    // P; 0: no paging
  int start = 32;  // tokens, a multiple of P
  int recent = 128;
  int middle = 512;
  // A page's score: the sum of its slots' scores, or (norm_sum, OpenVINO's default) of each slot's score
  // divided by the number of query rows that scored it.
  bool norm_sum = false;
  // Error naming `who` unless start, recent and middle are multiples of P.
  void check(const std::string& who) const;
  // From the parameters paging_params() declares, the method's recent area and the KV size; checked.
  static PagingConfig from(const Params& p, int recent, int middle, const std::string& who);
  // Whether a layer of L slots has outgrown start + middle + recent + P - 1 (then pages go).
  bool over_limit(size_t L) const { return L + 1 > size_t(start + middle + recent + page); }
  // The evictable pages [first, last) of a layer of L slots: after the start area, before the recent
  // full pages and the filling page.
  std::pair<int, int> evictable_pages(size_t L) const;
};

// The running scores of one layer's slots.
struct PageScores {
  std::vector<double> score;  // per slot
  std::vector<double> rows;   // per slot: query rows that scored it
  // The pages (ascending page indices) to evict now, empty when the layer is within its limit.
  std::vector<int> to_evict(const PagingConfig& c) const;
  // Drops the slots of the given pages (ascending).
  void erase_pages(std::span<const int> pages, int page);
};

// Per query head, the attention each slot has received (the paged KVCrush's fingerprints): [head][slot].
using HeadSlotScores = std::vector<std::vector<double>>;

// The prompt's scores from the prefill's column sums: every row that saw a slot, summed over the query
// heads (and per head into `per_head` when given).
PageScores prefill_page_scores(const PrefillView& v, HeadSlotScores* per_head);
// The positions [0, S) outside the given pages (ascending), for every stored head of the layer.
std::vector<std::vector<int32_t>> keep_outside_pages(std::span<const int> pages, int page, int S, int stored_heads);
// The layer's single dense segment per stored head, all of one length; Error naming `who` otherwise.
std::vector<DenseSegment*> paged_heads(LayerCache& cache, const std::string& who);
// One decode step (its token already appended): the attention of every query head (q: [n_heads, d],
// post-RoPE) over the slots joins ps (summed over the heads) and per_head when given; every slot's row
// count grows by one.
void add_decode_attention(const std::vector<DenseSegment*>& heads, int n_query_heads, const float* q, PageScores& ps,
                          HeadSlotScores* per_head);
// Drops the pages (ascending) from every head's segment, from ps and from per_head.
void evict_pages(const std::vector<DenseSegment*>& heads, std::span<const int> pages, int page, PageScores& ps,
                 HeadSlotScores* per_head);

// Reference of PageScores::to_evict: the same rule by sorting every candidate page.
std::vector<int> pages_to_evict_ref(const PageScores& s, const PagingConfig& c);

// The parameters a paged method declares: `paging` (P, 0 = off), `start` and `page_scores`; the recent
// area is the method's window.
std::vector<ParamSpec> paging_params();

}  // namespace kvb
