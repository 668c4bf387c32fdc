// KVzip (Kim et al. 2025, arXiv:2505.23416) as kvpress's KVzipPress runs it (the form the VECTOR paper
// compares against): after the context is prefilled, the model is asked to repeat it; each cached
// token scores the most attention any repeat query gives it, and the lowest scores of the whole model
// (all layers, heads and tokens together) are evicted, so layers and heads keep different counts.
#include <cblas.h>

#include <algorithm>
#include <cmath>
#include <mutex>
#include <numeric>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/ops.hpp"

namespace kvb {
namespace {

// kvpress's constants (KVzipPress.prepare, n_sink).
constexpr int kChunk = 2048, kPrevTail = 8, kSinks = 4;
constexpr const char* kFirstPrompt = "\n\nRepeat the previous context exactly.";
constexpr const char* kLaterPrompt = "\n\nRepeat the part of the previous context exactly, starting with";

// scores[layer][stored head * n_ctx + position]: the context's scores, filled chunk by chunk.
using ModelScores = std::vector<std::vector<float>>;

// One repeat pass: the prompt followed by R repeat tokens, prefilled with full attention. Per layer,
// each query of the repeat tokens attends (softmax over the sink tokens, the chunk's own context
// tokens and the repeat tokens up to itself, as kvpress subsamples the keys) and every context
// position of the chunk scores its largest weight over the repeat queries (and, per KV head, over
// the group's query heads). Leaves the caches empty: only the scores are wanted.
class RepeatScorer final : public PrefillObserver {
 public:
  RepeatScorer(ModelScores& scores, int n_ctx, int start, int end, int repeat, GqaMode gqa)
      : scores_(scores), n_ctx_(n_ctx), start_(start), end_(end), repeat_(repeat), gqa_(gqa) {}
  PrefillNeeds needs() const override { return {.window = repeat_}; }

  void on_layer(const PrefillView& v, LayerCache&) override {
    const int d = v.head_dim, hq = v.n_heads, hkv = v.n_kv_heads, group = hq / hkv, R = repeat_;
    const int sink = std::min(kSinks, start_), chunk = end_ - start_, M = sink + chunk + R;
    const float scale = 1.0f / std::sqrt(static_cast<float>(d));
    auto key_of = [&](int m) {
      return m < sink ? m : m < sink + chunk ? start_ + m - sink : n_ctx_ + m - sink - chunk;
    };
    std::vector<float>& out = scores_[static_cast<size_t>(v.layer)];
    const int n_stored = gqa_ == GqaMode::Native ? hkv : hq;
    for (int s = 0; s < n_stored; ++s)  // kvpress assigns the chunk's scores (over the sinks' 1 too)
      std::fill_n(out.begin() + ptrdiff_t(s) * n_ctx_ + start_, chunk, 0.0f);
#pragma omp parallel for schedule(dynamic)
    for (int h = 0; h < hq; ++h) {
      const int g = h / group;
      std::vector<float> keys(size_t(M) * d), logits(size_t(R) * M), best(static_cast<size_t>(chunk), 0.0f);
      for (int m = 0; m < M; ++m)
        std::copy_n(v.k + (size_t(key_of(m)) * hkv + g) * d, d, keys.begin() + ptrdiff_t(m) * d);
      cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasTrans, R, M, d, scale, v.q_window + size_t(h) * d, hq * d,
                  keys.data(), d, 0.0f, logits.data(), M);
      for (int i = 0; i < R; ++i) {
        float* z = logits.data() + size_t(i) * M;
        const int seen = sink + chunk + i + 1;  // causal among the repeat tokens
        const float inv = 1.0f / exp_shifted(z, seen, *std::max_element(z, z + seen));
        for (int t = 0; t < chunk; ++t) best[size_t(t)] = std::max(best[size_t(t)], z[sink + t] * inv);
      }
      float* row = out.data() + size_t(gqa_ == GqaMode::Native ? g : h) * n_ctx_ + start_;
      if (gqa_ == GqaMode::Native) {
#pragma omp critical
        for (int t = 0; t < chunk; ++t) row[t] = std::max(row[t], best[size_t(t)]);
      } else {
        std::copy(best.begin(), best.end(), row);
      }
    }
  }

 private:
  ModelScores& scores_;
  int n_ctx_, start_, end_, repeat_;
  GqaMode gqa_;
};

class KVzip final : public Method {
 public:
  bool reads_whole_prompt() const override { return true; }
  // The global cut keeps L H S - floor(L H S p_c) slots (kvpress's count), up to one token per head
  // and layer over floor(S (1 - p_c)) per head.
  bool may_exceed_budget() const override { return true; }

  void on_prompt(Engine& engine, std::span<const int32_t> ids) override {
    n_ctx_ = static_cast<int>(ids.size());
    decided_ = {};
    // A sweep runs each budget and each wrapper over KVzip as its own configuration on the same
    // prefill: the scores of the last prompt are kept for all of them (they depend on nothing else).
    const Scored key{&engine,
                     &engine.model_file(),
                     engine.backend().name(),
                     engine.weight_format(),
                     engine.kv_dtype(),
                     gqa(),
                     std::vector<int32_t>(ids.begin(), ids.end())};
    static std::mutex mutex;
    static Scored last;
    static ModelScores last_scores;
    {
      const std::lock_guard<std::mutex> lock(mutex);
      if (last == key) {
        scores_ = last_scores;
        return;
      }
    }
    score(engine, ids);
    const std::lock_guard<std::mutex> lock(mutex);
    last = key;
    last_scores = scores_;
  }

  std::optional<Selection> select(const PrefillView& v, const Budget& b) override {
    if (v.n_tokens != n_ctx_ || scores_.empty())
      fail("internal: kvzip compresses a prompt of {} tokens it did not score ({} scored)", v.n_tokens, n_ctx_);
    decide(b);
    const int n = n_ctx_, stored = stored_heads(), group = model().n_heads / model().n_kv_heads;
    const auto& s = scores_[static_cast<size_t>(v.layer)];
    Selection sel;
    sel.keep = keep_[static_cast<size_t>(v.layer)];
    for (int h = 0; h < stored; ++h) {
      sel.scores.emplace_back(s.begin() + ptrdiff_t(h) * n, s.begin() + ptrdiff_t(h + 1) * n);
      if (sinks_kept()) std::fill_n(sel.scores.back().begin(), std::min(kSinks, n), sink_score_);
    }
    for (int h = 0; h < model().n_heads; ++h)
      sel.query_scores.push_back(sel.scores[size_t(gqa() == GqaMode::Native ? h / group : h)]);
    return sel;
  }

 private:
  // What the scores were computed on.
  struct Scored {
    const Engine* engine = nullptr;
    const ModelFile* file = nullptr;
    std::string backend;
    WeightFormat weights{};
    KvDtype kv_dtype{};
    GqaMode gqa{};
    std::vector<int32_t> ids;
    bool operator==(const Scored&) const = default;
  };

  void score(Engine& engine, std::span<const int32_t> ids) {
    prepare_prompts(engine.model_file());
    const int n = n_ctx_, layers = model().n_layers, stored = stored_heads();
    scores_.assign(static_cast<size_t>(layers), std::vector<float>(size_t(stored) * n, 0.0f));
    for (auto& s : scores_)
      for (int h = 0; h < stored; ++h) std::fill_n(s.begin() + ptrdiff_t(h) * n, std::min(kSinks, n), 1.0f);
    // The context after the chat template's head, in chunks; each chunk's repeat prompt, the
    // template's end of turn, then the chunk itself (later chunks start from the last tokens before).
    std::vector<int32_t> ext;
    for (int start = std::min(prefix_, n), i = 0; start < n; start += kChunk, ++i) {
      const int end = std::min(n, start + kChunk);
      ext.assign(ids.begin(), ids.end());
      const auto& ask = i == 0 ? first_prompt_ : later_prompt_;
      ext.insert(ext.end(), ask.begin(), ask.end());
      if (i > 0) ext.insert(ext.end(), ids.begin() + (start - kPrevTail), ids.begin() + start);
      ext.insert(ext.end(), suffix_.begin(), suffix_.end());
      ext.insert(ext.end(), ids.begin() + start, ids.begin() + end);
      const int repeat = static_cast<int>(ext.size()) - n;
      if (static_cast<int>(ext.size()) > model().context_length)
        fail(
            "method kvzip: scoring a prompt of {} tokens asks the model to repeat it, {} tokens in all for chunk {}, "
            "more than the model's context of {}",
            n, ext.size(), i + 1, model().context_length);
      RepeatScorer scorer(scores_, n, start, end, repeat, gqa());
      engine.prefill(ext, &scorer);
    }
  }

  void prepare_prompts(const ModelFile& file) {
    if (tok_) return;
    tok_ = load_tokenizer(file);
    const ChatTurnText turn = chat_turn_text(file);
    prefix_ = static_cast<int>(tok_->encode(turn.before).size());
    suffix_ = tok_->encode(turn.after);
    first_prompt_ = tok_->encode(kFirstPrompt);
    later_prompt_ = tok_->encode(kLaterPrompt);
  }

  // The global cut at this budget: the lowest scores over every layer, stored head and position go
  // (ties: the later slot first, so that each head keeps its top-k with ties to the lower position).
  void decide(const Budget& b) {
    if (decided_ && decided_->tokens == b.tokens && decided_->compression_ratio == b.compression_ratio) return;
    const int layers = model().n_layers, stored = stored_heads(), n = n_ctx_;
    const size_t per_layer = size_t(stored) * n, total = per_layer * layers;
    const size_t pruned = b.compression_ratio > 0
                              ? static_cast<size_t>(static_cast<double>(total) * b.compression_ratio)
                              : total - std::min(total, size_t(layers) * stored * size_t(b.tokens));
    std::vector<size_t> order(total);
    std::iota(order.begin(), order.end(), size_t{0});
    const bool kept = sinks_kept();
    sink_score_ = 0.0f;
    if (kept)
      for (const auto& s : scores_) sink_score_ = std::max(sink_score_, *std::max_element(s.begin(), s.end()) + 1.0f);
    auto score = [&](size_t i) {
      const size_t t = i % size_t(n);
      return kept && t < size_t(kSinks) ? sink_score_ : scores_[i / per_layer][i % per_layer];
    };
    std::nth_element(order.begin(), order.begin() + ptrdiff_t(std::min(pruned, total - 1)), order.end(),
                     [&](size_t a, size_t c) { return score(a) != score(c) ? score(a) < score(c) : a > c; });
    std::vector<char> evict(total, 0);
    for (size_t i = 0; i < pruned; ++i) evict[order[i]] = 1;
    keep_.assign(static_cast<size_t>(layers), std::vector<std::vector<int32_t>>(static_cast<size_t>(stored)));
    for (size_t i = 0; i < total; ++i)
      if (!evict[i]) keep_[i / per_layer][(i % per_layer) / size_t(n)].push_back(static_cast<int32_t>(i % size_t(n)));
    decided_ = b;
  }

  // kvpress 0.5.5 gives the first kSinks tokens the highest score after scoring, so they are never
  // evicted; 0.5.2 (the default) sets them to 1 before, and the first chunk's scores overwrite them
  // where the chat template's head is shorter (no template).
  bool sinks_kept() const { return params().get("sinks") == "kept"; }

  std::unique_ptr<Tokenizer> tok_;
  int prefix_ = 0;
  std::vector<int32_t> suffix_, first_prompt_, later_prompt_;
  int n_ctx_ = 0;
  ModelScores scores_;
  std::optional<Budget> decided_;
  float sink_score_ = 0.0f;  // with sinks=kept: above every score of the prompt (decide() sets it)
  std::vector<std::vector<std::vector<int32_t>>> keep_;  // [layer][stored head]: kept positions, ascending
};

const bool registered = register_method(
    {.name = "kvzip",
     .summary = "context reconstruction: attention the repeated context gives each token, one cut over all layers "
                "and heads (Kim et al. 2025, kvpress KVzipPress)",
     .params = {ParamSpec::choice("sinks", "scored", {"scored", "kept"},
                                  "the first 4 tokens: scored as kvpress 0.5.2 (the VECTOR paper's) does, or kept "
                                  "whatever their scores, as kvpress 0.5.5 does (they differ without a chat template)")
                    .added_later()},
     .make = [] { return std::make_unique<KVzip>(); },
     .composition = Composition::Selector});

}  // namespace
}  // namespace kvb
