#include "harness/method/paging.hpp"

#include <algorithm>
#include <cmath>
#include <numeric>
#include <tuple>

#include "harness/util/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

void PagingConfig::check(const std::string& who) const {
  if (page <= 0) fail("{}: page size {} (expected > 0)", who, page);
  for (const auto& [name, v] : {std::pair{"start", start}, {"recent (window)", recent}, {"middle (KV size)", middle}})
    if (v < 0 || v % page != 0) fail("{}: {} = {} tokens must be a multiple of the page size {}", who, name, v, page);
  if (middle == 0) fail("{}: the evictable area (KV size) must hold at least one page of {} tokens", who, page);
}

PagingConfig PagingConfig::from(const Params& p, int recent, int middle, const std::string& who) {
  PagingConfig c{.page = p.integer("paging"),
                 .start = p.integer("start"),
                 .recent = recent,
                 .middle = middle,
                 .norm_sum = p.get("page_scores") == "norm_sum"};
  c.check(who);
  return c;
}

std::pair<int, int> PagingConfig::evictable_pages(size_t L) const {
  return {start / page, static_cast<int>(L / size_t(page)) - recent / page};
}

namespace {

// [first, last) pages of the evictable range of L slots, and how many of them must go.
struct Range {
  int first = 0, last = 0, evict = 0;
};
Range evictable(size_t L, const PagingConfig& c) {
  Range r;
  // OpenVINO's trigger: nothing happens while L <= max_cache_size + P - 1.
  if (!c.over_limit(L)) return r;
  std::tie(r.first, r.last) = c.evictable_pages(L);
  r.evict = std::max(0, r.last - r.first - c.middle / c.page);
  return r;
}

double page_score(const PageScores& s, int page, int P, bool norm) {
  double sum = 0;
  for (int i = 0; i < P; ++i) {
    const size_t t = size_t(page) * P + i;
    sum += norm ? s.score[t] / std::max(1.0, s.rows[t]) : s.score[t];
  }
  return sum;
}

}  // namespace

std::vector<int> PageScores::to_evict(const PagingConfig& c) const {
  const Range r = evictable(score.size(), c);
  if (r.evict == 0) return {};
  std::vector<std::pair<double, int>> pages;
  for (int p = r.first; p < r.last; ++p) pages.emplace_back(page_score(*this, p, c.page, c.norm_sum), p);
  // The lowest scores go; ties: the lower page first.
  std::nth_element(pages.begin(), pages.begin() + (r.evict - 1), pages.end());
  std::vector<int> out;
  const auto cut = pages[size_t(r.evict - 1)];
  for (const auto& e : pages)
    if (e < cut) out.push_back(e.second);
  out.push_back(cut.second);
  std::sort(out.begin(), out.end());
  return out;
}

std::vector<int> pages_to_evict_ref(const PageScores& s, const PagingConfig& c) {
  const Range r = evictable(s.score.size(), c);
  std::vector<int> pages(static_cast<size_t>(std::max(0, r.last - r.first)));
  std::iota(pages.begin(), pages.end(), r.first);
  std::stable_sort(pages.begin(), pages.end(), [&](int a, int b) {
    return page_score(s, a, c.page, c.norm_sum) < page_score(s, b, c.page, c.norm_sum);
  });
  pages.resize(size_t(r.evict));
  std::sort(pages.begin(), pages.end());
  return pages;
}

void PageScores::erase_pages(std::span<const int> pages, int page) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    const auto b = static_cast<std::ptrdiff_t>(*it) * page;
    score.erase(score.begin() + b, score.begin() + b + page);
    rows.erase(rows.begin() + b, rows.begin() + b + page);
  }
}

PageScores prefill_page_scores(const PrefillView& v, HeadSlotScores* per_head) {
  if (!v.attn_colsum) fail("internal: the prefill did not gather accumulated attention");
  const int S = v.n_tokens;
  PageScores ps;
  ps.score.assign(size_t(S), 0.0);
  ps.rows.resize(size_t(S));
  if (per_head) per_head->assign(size_t(v.n_heads), std::vector<double>(size_t(S), 0.0));
  for (int h = 0; h < v.n_heads; ++h)
    for (int t = 0; t < S; ++t) {
      const double a = v.attn_colsum[size_t(h) * S + t];
      ps.score[size_t(t)] += a;
      if (per_head) (*per_head)[size_t(h)][size_t(t)] = a;
    }
  for (int t = 0; t < S; ++t) ps.rows[size_t(t)] = S - t;
  return ps;
}

std::vector<std::vector<int32_t>> keep_outside_pages(std::span<const int> pages, int page, int S, int stored_heads) {
  std::vector<int32_t> keep;
  size_t g = 0;
  for (int t = 0; t < S; ++t) {
    while (g < pages.size() && (pages[g] + 1) * page <= t) ++g;
    if (g < pages.size() && pages[g] * page <= t) continue;
    keep.push_back(t);
  }
  return std::vector<std::vector<int32_t>>(size_t(stored_heads), keep);
}

std::vector<DenseSegment*> paged_heads(LayerCache& cache, const std::string& who) {
  std::vector<DenseSegment*> heads;
  for (int s = 0; s < cache.n_cache_heads(); ++s) {
    auto& segs = cache.segments(s);
    if (segs.size() != 1 || segs[0]->format() != "dense")
      fail("{} needs a single dense segment per head, found {}", who, segs.size());
    heads.push_back(static_cast<DenseSegment*>(segs[0].get()));
    if (heads.back()->size() != heads[0]->size()) fail("internal: {}: heads of different lengths", who);
  }
  return heads;
}

void add_decode_attention(const std::vector<DenseSegment*>& heads, int n_query_heads, const float* q, PageScores& ps,
                          HeadSlotScores* per_head) {
  const size_t n = heads[0]->size();
  const int d = heads[0]->head_dim(), group = n_query_heads / static_cast<int>(heads.size());
  ps.score.resize(n, 0.0);  // the new token
  ps.rows.resize(n, 0.0);
  for (double& r : ps.rows) r += 1.0;
  if (per_head)
    for (auto& h : *per_head) h.resize(n, 0.0);
  std::vector<float> logits(n);
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  for (int h = 0; h < n_query_heads; ++h) {
    heads[size_t(h / group)]->logits(q + size_t(h) * d, logits.data());
    for (auto& x : logits) x *= scale;
    softmax_inplace(logits.data(), static_cast<int>(n));
    for (size_t t = 0; t < n; ++t) {
      ps.score[t] += logits[t];
      if (per_head) (*per_head)[size_t(h)][t] += logits[t];
    }
  }
}

void evict_pages(const std::vector<DenseSegment*>& heads, std::span<const int> pages, int page, PageScores& ps,
                 HeadSlotScores* per_head) {
  for (auto it = pages.rbegin(); it != pages.rend(); ++it) {
    for (DenseSegment* seg : heads)
      for (int i = page - 1; i >= 0; --i) seg->erase(size_t(*it) * page + i);
    if (per_head)
      for (auto& h : *per_head) {
        const auto b = static_cast<std::ptrdiff_t>(*it) * page;
        h.erase(h.begin() + b, h.begin() + b + page);
      }
  }
  ps.erase_pages(pages, page);
}

std::vector<ParamSpec> paging_params() {
  return {ParamSpec::integer("paging", 0, 0, 4096,
                             "page size P in tokens: evict whole pages, layer-wide, during prefill and decoding "
                             "(0: token level); the KV size is then the evictable middle area")
              .added_later(),
          ParamSpec::integer("start", 32, 0, 1 << 20, "with paging: the first tokens, never evicted").added_later(),
          ParamSpec::choice("page_scores", "sum", {"sum", "norm_sum"},
                            "with paging: a page's score is the sum of its slots' accumulated attention, or of "
                            "each divided by the query rows that scored it (OpenVINO's default)")
              .added_later()};
}

}  // namespace kvb
