#pragma once
// One exception type for every user-facing failure: the message must say where (file, key, tensor),
// what was expected and, where it helps, what to do next. Callers never see a crash for bad input.
#include <fmt/format.h>

#include <stdexcept>
#include <string>

namespace kvb {

class Error : public std::runtime_error {
 public:
  explicit Error(const std::string& what) : std::runtime_error(what) {}
};

template <typename... Args>
[[noreturn]] void fail(fmt::format_string<Args...> f, Args&&... args) {
  throw Error(fmt::format(f, std::forward<Args>(args)...));
}

}  // namespace kvb
