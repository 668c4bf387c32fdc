#pragma once
// JSON files a user supplies (tokenizer.json, config.json, ...): a field of the wrong type or a missing
// key becomes an Error naming the file and the field. The build defines JSON_DIAGNOSTICS, so the JSON
// library's messages carry the field's path: "config.json: (/rope_scaling/factor) type must be
// number, but is string".
#include <functional>
#include <istream>
#include <nlohmann/json.hpp>
#include <string>

#include "harness/util/error.hpp"

namespace kvb {

// The library's message without its "[json.exception.type_error.302] " prefix.
inline std::string json_error_text(const nlohmann::json::exception& e) {
  const std::string w = e.what();
  const size_t end = w.rfind("] ", w.find('('));
  return w.rfind("[json.exception.", 0) == 0 && end != std::string::npos ? w.substr(end + 2) : w;
}

// fn() reads a JSON document of `file`; the library's exceptions leave as kvb::Error.
template <typename F>
decltype(auto) with_json_errors(const std::string& file, F&& fn) {
  try {
    return fn();
  } catch (const nlohmann::json::exception& e) {
    fail("{}: {}", file, json_error_text(e));
  }
}

// Calls fn(record, line_number) for each line of a JSONL stream read from `path` that is not blank
// (spaces, tabs, carriage returns); fn returns false to stop early. A line that is not JSON is an
// Error naming the file and the line.
inline void for_each_json_line(std::istream& in, const std::string& path,
                               const std::function<bool(const nlohmann::json&, int)>& fn) {
  std::string line;
  for (int no = 1; std::getline(in, line); ++no) {
    if (line.find_first_not_of(" \t\r") == std::string::npos) continue;
    nlohmann::json j;
    try {
      j = nlohmann::json::parse(line);
    } catch (const nlohmann::json::exception& e) {
      fail("{}:{}: not JSON ({})", path, no, json_error_text(e));
    }
    if (!fn(j, no)) return;
  }
}

}  // namespace kvb
