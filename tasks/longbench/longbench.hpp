#pragma once
// LongBench's prompt templates (dataset2prompt.json), for the tests that check them against the
// SHA-256 prefixes and lengths of the official THUDM/LongBench config/dataset2prompt.json, and
// kvpress's split of each into context, question and answer prefix.
#include <string>

namespace kvb::longbench {

// The template of a dataset with its {context} and {input} placeholders; Error naming it if unknown.
const std::string& prompt_template(const std::string& dataset);

// kvpress's three parts of a dataset's template: context + question + answer_prefix is the template
// (for trec, triviaqa and samsum the answer prefix ends the record's input instead, and is cut from it).
struct SplitTemplate {
  std::string context, question, answer_prefix;
  bool prefix_ends_input = false;
};
SplitTemplate kvpress_template(const std::string& dataset);

}  // namespace kvb::longbench
