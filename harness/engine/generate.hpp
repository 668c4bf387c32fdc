#pragma once
// Greedy generation on top of the engine: prompt building (chat template on or off), decoding until
// an end-of-generation token, a stop string or the token limit.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvb {

class Engine;
class ModelFile;
class Tokenizer;
class PrefillObserver;
struct PrefillCapture;

// Token ids of a prompt: with `chat`, the text is a user message in the model's chat template
// (with the generation prompt); without, it is the raw text with BOS as the tokenizer adds it.
std::vector<int32_t> build_prompt(const ModelFile& model, const Tokenizer& tok, const std::string& text, bool chat);

struct GenerateOptions {
  int max_new_tokens = 128;
  int min_new_tokens = 0;         // end-of-generation tokens cannot be chosen before this many (HF min_length)
  std::vector<std::string> stop;  // stop strings; the text is cut before the first one found
  bool stop_at_eog = true;        // stop at the tokenizer's end-of-generation tokens
};

struct Generation {
  std::vector<int32_t> tokens;  // generated ids (without the end-of-generation token)
  std::string text;
  std::string stop_reason;  // "eog", "stop_string", "max_new_tokens", "context_full"
  int prompt_tokens = 0;
  double prefill_seconds = 0;
  double decode_seconds = 0;
};

// Index of the largest logit; the lowest index among equal values.
int32_t argmax(std::span<const float> logits);

Generation generate(Engine& engine, const Tokenizer& tok, std::span<const int32_t> prompt, const GenerateOptions& opt,
                    PrefillObserver* observer = nullptr);
// The same from a shared prefill (prefill_seconds is then 0: the prefill was paid once for all).
Generation generate(Engine& engine, const Tokenizer& tok, const PrefillCapture& capture, const GenerateOptions& opt,
                    PrefillObserver* observer = nullptr);

// The logits a cache gives: those of the prompt's next token, then those of each of `steps` decode
// steps over the cache the observer (a method) kept, fed `forced` tokens where given (teacher forcing:
// two methods compared on the same sequence) and the greedy token otherwise. Prefill attends over the
// whole prompt, so the first row changes only under a method that changes the model (DynaKV); decode
// steps read the compressed cache.
struct StepLogits {
  std::vector<int32_t> fed;                // the token fed at each decode step
  std::vector<std::vector<float>> logits;  // 1 + steps rows of vocabulary size
  std::vector<float> flat() const;         // the rows one after another, [1 + steps, vocab] row-major
};
StepLogits step_logits(Engine& engine, std::span<const int32_t> prompt, int steps, std::span<const int32_t> forced,
                       PrefillObserver* observer = nullptr);

}  // namespace kvb
