// HeadKV (Fu et al. 2024, README.md §1-§8): heads matter unequally. An offline profiling run
// scores every attention head on needle tests while the model answers; at inference each head gets a
// guaranteed share of the budget plus a slice of a shared pool in proportion to its score, and selects
// its tokens SnapKV-style inside that share (ragged per-head caches).
//
// `kvbench calibrate headkv MODEL` is the profiling, on a length x depth grid of needle prompts:
// - heads=r2 (HeadKV-R2, Important_Head/retrieval_head_detection_r2.py): at every decode step of the
//   greedy answer, each (layer, query head) adds attention/k for those of its query's top-k positions
//   that fall inside the answer sentence, k its token length; a test counts if its answer has F1 > 0.5.
// - heads=r (HeadKV-R, retrieval_head_detection.py after Wu et al.'s retrieval heads): a head adds
//   1/k when its top-1 position lies in the needle's answer text and holds the token just generated
//   (it copies); a test counts if its answer's stemmed ROUGE-1 recall of that text exceeds 0.5.
// A head's importance is its mean over the counted tests.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/head_scores.hpp"
#include "harness/method/parts.hpp"
#include "harness/method/scorer.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/longbench_metrics.hpp"
#include "harness/task/rouge_score.hpp"
#include "harness/task/text.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"
#include "methods/headkv/profile_prompts.hpp"

namespace kvb {
namespace {

// ---------------------------------------------------------------------------------------------------
// Profiling

// The reference scripts' decode stop: SentencePiece's newline byte token (it never fires for byte-level
// BPE vocabularies such as Llama 3's or SmolLM2's) or id 144.
bool reference_stop(const Tokenizer& tok, int32_t id) { return tok.token_text(id) == "<0x0A>" || id == 144; }

void profile_heads(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const auto t0 = std::chrono::steady_clock::now();
  const Params& o = ctx.options;
  const HeadScoreKind kind = parse_head_score_kind(o.get("heads"));
  const bool reasoning = kind == HeadScoreKind::RetrievalReasoning;
  const std::string name = reasoning ? "r2" : "r";
  const std::vector<Needle> needles = o.get("needles").empty()
                                          ? (reasoning ? builtin_reasoning_needles() : builtin_retrieval_needles())
                                          : load_needles(o.get("needles"), reasoning);
  const long e_len = o.get_int("e_len") > 0 ? o.get_int("e_len") : std::min<long>(10000, cfg.context_length);
  const long n_len = o.get_int("lengths"), n_depth = o.get_int("depths"), s_len = o.get_int("s_len");
  if (e_len < s_len) fail("kvbench calibrate headkv: e_len {} is below s_len {}", e_len, s_len);
  // round(linspace(...)) as numpy: half to even.
  auto linspace = [](double a, double b, long n) {
    std::vector<int> v;
    for (long i = 0; i < n; ++i)
      v.push_back(static_cast<int>(std::nearbyint(n == 1 ? a : a + (b - a) * double(i) / double(n - 1))));
    return v;
  };
  const auto lengths = linspace(double(s_len), double(e_len), n_len);
  if (n_len == 1 && e_len != s_len)
    fmt::print(stderr,
               "kvbench calibrate headkv: lengths=1 profiles at s_len = {} only (numpy's linspace); e_len {} is "
               "not used\n",
               s_len, e_len);
  const auto depths = linspace(0, 100, n_depth);
  if (lengths.back() > cfg.context_length)
    fail("kvbench calibrate headkv: length {} exceeds the model's context length {}; lower e_len", lengths.back(),
         cfg.context_length);
  std::string haystack_desc;
  const std::string hay =
      read_haystack(o.get("haystack"), ctx.data_dir, static_cast<size_t>(lengths.back()), haystack_desc);
  const NeedlePrompts prompts(ctx.tokenizer);

  const int L = cfg.n_layers, H = cfg.n_heads;
  std::vector<std::vector<std::vector<double>>> lists(L, std::vector<std::vector<double>>(H));
  nlohmann::json log = nlohmann::json::array();
  Progress bar(fmt::format("headkv {} profiling", name), needles.size() * lengths.size() * depths.size(), "prompt");
  size_t ok = 0, done = 0;
  for (size_t ni = 0; ni < needles.size(); ++ni) {
    const Needle& nd = needles[ni];
    const auto answer_tokens = ctx.tokenizer.encode(nd.answer);
    for (int len : lengths) {
      const std::string context = prompts.trimmed(hay, len);
      for (int depth : depths) {
        // The reference prompts without a chat template; small instruct models answer only inside one.
        const auto ids =
            build_prompt(ctx.model, ctx.tokenizer, prompts.prompt_text(context, nd, len, depth), o.get_bool("chat"));
        if (static_cast<long>(ids.size()) + 50 > cfg.context_length)
          fail("kvbench calibrate headkv: a {}-token prompt leaves no room to decode in the model's context of {}",
               ids.size(), cfg.context_length);
        // R2 scores the attention mass on the answer sentence, R the copies out of the needle
        // (retrieval_head_detection_r2.py and retrieval_head_detection.py respectively).
        const auto [s, e] =
            reasoning ? prompts.span(ids, nd.real_needle) : prompts.first_span(ids, nd.real_needle, 0.9);
        RetrievalProbe probe(L, H, s, e, reasoning ? ProbeRule::AttentionMass : ProbeRule::Copy, ids);
        ctx.engine.prefill(std::span(ids).first(ids.size() - 1), &probe);
        std::vector<int32_t> out;
        int32_t inp = ids.back();
        const auto& eos = ctx.tokenizer.special().eos;
        for (int step = 0; step < 50; ++step) {
          const int32_t next = argmax(ctx.engine.decode(inp));
          out.push_back(next);
          probe.generated(next);
          // R2 also stops at EOS and at the answer's token count; R runs until the newline test.
          if (reference_stop(ctx.tokenizer, next) ||
              (reasoning && ((eos && next == *eos) || out.size() >= answer_tokens.size())))
            break;
          inp = next;
        }
        const std::string response = python_strip(ctx.tokenizer.decode(out, true));
        const double score = reasoning ? 100.0 * longbench::qa_f1(response, nd.answer)
                                       : 100.0 * rouge_n(nd.real_needle, response, 1).recall;
        if (score > o.get_float("min_score")) {
          ++ok;
          for (int l = 0; l < L; ++l)
            for (int h = 0; h < H; ++h) lists[l][h].push_back(probe.score[l][h]);
        }
        log.push_back({{"needle", ni},
                       {"length", len},
                       {"depth", depth},
                       {"prompt_tokens", ids.size()},
                       {"span", {s, e}},
                       {"response", utf8_lossy(response)},
                       {reasoning ? "f1" : "rouge1_recall", score}});
        bar.advance(1, fmt::format("{} of {} counted", ok, ++done));
      }
    }
  }
  bar.finish();
  const char* metric = reasoning ? "F1" : "ROUGE-1 recall";
  if (ok == 0) {
    for (const auto& t : log) fmt::print(stderr, "  {}\n", t.dump());
    fail(
        "kvbench calibrate headkv: the model answered none of the {} needle tests ({} x 100 > {}, log above); no "
        "head scores (an instruct model may need -o chat=true; a small model may need a lower -o min_score)",
        done, metric, o.get_float("min_score"));
  }
  const std::string akind = artifact_kind(kind);
  nlohmann::json body;
  body["header"] = artifact_header(akind, cfg, ctx.model.path());
  body["header"]["tokenizer"] = ctx.tokenizer.kind();
  body["header"]["profiling"] = {
      {"scores",
       reasoning ? "retrieval-reasoning (HeadKV-R2): mean over counted tests of the attention on the answer sentence"
                 : "retrieval (HeadKV-R): mean over counted tests of the share of the needle's tokens the head "
                   "copied (top-1 attention on the needle token that was generated)"},
      {"haystack", haystack_desc},
      {"haystack_note", o.get("haystack").empty()
                            ? fmt::format("the HeadKV paper profiles on book text (its repository's {}); this default "
                                          "uses the NIAH essays instead",
                                          reasoning ? "haystack_for_detect_r2" : "haystack_for_detect")
                            : "user-supplied"},
      {"chat_template", o.get_bool("chat")},
      {"success", fmt::format("{} x 100 > {}", metric, o.get_float("min_score"))},
      {"needles", o.get("needles").empty()
                      ? fmt::format("kvbench built-in {} needles", reasoning ? "retrieval-reasoning" : "retrieval")
                      : o.get("needles")},
      {"lengths", lengths},
      {"depths", depths},
      {"tests", done},
      {"counted", ok},
      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()},
      {"log", log}};
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) body[fmt::format("{}-{}", l, h)] = lists[l][h];
  const std::string path = ctx.out.empty() ? default_artifact_path(akind, cfg) : ctx.out;
  write_artifact(path, body);
  fmt::print("headkv {} scores: {} of {} tests counted, {:.0f} s; written to {}\n", name, ok, done,
             body["header"]["profiling"]["seconds"].get<double>(), path);
}

// ---------------------------------------------------------------------------------------------------
// Inference

class HeadKV final : public ScorerMethod {
 public:
  void setup() override { importance_ = load_head_importance(params(), model()); }

  nlohmann::json artifacts() const override {
    return {{"head_scores", {{"file", importance_.source}, {"digest", importance_.digest}}}};
  }

  bool may_exceed_budget() const override { return params().get("caps") == "repro"; }
  // The authors' AdaptiveSnapKVCluster leaves a prompt whole only when T - w exceeds S - w.
  bool keeps_whole_prompt(int n_tokens, int budget_tokens) const override { return n_tokens < budget_tokens; }
  void check_budget(int tokens) const override {
    if (tokens <= window()) fail("per-head budgets: KV size {} must exceed the window {}", tokens, window());
  }

 private:
  HeadScores score(const PrefillView& v) override { return pooled_window_scores(v, params()); }
  // Each head's share of the layer's budget, from the profiled importance (once per KV size).
  std::vector<int> caps(const PrefillView& v, const Budget& b) override {
    if (caps_tokens_ != b.tokens) {
      caps_ = head_capacities(importance_, params(), v.n_kv_heads, gqa(), b.tokens, window());
      caps_tokens_ = b.tokens;
    }
    return caps_[v.layer];
  }

  HeadImportance importance_;
  std::vector<std::vector<int>> caps_;
  int caps_tokens_ = -1;
};

std::vector<ParamSpec> headkv_params() {
  auto p = window_scorer_params();
  for (auto& s : p) {  // HeadKV's defaults: w = 8, max pooling of 7, mean over the window rows
    if (s.name == "window") s.default_value = "8";
  }
  for (auto& h : head_budget_params()) p.push_back(std::move(h));
  return p;
}

const bool registered = register_method(
    {.name = "headkv",
     .summary = "profiled head importance -> per-head budgets, SnapKV selection inside each head",
     .params = headkv_params(),
     .make = [] { return std::make_unique<HeadKV>(); },
     .steps =
         {{.options =
               {ParamSpec::choice("heads", "r2", {"r2", "r"},
                                  "which scores: retrieval-reasoning (r2) or retrieval (r) heads"),
                ParamSpec::text("haystack", "",
                                "haystack text files or directories, comma-separated (default: the NIAH essays)"),
                ParamSpec::text("needles", "", "needle JSONL in the HeadKV repository's layouts (default: built-in)"),
                ParamSpec::integer("s_len", 0, 0, 10000000, "shortest context length (tokens)"),
                ParamSpec::integer("e_len", 0, 0, 10000000,
                                   "longest context length (0: 10000 or the model's context length)"),
                ParamSpec::integer("lengths", 5, 1, 1000, "context lengths, round(linspace(s_len, e_len, n))"),
                ParamSpec::integer("depths", 10, 1, 101, "needle depths, round(linspace(0, 100, n)) percent"),
                ParamSpec::boolean("chat", false,
                                   "wrap each prompt in the model's chat template (the reference does not)"),
                ParamSpec::real(
                    "min_score", 50.0, 0.0, 100.0,
                    "a test counts when its answer's score x 100 exceeds this: LongBench F1 (r2) or stemmed "
                    "ROUGE-1 recall of the needle (r); the reference: 50")},
           .run = profile_heads}},
     .composition = Composition::Selector});

}  // namespace
}  // namespace kvb
