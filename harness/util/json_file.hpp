#pragma once
// JSON files a user supplies (tokenizer.json, config.json, ...): a field of the wrong type or a missing
// key becomes an Error naming the file and the field. The build defines JSON_DIAGNOSTICS, so the JSON
// library's messages carry the field's path: "config.json: (/rope_scaling/factor) type must be
// number, but is string".
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

}  // namespace kvb
