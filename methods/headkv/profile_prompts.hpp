#pragma once
// HeadKV's head profiling (README.md §5-§8, the HeadKV repository's
// Important_Head/retrieval_head_detection_r2.py): needle prompts built as the reference builds them,
// the answer-sentence span, and the probe that scores every head's attention at each decode step.
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/prefill_view.hpp"

namespace kvb {

class Tokenizer;

// A needle: the inserted text, the question about it, `real_needle` (the answer text whose span the
// attention is scored on, part of `needle`) and, for retrieval-reasoning needles, the expected answer.
// A retrieval-reasoning needle holds two facts plus what decides between them and its real_needle
// opens the needle, as in the reference files; a retrieval needle is one plain fact.
struct Needle {
  std::string needle, question, real_needle, answer;
};

// Our own needles in the layouts of the reference's haystack_for_detect_r2/needles.jsonl (two
// retrieval-reasoning needles) and haystack_for_detect/needles.jsonl (three retrieval needles).
std::vector<Needle> builtin_reasoning_needles();
std::vector<Needle> builtin_retrieval_needles();
// JSONL with string fields needle, question, real_needle and, when `with_answer`, answer; errors name
// the file, line and field.
std::vector<Needle> load_needles(const std::string& path, bool with_answer);

// The haystack text: the files given (comma-separated; a directory means its *.txt in name order), or
// the NIAH essays set-up fetched. Repeated whole until it has `words` whitespace-separated words.
// `described` receives what was read, for the artifact header.
std::string read_haystack(const std::string& spec, const std::string& data_dir, size_t words, std::string& described);

class NeedlePrompts {
 public:
  explicit NeedlePrompts(const Tokenizer& tok);
  // encode_and_trim: the haystack cut at `length` tokens, as text.
  std::string trimmed(const std::string& hay, int length) const;
  // insert_needle + the question, as text (the tokenizer's BOS tokens, which the reference keeps when
  // decoding, survive as text and come back as BOS when the prompt is encoded).
  std::string prompt_text(const std::string& context, const Needle& n, int length, int depth) const;
  // find_needle_idx: [start, end) of the window of the answer sentence's token length with the largest
  // share of its distinct tokens (ties to the later window); with a BOS-adding tokenizer, only the
  // windows right after a BOS.
  std::pair<int, int> span(const std::vector<int32_t>& ids, const std::string& real_needle) const;
  // retrieval_head_detection.py's find_needle_idx: the first window whose share exceeds `min_overlap`,
  // any start; {-1, -1} when none does.
  std::pair<int, int> first_span(const std::vector<int32_t>& ids, const std::string& real_needle,
                                 double min_overlap) const;

 private:
  const Tokenizer& tok_;
  std::set<int32_t> periods_;
  bool adds_bos_ = false;
};

// How a decode step scores a head against the span [start, end) of the answer text.
enum class ProbeRule {
  // Retrieval-reasoning (HeadKV-R2): the attention on span positions among the query's top end - start
  // positions, divided by end - start.
  AttentionMass,
  // Retrieval (Wu et al.'s retrieval heads, HeadKV-R): 1 / (end - start) when the top-1 position lies
  // in the span and holds the token the step generates (the head copies).
  Copy,
};

// Keeps the whole cache and scores every (layer, query head) at every decode step.
class RetrievalProbe final : public PrefillObserver {
 public:
  // `prompt`: the prompt's token ids (the Copy rule compares the generated token with them).
  RetrievalProbe(int layers, int heads, int start, int end, ProbeRule rule, std::vector<int32_t> prompt = {});
  void on_layer(const PrefillView& v, LayerCache& cache) override;
  bool acts_on_decode() const override { return true; }
  void on_decode(int layer, LayerCache& cache, const float* q, int32_t pos) override;
  // After each decode step: the token it generated (the Copy rule scores here).
  void generated(int32_t token);
  std::vector<std::vector<double>> score;  // [layer][query head], summed over the steps so far

 private:
  int start_, end_;
  ProbeRule rule_;
  std::vector<int32_t> prompt_;
  std::vector<std::vector<int32_t>> top1_;  // [layer][query head]: this step's most attended position
};

}  // namespace kvb
