#include "harness/method/parts.hpp"

#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <functional>
#include <limits>
#include <numeric>

#include "harness/util/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {

Pooling parse_pooling(const std::string& s) {
  if (s == "max") return Pooling::Max;
  if (s == "avg") return Pooling::Avg;
  if (s == "none") return Pooling::None;
  fail("pooling '{}' is not one of max, avg, none", s);
}

namespace {

void check_window(const PrefillView& v, int w) {
  if (w <= 0 || w >= v.n_tokens)
    fail("observation window {} must be between 1 and the prompt length - 1 ({})", w, v.n_tokens - 1);
  if (v.window < w || !v.q_window)
    fail("internal: the prefill provided {} window queries, the method needs {}", v.window, w);
}

}  // namespace

HeadScores window_attention_scores(const PrefillView& v, int w, WindowReduce reduce) {
  check_window(v, w);
  const int S = v.n_tokens, d = v.head_dim, hq = v.n_heads, hkv = v.n_kv_heads, G = hq / hkv;
  const int prefix = S - w;
  const float scale = 1.0f / std::sqrt(static_cast<float>(d));
  HeadScores out(hq, std::vector<float>(prefix, 0.0f));
#pragma omp parallel
  {
    std::vector<float> z(size_t(w) * S);
#pragma omp for schedule(dynamic, 1)
    for (int h = 0; h < hq; ++h) {
      // Rows of the last w queries of head h against all keys of its KV head.
      const float* q = v.q_window + (size_t(v.window - w) * hq + h) * d;
      const float* k = v.k + size_t(h / G) * d;
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, w, S, d, scale, q, hq * d, k, hkv * d, 0.0f, z.data(), S);
      for (int i = 0; i < w; ++i) {
        float* row = z.data() + size_t(i) * S;
        softmax_inplace(row, prefix + i + 1);  // causal inside the window
        for (int j = 0; j < prefix; ++j) out[h][j] += row[j];
      }
      if (reduce == WindowReduce::Mean)
        for (auto& x : out[h]) x /= static_cast<float>(w);
    }
  }
  return out;
}

HeadScores window_attention_scores_ref(const PrefillView& v, int w, WindowReduce reduce) {
  check_window(v, w);
  const int S = v.n_tokens, d = v.head_dim, hq = v.n_heads, hkv = v.n_kv_heads, G = hq / hkv;
  const int prefix = S - w;
  HeadScores out(hq, std::vector<float>(prefix, 0.0f));
  for (int h = 0; h < hq; ++h) {
    std::vector<double> acc(prefix, 0.0);
    for (int i = 0; i < w; ++i) {
      const float* q = v.q_window + (size_t(v.window - w + i) * hq + h) * d;
      const int visible = prefix + i + 1;
      std::vector<double> z(visible);
      double m = -std::numeric_limits<double>::infinity();
      for (int j = 0; j < visible; ++j) {
        const float* k = v.k + (size_t(j) * hkv + h / G) * d;
        double dot = 0;
        for (int c = 0; c < d; ++c) dot += static_cast<double>(q[c]) * k[c];
        z[j] = dot / std::sqrt(static_cast<double>(d));
        m = std::max(m, z[j]);
      }
      double sum = 0;
      for (auto& x : z) sum += (x = std::exp(x - m));
      for (int j = 0; j < prefix; ++j) acc[j] += z[j] / sum;
    }
    for (int j = 0; j < prefix; ++j) out[h][j] = static_cast<float>(reduce == WindowReduce::Mean ? acc[j] / w : acc[j]);
  }
  return out;
}

std::vector<float> pool1d(const std::vector<float>& x, int kernel, Pooling p) {
  if (p == Pooling::None || kernel <= 1) return x;
  if (kernel % 2 == 0) fail("pooling kernel must be odd, got {}", kernel);
  const int n = static_cast<int>(x.size()), r = kernel / 2;
  std::vector<float> y(n);
  for (int j = 0; j < n; ++j) {
    const int lo = std::max(0, j - r), hi = std::min(n - 1, j + r);
    if (p == Pooling::Max) {
      y[j] = *std::max_element(x.begin() + lo, x.begin() + hi + 1);
    } else {
      float s = 0;
      for (int t = lo; t <= hi; ++t) s += x[t];
      y[j] = s / static_cast<float>(kernel);
    }
  }
  return y;
}

std::vector<ParamSpec> window_scorer_params() {
  return {ParamSpec::integer("window", 32, 1, 4096, "observation window w (last prompt tokens, always kept)"),
          ParamSpec::integer("kernel", 7, 1, 63, "pooling kernel (odd)"),
          ParamSpec::choice("pooling", "max", {"max", "avg", "none"}, "1-D pooling of the scores"),
          ParamSpec::choice("reduce", "mean", {"mean", "sum"}, "reduction over the window queries")};
}

HeadScores pooled_window_scores(const PrefillView& v, const Params& p) {
  const auto reduce = p.get("reduce") == "sum" ? WindowReduce::Sum : WindowReduce::Mean;
  HeadScores s = window_attention_scores(v, p.integer("window"), reduce);
  const int kernel = p.integer("kernel");
  const Pooling pooling = parse_pooling(p.get("pooling"));
  for (auto& h : s) h = pool1d(h, kernel, pooling);
  return s;
}

HeadScores reduce_for_gqa(const HeadScores& s, int n_kv_heads, GqaMode mode) {
  if (mode == GqaMode::Repeat) return s;
  const int G = static_cast<int>(s.size()) / n_kv_heads;
  HeadScores out(n_kv_heads, std::vector<float>(s[0].size(), 0.0f));
  for (int g = 0; g < n_kv_heads; ++g) {
    for (int i = 0; i < G; ++i)
      for (size_t j = 0; j < s[0].size(); ++j) out[g][j] += s[size_t(g) * G + i][j];
    for (auto& x : out[g]) x /= static_cast<float>(G);
  }
  return out;
}

std::vector<int32_t> top_k_sorted(const std::vector<float>& scores, int k) {
  const int n = static_cast<int>(scores.size());
  k = std::clamp(k, 0, n);
  std::vector<int32_t> idx(n);
  std::iota(idx.begin(), idx.end(), 0);
  auto better = [&](int32_t a, int32_t b) { return scores[a] > scores[b] || (scores[a] == scores[b] && a < b); };
  std::nth_element(idx.begin(), idx.begin() + k, idx.end(), better);
  idx.resize(k);
  std::sort(idx.begin(), idx.end());
  return idx;
}

std::vector<std::vector<int32_t>> select_per_head(const HeadScores& scores, const std::vector<int>& caps, int S,
                                                  int w) {
  if (caps.size() != scores.size()) fail("internal: {} capacities for {} stored heads", caps.size(), scores.size());
  std::vector<std::vector<int32_t>> keep;
  for (size_t h = 0; h < scores.size(); ++h) {
    if (caps[h] < 0) fail("internal: negative capacity {} for head {}", caps[h], h);
    auto kept = top_k_sorted(scores[h], caps[h]);
    for (int j = S - w; j < S; ++j) kept.push_back(j);
    keep.push_back(std::move(kept));
  }
  return keep;
}

Selection select_top(HeadScores query_scores, int n_kv_heads, GqaMode mode, std::vector<int> caps, int S, int w) {
  // A compression ratio can give a short prompt a KV size T below the window (a fixed KV size that
  // small is refused up front): kvpress's scorers then keep T of the window's tokens, which all score
  // its maximum (torch's tie order picks them); kvbench keeps the last T. The window's other tokens
  // join the scored prefix at that maximum, so that a wrapper ranks them as kvpress does.
  if (std::any_of(caps.begin(), caps.end(), [](int c) { return c < 0; })) {
    if (std::adjacent_find(caps.begin(), caps.end(), std::not_equal_to<>()) != caps.end() || caps[0] + w < 0)
      fail("a KV size of {} tokens leaves no room beyond the {}-token window; use a larger budget or window",
           caps[0] + w, w);
    const int moved = -caps[0];
    for (auto& s : query_scores)
      s.resize(s.size() + size_t(moved), s.empty() ? 0.0f : *std::max_element(s.begin(), s.end()));
    w -= moved;
    caps.assign(caps.size(), 0);
  }
  Selection s;
  s.scores = reduce_for_gqa(query_scores, n_kv_heads, mode);
  s.query_scores = std::move(query_scores);
  s.keep = select_per_head(s.scores, caps, S, w);
  s.window = w;
  return s;
}

LayerCache gather(const PrefillView& v, GqaMode mode, const std::vector<std::vector<int32_t>>& keep) {
  const int stored = mode == GqaMode::Repeat ? v.n_heads : v.n_kv_heads;
  if (static_cast<int>(keep.size()) != stored) fail("internal: {} kept lists for {} stored heads", keep.size(), stored);
  const int G = v.n_heads / v.n_kv_heads, d = v.head_dim;
  LayerCache cache(v.n_heads, stored, d);
  for (int s = 0; s < stored; ++s) {
    const int g = mode == GqaMode::Repeat ? s / G : s;
    auto seg = std::make_unique<DenseSegment>(d);
    seg->reserve(keep[s].size());
    for (int32_t p : keep[s]) {
      if (p < 0 || p >= v.n_tokens) fail("internal: kept position {} outside the prompt", p);
      const size_t off = (size_t(p) * v.n_kv_heads + g) * d;
      seg->append(v.k + off, v.v + off, v.positions[p]);
    }
    cache.segments(s).push_back(std::move(seg));
  }
  return cache;
}

LayerCache keep_all(const PrefillView& v, GqaMode mode) {
  const int stored = mode == GqaMode::Repeat ? v.n_heads : v.n_kv_heads;
  std::vector<int32_t> all(v.n_tokens);
  std::iota(all.begin(), all.end(), 0);
  return gather(v, mode, std::vector<std::vector<int32_t>>(stored, all));
}

std::vector<std::vector<int>> per_head_budgets(const std::vector<std::vector<double>>& scores, int T, int w,
                                               double beta, double temperature, CapRounding rounding) {
  if (T <= w) fail("per-head budgets: KV size {} must exceed the window {}", T, w);
  if (!(beta >= 1)) fail("per-head budgets: beta must be at least 1, got {}", beta);
  size_t heads = 0;
  double total = 0;
  for (const auto& layer : scores)
    for (double x : layer) {
      if (!(x >= 0) || !std::isfinite(x))
        fail("per-head budgets: head scores must be finite and non-negative, found {}", x);
      total += std::pow(x, temperature);
      ++heads;
    }
  if (heads == 0 || total <= 0) fail("per-head budgets: no positive head scores");
  const int b = T - w;
  const double pool = std::floor(b / beta) * static_cast<double>(heads);
  const double min_each = b - std::floor(b / beta);
  std::vector<std::vector<int>> caps;
  std::vector<double> raw;
  for (const auto& layer : scores) {
    auto& row = caps.emplace_back();
    for (double x : layer) {
      raw.push_back(std::pow(x, temperature) / total * pool + min_each);
      // torch.round: half to even (the default floating-point rounding mode).
      row.push_back(
          static_cast<int>(rounding == CapRounding::Nearest ? std::nearbyint(raw.back()) : std::floor(raw.back())));
    }
  }
  if (rounding == CapRounding::ExactTotal) {
    // Largest remainders: the raw capacities sum to heads x b, so the floors fall short by an integer;
    // the heads with the largest fractional parts (ties to the earlier head) get one more slot each.
    long missing = static_cast<long>(heads) * b;
    for (const auto& row : caps)
      for (int c : row) missing -= c;
    std::vector<size_t> order(raw.size());
    std::iota(order.begin(), order.end(), size_t{0});
    std::stable_sort(order.begin(), order.end(),
                     [&](size_t a, size_t c) { return raw[a] - std::floor(raw[a]) > raw[c] - std::floor(raw[c]); });
    const size_t per_layer = scores.front().size();
    for (size_t i = 0; i < order.size() && missing > 0; ++i, --missing)
      ++caps[order[i] / per_layer][order[i] % per_layer];
  }
  return caps;
}

size_t LatentQuant::stored_bits(int n) const {
  const int groups = group_size > 0 ? (n + group_size - 1) / group_size : 1;
  return size_t(n) * size_t(bits) + size_t(groups) * (sym ? 16 : 32);
}

std::vector<ParamSpec> with_latent_quant(std::vector<ParamSpec> params) {
  for (auto& q :
       {ParamSpec::integer("latent_bits", 16, 2, 16,
                           "bits of each latent value, quantized per token as Palu's --lt_bits (16: not quantized)")
            .added_later(),
        ParamSpec::integer("latent_group_size", 0, 0, 4096,
                           "latent values per scale (Palu's --lt_group_size); 0: each head group's whole latent")
            .added_later(),
        ParamSpec::boolean("latent_sym", false, "symmetric latent quantization (Palu's --lt_sym)").added_later(),
        ParamSpec::real("latent_clip", 1.0, 1e-3, 1.0, "clip ratio of the latent's range (Palu's --lt_clip_ratio)")
            .added_later(),
        ParamSpec::boolean("latent_hadamard", false,
                           "rotate each head group's latent by a Hadamard matrix before quantizing (Palu's "
                           "--lt_hadamard, fused into its factors)")
            .added_later()})
    params.push_back(q);
  return params;
}

LatentQuant latent_quant_of(const Params& p) {
  LatentQuant q;
  q.bits = p.integer("latent_bits");
  q.group_size = p.integer("latent_group_size");
  q.sym = p.get_bool("latent_sym");
  q.clip = p.get_float("latent_clip");
  q.hadamard = p.get_bool("latent_hadamard");
  return q;
}

void fake_quantize(float* x, int n, const LatentQuant& q) {
  const int g = q.group_size > 0 ? q.group_size : n;
  for (int start = 0; start < n; start += g) {
    float* v = x + start;
    const int m = std::min(g, n - start);
    if (q.sym) {
      float top = 0;
      for (int i = 0; i < m; ++i) top = std::max(top, std::abs(v[i]));
      top = std::max(top, 1e-5f) * static_cast<float>(q.clip);
      const float qmax = static_cast<float>((1 << (q.bits - 1)) - 1), qmin = -qmax - 1;
      const float scale = top / qmax;
      for (int i = 0; i < m; ++i) v[i] = std::clamp(std::nearbyint(v[i] / scale), qmin, qmax) * scale;
    } else {
      float hi = v[0], lo = v[0];
      for (int i = 1; i < m; ++i) {
        hi = std::max(hi, v[i]);
        lo = std::min(lo, v[i]);
      }
      hi *= static_cast<float>(q.clip);
      lo *= static_cast<float>(q.clip);
      const float qmax = static_cast<float>((1 << q.bits) - 1);
      const float scale = std::max(hi - lo, 1e-5f) / qmax;
      const float zero = std::clamp(std::nearbyint(-lo / scale), 0.0f, qmax);
      for (int i = 0; i < m; ++i) v[i] = (std::clamp(std::nearbyint(v[i] / scale) + zero, 0.0f, qmax) - zero) * scale;
    }
  }
}

}  // namespace kvb
