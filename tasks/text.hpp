#pragma once
// Python string semantics that benchmark metrics depend on (spec/benchmarks.md 0.1), so that scores
// computed here equal the reference scripts' scores.
#include <string>
#include <string_view>
#include <vector>

namespace kvb {

// str.split() with no argument: runs of Unicode whitespace (Python's isspace) separate words.
std::vector<std::string> python_split(std::string_view s);
// str.lower(): full Unicode lowercase (one code point to one, as utf8proc maps it).
std::string python_lower(std::string_view s);
// str.strip() with no argument.
std::string python_strip(std::string_view s);

}  // namespace kvb
