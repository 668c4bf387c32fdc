// HeadKV (Fu et al. 2024, spec/methods-b.md 5): heads matter unequally. An offline profiling run
// scores every attention head by how much of its attention lands on the answer sentence of needle
// tests while the model answers (retrieval-reasoning needles for HeadKV-R2); at inference each head
// gets a guaranteed share of the budget plus a slice of a shared pool in proportion to its score, and
// selects its tokens SnapKV-style inside that share (ragged per-head caches).
//
// `kvbench calibrate headkv MODEL` is the profiling (Important_Head/retrieval_head_detection_r2.py of
// the HeadKV repository): a length x depth grid of needle prompts; for every decode step of the greedy
// answer and every (layer, query head), the top-k attended positions of the step's query, k the token
// length of the answer sentence, add attention/k where they fall inside that sentence; a test counts
// only if its answer scores F1 > 0.5; a head's importance is its mean over the counted tests.
#include <fmt/format.h>

#include <algorithm>
#include <chrono>
#include <cmath>

#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/method/artifact.hpp"
#include "harness/method/calibration.hpp"
#include "harness/method/head_profiling.hpp"
#include "harness/method/head_scores.hpp"
#include "harness/method/parts.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"
#include "harness/util/progress.hpp"
#include "tasks/longbench/metrics.hpp"
#include "tasks/text.hpp"

namespace kvb {
namespace {

// ---------------------------------------------------------------------------------------------------
// Profiling

void profile_r2(CalibrationContext& ctx) {
  const ModelConfig& cfg = ctx.model.config();
  const auto t0 = std::chrono::steady_clock::now();
  const Params& o = ctx.options;
  const std::vector<Needle> needles =
      o.get("needles").empty() ? builtin_needles() : load_needles(o.get("needles"));
  const long e_len = o.get_int("e_len") > 0 ? o.get_int("e_len") : std::min<long>(10000, cfg.context_length);
  const long n_len = o.get_int("lengths"), n_depth = o.get_int("depths"), s_len = o.get_int("s_len");
  if (e_len < s_len) fail("kvbench calibrate headkv: e_len {} is below s_len {}", e_len, s_len);
  // round(linspace(...)) as numpy: half to even.
  auto linspace = [](double a, double b, long n) {
    std::vector<int> v;
    for (long i = 0; i < n; ++i) v.push_back(static_cast<int>(std::nearbyint(n == 1 ? a : a + (b - a) * double(i) / double(n - 1))));
    return v;
  };
  const auto lengths = linspace(double(s_len), double(e_len), n_len);
  const auto depths = linspace(0, 100, n_depth);
  if (lengths.back() > cfg.context_length)
    fail("kvbench calibrate headkv: length {} exceeds the model's context length {}; lower e_len", lengths.back(),
         cfg.context_length);
  std::string haystack_desc;
  const std::string hay = read_haystack(o.get("haystack"), ctx.data_dir, static_cast<size_t>(lengths.back()), haystack_desc);
  const NeedlePrompts prompts(ctx.tokenizer);

  const int L = cfg.n_layers, H = cfg.n_heads;
  std::vector<std::vector<std::vector<double>>> lists(L, std::vector<std::vector<double>>(H));
  nlohmann::json log = nlohmann::json::array();
  Progress bar("headkv r2 profiling", needles.size() * lengths.size() * depths.size(), "prompt");
  size_t ok = 0, done = 0;
  for (size_t ni = 0; ni < needles.size(); ++ni) {
    const Needle& nd = needles[ni];
    const auto answer_tokens = ctx.tokenizer.encode(nd.answer);
    for (int len : lengths) {
      const std::string context = prompts.trimmed(hay, len);
      for (int depth : depths) {
        // The reference prompts without a chat template; small instruct models answer only inside one.
        const auto ids = build_prompt(ctx.model, ctx.tokenizer, prompts.prompt_text(context, nd, len, depth),
                                      o.get_bool("chat"));
        if (static_cast<long>(ids.size()) + 50 > cfg.context_length)
          fail("kvbench calibrate headkv: a {}-token prompt leaves no room to decode in the model's context of {}",
               ids.size(), cfg.context_length);
        const auto [s, e] = prompts.span(ids, nd.real_needle);
        RetrievalProbe probe(L, H, s, e);
        ctx.engine.prefill(std::span(ids).first(ids.size() - 1), &probe);
        std::vector<int32_t> out;
        int32_t inp = ids.back();
        for (int step = 0; step < 50; ++step) {
          const int32_t next = argmax(ctx.engine.decode(inp));
          out.push_back(next);
          const auto& eos = ctx.tokenizer.special().eos;
          // The reference's stop test: SentencePiece's newline byte token (it never fires for
          // byte-level BPE vocabularies such as Llama 3's or SmolLM2's), EOS, or the answer's length.
          if (ctx.tokenizer.token_text(next) == "<0x0A>" || (eos && next == *eos) || out.size() >= answer_tokens.size())
            break;
          inp = next;
        }
        const std::string response = python_strip(ctx.tokenizer.decode(out, true));
        const double f1 = 100.0 * longbench::qa_f1(response, nd.answer);
        if (f1 > o.get_float("min_f1")) {
          ++ok;
          for (int l = 0; l < L; ++l)
            for (int h = 0; h < H; ++h) lists[l][h].push_back(probe.score[l][h]);
        }
        log.push_back({{"needle", ni}, {"length", len}, {"depth", depth}, {"prompt_tokens", ids.size()},
                       {"span", {s, e}}, {"response", utf8_lossy(response)}, {"f1", f1}});
        bar.advance(1, fmt::format("{} of {} counted", ok, ++done));
      }
    }
  }
  bar.finish();
  if (ok == 0) {
    for (const auto& t : log) fmt::print(stderr, "  {}\n", t.dump());
    fail("kvbench calibrate headkv: the model answered none of the {} needle tests (F1 x 100 > {}, log above); no "
         "head scores (an instruct model may need -o chat=true; a small model may need a lower -o min_f1)",
         done, o.get_float("min_f1"));
  }
  nlohmann::json body;
  body["header"] = artifact_header("headkv_r2", cfg, ctx.model.path());
  body["header"]["tokenizer"] = ctx.tokenizer.kind();
  body["header"]["profiling"] = {
      {"scores", "retrieval-reasoning (HeadKV-R2): mean over counted tests of the attention on the answer sentence"},
      {"haystack", haystack_desc},
      {"haystack_note", o.get("haystack").empty()
                            ? "the HeadKV paper profiles on book text (its repository's haystack_for_detect_r2); "
                              "this default uses the NIAH essays instead"
                            : "user-supplied"},
      {"chat_template", o.get_bool("chat")},
      {"min_f1", o.get_float("min_f1")},
      {"needles", o.get("needles").empty() ? "kvbench built-in retrieval-reasoning needles" : o.get("needles")},
      {"lengths", lengths},
      {"depths", depths},
      {"tests", done},
      {"counted", ok},
      {"seconds", std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count()},
      {"log", log}};
  for (int l = 0; l < L; ++l)
    for (int h = 0; h < H; ++h) body[fmt::format("{}-{}", l, h)] = lists[l][h];
  const std::string path = ctx.out.empty() ? default_artifact_path("headkv_r2", cfg) : ctx.out;
  write_artifact(path, body);
  fmt::print("headkv r2 scores: {} of {} tests counted, {:.0f} s; written to {}\n", ok, done,
             body["header"]["profiling"]["seconds"].get<double>(), path);
}

// ---------------------------------------------------------------------------------------------------
// Inference

class HeadKV final : public Method {
 public:
  PrefillNeeds needs() const override { return {static_cast<int>(params().get_int("window")), false, false}; }

  void setup() override {
    importance_ = load_head_importance(params(), model());
  }

  nlohmann::json artifacts() const override {
    return {{"head_scores", {{"file", importance_.source}, {"digest", importance_.digest}}}};
  }

  LayerCache compress(const PrefillView& v, const Budget& b) override {
    const int w = static_cast<int>(params().get_int("window"));
    if (caps_tokens_ != b.tokens) {
      caps_ = head_capacities(importance_, params(), v.n_kv_heads, gqa(), b.tokens, w);
      caps_tokens_ = b.tokens;
    }
    const HeadScores s = pooled_window_scores(v, params(), gqa());
    return gather(v, gqa(), select_per_head(s, caps_[v.layer], v.n_tokens, w));
  }

  bool may_exceed_budget() const override { return params().get("caps") == "repro"; }

 private:
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
    {"headkv", "profiled head importance -> per-head budgets, SnapKV selection inside each head",
     headkv_params(), [] { return std::make_unique<HeadKV>(); },
     // Retrieval (HeadKV-R) profiling is not implemented: its success test is rouge_score's stemmed
     // ROUGE-1 recall; HeadKV-R runs with the reference repository's score files (scores=FILE).
     {      ParamSpec::text("haystack", "", "haystack text files or directories, comma-separated (default: the NIAH essays)"),
      ParamSpec::text("needles", "", "needle JSONL in the HeadKV repository's layout (default: built-in)"),
      ParamSpec::integer("s_len", 0, 0, 10000000, "shortest context length (tokens)"),
      ParamSpec::integer("e_len", 0, 0, 10000000, "longest context length (0: 10000 or the model's context length)"),
      ParamSpec::integer("lengths", 5, 1, 1000, "context lengths, round(linspace(s_len, e_len, n))"),
      ParamSpec::integer("depths", 10, 1, 101, "needle depths, round(linspace(0, 100, n)) percent"),
      ParamSpec::boolean("chat", false, "wrap each prompt in the model's chat template (the reference does not)"),
      ParamSpec::real("min_f1", 50.0, 0.0, 100.0,
                      "a test counts when its answer's F1 x 100 exceeds this (the reference: 50)")},
     profile_r2,
     {{"scores", "uniform"}}});

}  // namespace
}  // namespace kvb
