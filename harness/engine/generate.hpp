#pragma once
// Greedy generation on top of the engine: prompt building (chat template on or off), decoding until
// an end-of-generation token, a stop string or the token limit.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvb {

class Engine;
class Sequence;
class ModelFile;
class Tokenizer;
class PrefillObserver;
struct PrefillCapture;

// Token ids of a prompt: with `chat`, the text is a user message in the model's chat template
// (with the generation prompt); without, it is the raw text with BOS as the tokenizer adds it.
std::vector<int32_t> build_prompt(const ModelFile& model, const Tokenizer& tok, const std::string& text, bool chat);

// A prompt whose tail comes after compression (kvpress's pipeline): `prefill` is what the engine
// prefills and a method compresses, `after` what is fed next, token by token over the compressed cache
// with positions continuing from the prompt's, before the first generated token.
struct PromptIds {
  std::vector<int32_t> prefill, after;
};
// kvpress's layout of a prompt in three parts, each tokenized apart as its pipeline does. With a chat
// template: the template rendered over one user turn holding `context` and cut where the context
// ends; the prefill is the head (no BOS beyond what the template writes), `after` is `question`, the
// rest of the rendering (end of turn, assistant header, Qwen3's empty think block) and
// `answer_prefix`. Without a template: BOS and the context, then question + "\n" + answer_prefix.
// `max_context` > 0 keeps the prefill's first that many tokens (kvpress's max_context_length).
PromptIds build_split_prompt(const ModelFile& model, const Tokenizer& tok, const std::string& context,
                             const std::string& question, const std::string& answer_prefix, int max_context = 0);

// The chat template's text around one user turn, as kvpress derives it (its KVzipPress): the
// rendering of a dummy turn (with the generation prompt) cut around the content. Without a template:
// "" and "\n".
struct ChatTurnText {
  std::string before, after;
};
ChatTurnText chat_turn_text(const ModelFile& model);

struct GenerateOptions {
  int max_new_tokens = 128;
  int min_new_tokens = 0;              // end-of-generation tokens cannot be chosen before this many (HF min_length)
  std::vector<std::string> stop;       // stop strings; the text is cut before the first one found
  std::vector<int32_t> end_tokens;     // more ids that end generation as end-of-generation tokens do
  bool stop_at_eog = true;             // stop at the tokenizer's end-of-generation tokens
  std::vector<int32_t> after_prefill;  // fed after the prefill, uncompressed (PromptIds::after)
  // kvpress's pipeline checks end-of-generation from the second generated token on: a first token
  // that ends generation is kept and decoding goes on.
  bool first_token_can_stop = true;
};

struct Generation {
  std::vector<int32_t> tokens;  // generated ids (without the end-of-generation token)
  // Valid UTF-8: bytes of a character cut short (at max_new_tokens, or a byte token the model made up)
  // read as U+FFFD, as the Hugging Face decoders give them, before stop strings are looked for.
  std::string text;
  // "eog", "end_token", "stop_string", "max_new_tokens", or "sliding_window" (the model's sliding attention
  // window reached, which kvbench does not implement)
  std::string stop_reason;
  // Generated tokens at positions at or past the model's context length: decoding goes on there, its
  // rotary positions extrapolated, as transformers' generate does (the references' summaries of an 8K
  // model's 7,950-token prompts run past it).
  int past_context = 0;
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

// Greedy decoding of several sequences together, each begun already (a prefill or a resume, its
// `after_prefill` tokens fed, Engine::detach), first[b] the logits sequence b ended on: every step
// decodes the unfinished ones with one Engine::decode_batch, which gives each the logits it gets
// alone, so each generation is the one generate() makes of it. Each one's decode_seconds is its share
// of the steps it took part in (a step's time over the sequences in it); prompt_tokens and
// prefill_seconds are the caller's. Needs a backend that decodes batches when there is more than one.
std::vector<Generation> generate_batch(Engine& engine, const Tokenizer& tok, std::span<Sequence> seqs,
                                       std::vector<std::vector<float>> first, const GenerateOptions& opt);

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

// lm-evaluation-harness's loglikelihood request, answered over a compressed cache: the context is
// prefilled (and compressed by the observer), then the continuation is fed token by token over what
// was kept. Without compression this equals one forward pass over context + continuation, as lm-eval
// runs it, within the kernels' tolerance.
struct ContinuationScore {
  double loglikelihood = 0;  // the continuation tokens' log-probabilities, summed
  bool greedy = true;        // whether each of them was the most likely token
  double prefill_seconds = 0, decode_seconds = 0;
};
ContinuationScore continuation_loglikelihood(Engine& engine, std::span<const int32_t> context,
                                             std::span<const int32_t> continuation,
                                             PrefillObserver* observer = nullptr);
// The same from a prefill of the context captured once for several continuations (prefill_seconds is
// then 0: the capture was paid once for all).
ContinuationScore continuation_loglikelihood(Engine& engine, const PrefillCapture& context,
                                             std::span<const int32_t> continuation,
                                             PrefillObserver* observer = nullptr);

}  // namespace kvb
