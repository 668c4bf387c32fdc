#pragma once
// PCRE2 regular expression in UTF + Unicode-property mode (\p{L}, \s over Unicode), JIT-compiled.
// Pre-tokenizer patterns of Hugging Face tokenizers and llama.cpp need lookahead and Unicode classes,
// which std::regex lacks.
#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kvb {

class Regex {
 public:
  explicit Regex(const std::string& pattern);
  ~Regex();
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Non-overlapping matches as [begin, end) byte ranges, scanning left to right. `text` must be
  // valid UTF-8.
  std::vector<std::pair<size_t, size_t>> find_all(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvb
