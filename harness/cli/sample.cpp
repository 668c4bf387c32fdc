// kvbench sample: one generated sample of a task (prompt, answers, metadata).
#include <fmt/format.h>

#include <nlohmann/json.hpp>

#include "harness/cli/commands.hpp"
#include "harness/engine/engine.hpp"
#include "harness/engine/generate.hpp"
#include "harness/experiment/experiment.hpp"
#include "harness/experiment/results.hpp"
#include "harness/method/method.hpp"
#include "harness/model/model_file.hpp"
#include "harness/task/task.hpp"
#include "harness/tokenizer/tokenizer.hpp"
#include "harness/util/error.hpp"

namespace kvb::cli {

using nlohmann::json;

void register_sample_command(CLI::App& app) {
  auto* cmd = app.add_subcommand("sample", "Print one generated sample of a task: prompt, answers, metadata");
  auto a = std::make_shared<TaskArgs>();
  auto index = std::make_shared<size_t>(0);
  add_task_args(cmd, *a);
  cmd->add_option("--index,-i", *index, "Sample index")->check(kNonNegative);
  cmd->callback([a, index] {
    auto m = ModelFile::open(a->model);
    auto tok = load_tokenizer(*m);
    auto task = make_task(*a, *tok);
    if (*index >= task->size()) fail("--index {}: task {} has {} samples", *index, a->task, task->size());
    const Sample s = task->sample(*index);
    if (s.choices) {
      // Each choice as lm-eval's request: the context (compressed) and the continuation scored after it.
      json choices = json::array();
      for (const Choice& c : s.choices->options) {
        const PromptIds ids = choice_ids(*tok, c, s.choices->bos);
        choices.push_back({{"text", c.text},
                           {"context", c.context},
                           {"continuation", c.continuation},
                           {"context_tokens", ids.prefill},
                           {"continuation_tokens", ids.after}});
      }
      fmt::print("{}\n", json{{"id", s.id},
                              {"answers", s.answers},
                              {"gold", s.choices->gold},
                              {"metric", s.choices->metric},
                              {"meta", s.meta},
                              {"choices", choices}}
                             .dump(2));
      return;
    }
    const PromptIds ids = sample_prompt(*m, *tok, s);
    json j = {{"id", s.id},
              {"answers", s.answers},
              {"max_new_tokens", s.max_new_tokens},
              {"stop", s.stop},
              {"end_texts", s.end_texts},
              {"chat", s.chat},
              {"meta", s.meta},
              {"prompt_tokens", ids.prefill.size() + ids.after.size()}};
    if (s.split) {
      j["compressed_tokens"] = ids.prefill.size();
      j["after_compression_tokens"] = ids.after.size();
    }
    fmt::print("{}\n", j.dump(2));
    if (!s.split) {
      fmt::print("--- prompt ---\n{}\n", s.prompt);
      return;
    }
    // As the model reads it: the chat template's turn around the parts.
    fmt::print("--- prefilled and compressed ---\n{}\n--- after compression ---\n{}\n", tok->decode(ids.prefill),
               tok->decode(ids.after));
  });
}

}  // namespace kvb::cli
