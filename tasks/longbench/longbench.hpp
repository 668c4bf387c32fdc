#pragma once
// LongBench's prompt templates (dataset2prompt.json), for the tests that check them against the
// SHA-256 prefixes and lengths of the official THUDM/LongBench config/dataset2prompt.json.
#include <string>

namespace kvb::longbench {

// The template of a dataset with its {context} and {input} placeholders; Error naming it if unknown.
const std::string& prompt_template(const std::string& dataset);

}  // namespace kvb::longbench
