#pragma once
// PCRE2 regular expression in UTF + Unicode-property mode (\p{L}, \s over Unicode), JIT-compiled.
// Pre-tokenizer patterns of Hugging Face tokenizers and llama.cpp need lookahead and Unicode classes,
// which std::regex lacks.
#include <functional>
#include <memory>
#include <optional>
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
  // The same matches with their capture groups (what Python's re.findall reads): groups[i] is group
  // i + 1's range, empty where the group took no part in the match.
  struct Match {
    std::pair<size_t, size_t> whole;
    std::vector<std::optional<std::pair<size_t, size_t>>> groups;
  };
  std::vector<Match> find_all_groups(std::string_view text) const;
  const std::string& pattern() const { return pattern_; }

 private:
  struct Impl;
  // Calls `on` with each non-empty match's ovector (pairs of offsets, unset ones PCRE2_UNSET) and its pair count.
  void scan(std::string_view text, const std::function<void(const size_t* ovector, size_t pairs)>& on) const;
  std::string pattern_;
  std::unique_ptr<Impl> impl_;
};

}  // namespace kvb
