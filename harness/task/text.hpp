#pragma once
// Python string semantics that benchmark metrics depend on, so that scores
// computed here equal the reference scripts' scores.
#include <cstdint>
#include <map>
#include <string>
#include <string_view>
#include <vector>

#include "harness/tokenizer/unicode.hpp"

namespace kvb {

// str.split() with no argument: runs of Unicode whitespace (Python's isspace) separate words.
std::vector<std::string> python_split(std::string_view s);
// str.lower(): full Unicode lowercase (one code point to one, as utf8proc maps it).
std::string python_lower(std::string_view s);
// re.sub(r"\s+", " ", s): every run of Unicode whitespace becomes one space.
std::string python_collapse_space(std::string_view s);

// len(s): the number of code points (an invalid byte counts as one).
size_t python_len(std::string_view s);
// str.capitalize(): the first code point in title case, the rest lowercased.
std::string python_capitalize(std::string_view s);

// Python's str.format for named fields: every {name} replaced at once (inserted text is not scanned
// again), {{ and }} for literal braces; Error naming the field a template uses without a value.
std::string fill_template(const std::string& t, const std::map<std::string, std::string>& fields);

}  // namespace kvb
