#pragma once
// LongBench's prompt templates (dataset2prompt.json), for the tests that check them against the
// SHA-256 prefixes and lengths of spec/benchmarks.md 1.3.
#include <string>

namespace kvb::longbench {

// The template of a dataset with its {context} and {input} placeholders; Error naming it if unknown.
const std::string& prompt_template(const std::string& dataset);

}  // namespace kvb::longbench
