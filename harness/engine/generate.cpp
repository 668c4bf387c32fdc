#include "harness/engine/generate.hpp"

#include <chrono>
#include <cmath>
#include <functional>
#include <optional>
#include <utility>

#include "harness/engine/engine.hpp"
#include "harness/model/model_file.hpp"
#include "harness/tokenizer/chat_template.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/tokenizer/unicode.hpp"
#include "harness/util/error.hpp"

namespace kvb {

std::vector<int32_t> build_prompt(const ModelFile& model, const Tokenizer& tok, const std::string& text, bool chat) {
  if (!chat) return tok.encode_prompt(text);
  const ChatTemplate tmpl = ChatTemplate::for_model(model);
  // As transformers' apply_chat_template(tokenize=True) and kvpress encode it: no special token added,
  // so a BOS is there only where the template writes one.
  std::vector<int32_t> ids = tok.encode(tmpl.render({{"user", text}}, true));
  if (tmpl.prepends_bos() && tok.special().bos) ids.insert(ids.begin(), *tok.special().bos);
  return ids;
}

PromptIds build_split_prompt(const ModelFile& model, const Tokenizer& tok, const std::string& context,
                             const std::string& question, const std::string& answer_prefix, int max_context) {
  PromptIds p;
  const auto truncate = [&] {
    if (max_context > 0 && p.prefill.size() > size_t(max_context)) p.prefill.resize(size_t(max_context));
  };
  const auto tmpl = ChatTemplate::stored(model);
  if (!tmpl) {
    if (tok.special().bos) p.prefill.push_back(*tok.special().bos);
    const auto c = tok.encode(context);
    p.prefill.insert(p.prefill.end(), c.begin(), c.end());
    p.after = tok.encode(question + "\n" + answer_prefix);
    truncate();
    return p;
  }
  // kvpress cuts the rendering at a separator appended to the context, so a template that trims the
  // turn's content keeps the context's own end.
  const std::string separator(context.size() + 10, '#');
  const std::string text = tmpl->render({{"user", context + separator}}, true);
  const size_t cut = text.find(separator);
  if (cut == std::string::npos) fail("chat template: the user turn's text did not come through the rendering");
  p.prefill = tok.encode(std::string_view(text).substr(0, cut));
  if (tmpl->prepends_bos() && tok.special().bos) p.prefill.insert(p.prefill.begin(), *tok.special().bos);
  p.after = tok.encode(question + text.substr(cut + separator.size()) + answer_prefix);
  truncate();
  return p;
}

ChatTurnText chat_turn_text(const ModelFile& model) {
  const auto tmpl = ChatTemplate::stored(model);
  if (!tmpl) return {"", "\n"};
  const std::string dummy = "dummy context", separator = "\n" + std::string(dummy.size(), '#');
  const std::string text = tmpl->render({{"user", dummy + separator}}, true);
  const size_t content = text.find(dummy), cut = text.find(separator);
  if (content == std::string::npos || cut == std::string::npos)
    fail("chat template: the user turn's text did not come through the rendering");
  return {text.substr(0, content), text.substr(cut + separator.size())};
}

int32_t argmax(std::span<const float> logits) {
  size_t best = 0;
  for (size_t i = 1; i < logits.size(); ++i)
    if (logits[i] > logits[best]) best = i;
  return static_cast<int32_t>(best);
}

namespace {

// One sequence's greedy choices under generate's stopping rules, a step at a time: the loop that
// feeds the model is the caller's (one sequence, or a batch).
class GreedyChoice {
 public:
  GreedyChoice(const Tokenizer& tok, const GenerateOptions& opt) : tok_(tok), opt_(opt) {
    g_.stop_reason = "max_new_tokens";
  }
  // The token to feed after `logits` (which it may change: end-of-generation masked before
  // min_new_tokens), or nothing when generation has ended; `position` is the sequence's.
  std::optional<int32_t> next(std::vector<float>& logits, int position, const ModelConfig& cfg) {
    if (i_ >= opt_.max_new_tokens) return std::nullopt;
    if (i_ < opt_.min_new_tokens) {
      for (int32_t id : tok_.special().end_of_generation) logits[static_cast<size_t>(id)] = -INFINITY;
      for (int32_t id : opt_.end_tokens) logits[static_cast<size_t>(id)] = -INFINITY;
    }
    // NaN logits have no greatest: a generated text would be made of arbitrary tokens.
    if (std::any_of(logits.begin(), logits.end(), [](float x) { return std::isnan(x); }))
      fail("generation step {}: the next-token logits hold NaN (from the weights or the activations)", i_ + 1);
    const int32_t token = argmax(logits);
    const bool can_stop = i_ > 0 || opt_.first_token_can_stop;
    if (opt_.stop_at_eog && tok_.is_end_of_generation(token) && can_stop) {
      g_.stop_reason = "eog";
      return std::nullopt;
    }
    if (can_stop && std::find(opt_.end_tokens.begin(), opt_.end_tokens.end(), token) != opt_.end_tokens.end()) {
      g_.stop_reason = "end_token";
      return std::nullopt;
    }
    g_.tokens.push_back(token);
    g_.past_context += position >= cfg.context_length;
    if (!opt_.stop.empty()) {
      const std::string text = utf8_lossy(tok_.decode(g_.tokens));
      size_t cut = std::string::npos;
      for (const auto& s : opt_.stop)
        if (!s.empty()) cut = std::min(cut, text.find(s));
      if (cut != std::string::npos) {
        g_.text = text.substr(0, cut);
        g_.stop_reason = "stop_string";
        return std::nullopt;
      }
    }
    if (++i_ == opt_.max_new_tokens) return std::nullopt;
    if (cfg.sliding_window > 0 && position >= cfg.sliding_window) {  // attention kvbench does not implement
      g_.stop_reason = "sliding_window";
      return std::nullopt;
    }
    return token;
  }
  Generation finish() {
    if (g_.stop_reason != "stop_string") g_.text = utf8_lossy(tok_.decode(g_.tokens, true));
    return std::move(g_);
  }

 private:
  const Tokenizer& tok_;
  const GenerateOptions& opt_;
  Generation g_;
  int i_ = 0;
};

// Greedy decoding after `start` has begun the sequence and returned the first logits.
template <typename Start>
Generation run(Engine& engine, const Tokenizer& tok, int prompt_tokens, const GenerateOptions& opt, Start&& start) {
  using clock = std::chrono::steady_clock;
  auto t0 = clock::now();
  std::vector<float> logits = start();
  for (int32_t id : opt.after_prefill) logits = engine.decode(id);
  auto t1 = clock::now();
  GreedyChoice choice(tok, opt);
  while (const auto token = choice.next(logits, engine.position(), engine.config())) logits = engine.decode(*token);
  Generation g = choice.finish();
  g.prompt_tokens = prompt_tokens + static_cast<int>(opt.after_prefill.size());
  g.prefill_seconds = std::chrono::duration<double>(t1 - t0).count();
  g.decode_seconds = std::chrono::duration<double>(clock::now() - t1).count();
  return g;
}

}  // namespace

Generation generate(Engine& engine, const Tokenizer& tok, std::span<const int32_t> prompt, const GenerateOptions& opt,
                    PrefillObserver* observer) {
  return run(engine, tok, static_cast<int>(prompt.size()), opt, [&] { return engine.prefill(prompt, observer); });
}

Generation generate(Engine& engine, const Tokenizer& tok, const PrefillCapture& capture, const GenerateOptions& opt,
                    PrefillObserver* observer) {
  Generation g = run(engine, tok, capture.n_tokens, opt, [&] { return engine.resume(capture, observer); });
  g.prefill_seconds = 0;
  return g;
}

std::vector<Generation> generate_batch(Engine& engine, const Tokenizer& tok, std::span<Sequence> seqs,
                                       std::vector<std::vector<float>> first, const GenerateOptions& opt) {
  using clock = std::chrono::steady_clock;
  if (first.size() != seqs.size())
    fail("generate_batch: {} sequences and {} rows of first logits", seqs.size(), first.size());
  const ModelConfig& cfg = engine.config();
  std::vector<GreedyChoice> choices;
  std::vector<double> seconds(seqs.size(), 0.0);
  choices.reserve(seqs.size());
  std::vector<size_t> members;  // the sequences of the next step, and their tokens
  std::vector<int32_t> tokens;
  auto choose = [&](size_t b, std::vector<float>& logits) {
    const auto t = clock::now();
    if (const auto token = choices[b].next(logits, seqs[b].position(), cfg)) {
      members.push_back(b);
      tokens.push_back(*token);
    }
    seconds[b] += std::chrono::duration<double>(clock::now() - t).count();
  };
  for (size_t b = 0; b < seqs.size(); ++b) {
    choices.emplace_back(tok, opt);
    choose(b, first[b]);
  }
  while (!members.empty()) {
    std::vector<Sequence*> batch;
    for (size_t b : members) batch.push_back(&seqs[b]);
    const auto t = clock::now();
    std::vector<std::vector<float>> logits = engine.decode_batch(batch, tokens);
    const double share = std::chrono::duration<double>(clock::now() - t).count() / double(batch.size());
    const std::vector<size_t> stepped = std::exchange(members, {});
    tokens.clear();
    for (size_t j = 0; j < stepped.size(); ++j) {
      seconds[stepped[j]] += share;
      choose(stepped[j], logits[j]);
    }
  }
  std::vector<Generation> out;
  for (size_t b = 0; b < seqs.size(); ++b) {
    out.push_back(choices[b].finish());
    out.back().decode_seconds = seconds[b];
  }
  return out;
}

std::vector<float> StepLogits::flat() const {
  std::vector<float> out;
  for (const auto& r : logits) out.insert(out.end(), r.begin(), r.end());
  return out;
}

StepLogits step_logits(Engine& engine, std::span<const int32_t> prompt, int steps, std::span<const int32_t> forced,
                       PrefillObserver* observer) {
  if (steps < 0) fail("step_logits: {} steps", steps);
  if (!forced.empty() && forced.size() != size_t(steps))
    fail("step_logits: {} forced tokens for {} steps", forced.size(), steps);
  if (prompt.size() + size_t(steps) > size_t(engine.config().context_length))
    fail("{} prompt tokens and {} steps exceed the model's context length {}", prompt.size(), steps,
         engine.config().context_length);
  StepLogits out;
  out.logits.push_back(engine.prefill(prompt, observer));
  for (int i = 0; i < steps; ++i) {
    out.fed.push_back(forced.empty() ? argmax(out.logits.back()) : forced[size_t(i)]);
    out.logits.push_back(engine.decode(out.fed.back()));
  }
  return out;
}

namespace {

// Scores `continuation` after the logits `first` returns (a prefill of the context, or a resumed capture).
ContinuationScore score_continuation(Engine& engine, size_t context_tokens, std::span<const int32_t> continuation,
                                     const std::function<std::vector<float>()>& first) {
  if (context_tokens == 0 || continuation.empty())
    fail("a log-likelihood needs context and continuation tokens ({} and {} given)", context_tokens,
         continuation.size());
  if (context_tokens + continuation.size() - 1 > size_t(engine.config().context_length))
    fail("{} context and {} continuation tokens exceed the model's context length {}", context_tokens,
         continuation.size(), engine.config().context_length);
  ContinuationScore out;
  auto t = std::chrono::steady_clock::now();
  const auto lap = [&t] {
    const auto now = std::chrono::steady_clock::now();
    const double s = std::chrono::duration<double>(now - t).count();
    t = now;
    return s;
  };
  std::vector<float> logits = first();
  out.prefill_seconds = lap();
  for (size_t i = 0; i < continuation.size(); ++i) {
    const int32_t want = continuation[i];
    // log_softmax in double: lm-eval's is fp32, so sums agree to its precision, not ours.
    out.loglikelihood += log_softmax_at(logits, want);
    out.greedy = out.greedy && argmax(logits) == want;
    if (i + 1 < continuation.size()) logits = engine.decode(want);
  }
  out.decode_seconds = lap();
  return out;
}

}  // namespace

ContinuationScore continuation_loglikelihood(Engine& engine, std::span<const int32_t> context,
                                             std::span<const int32_t> continuation, PrefillObserver* observer) {
  return score_continuation(engine, context.size(), continuation, [&] { return engine.prefill(context, observer); });
}

ContinuationScore continuation_loglikelihood(Engine& engine, const PrefillCapture& context,
                                             std::span<const int32_t> continuation, PrefillObserver* observer) {
  ContinuationScore out = score_continuation(engine, size_t(context.n_tokens), continuation,
                                             [&] { return engine.resume(context, observer); });
  out.prefill_seconds = 0;
  return out;
}

}  // namespace kvb
