#pragma once
// HeadKV's head profiling (spec/methods-b.md 5.4, the HeadKV repository's
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

// A retrieval-reasoning needle: two facts plus what decides between them. `real_needle` is the answer
// sentence (whose span the attention is scored on) and must open `needle`, as in the reference files.
struct Needle {
  std::string needle, question, real_needle, answer;
};

// Our own needles in the layout of the reference's haystack_for_detect_r2/needles.jsonl.
std::vector<Needle> builtin_needles();
// JSONL with string fields needle, question, real_needle, answer; errors name the file, line and field.
std::vector<Needle> load_needles(const std::string& path);

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

 private:
  const Tokenizer& tok_;
  std::set<int32_t> periods_;
  bool adds_bos_ = false;
};

// Keeps the whole cache and, at every decode step, adds to each (layer, query head) the attention its
// query gives to positions of [start, end) among its top end - start, divided by end - start.
class RetrievalProbe final : public PrefillObserver {
 public:
  RetrievalProbe(int layers, int heads, int start, int end);
  void on_layer(const PrefillView& v, LayerCache& cache) override;
  bool acts_on_decode() const override { return true; }
  void on_decode(int layer, LayerCache& cache, const float* q, int32_t pos) override;
  std::vector<std::vector<double>> score;  // [layer][query head], summed over the steps so far

 private:
  int start_, end_;
};

}  // namespace kvb
