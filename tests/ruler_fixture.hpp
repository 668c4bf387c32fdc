#pragma once
// Samples generated here against a fixture of RULER's own generator (tools/reference/ruler_*.py):
// per record the FNV-1a 64 hash of the model input, its length in code points, the outputs and the
// stored length.
#include <fmt/format.h>

#include <algorithm>
#include <fstream>
#include <map>
#include <nlohmann/json.hpp>

#include "harness/task/task.hpp"
#include "test_util.hpp"

namespace kvb::test {

// `make(task, length, samples)` builds a task; returns how many samples are byte-identical.
template <typename Make>
int compare_with_ruler_fixture(const std::string& rel, Make make, int& total) {
  const auto golden = nlohmann::json::parse(std::ifstream(fixture(rel)));
  const int n = golden["samples_per_task"];
  std::map<std::pair<std::string, int>, std::unique_ptr<Task>> tasks;
  int same = 0;
  total = 0;
  for (const auto& r : golden["records"]) {
    const std::string name = r["task"];
    const int length = r["length"];
    auto& t = tasks[{name, length}];
    if (!t) t = make(name, length, n);
    const Sample s = t->sample(r["index"].get<size_t>());
    INFO(name << " L=" << length << " #" << r["index"]);
    uint64_t h = 0xcbf29ce484222325ull;
    for (unsigned char c : s.prompt) h = (h ^ c) * 0x100000001b3ull;
    const bool equal = fmt::format("{:016x}", h) == r["fnv1a64"].get<std::string>();
    CHECK(equal);
    const auto chars = std::count_if(s.prompt.begin(), s.prompt.end(),
                                     [](char c) { return (static_cast<unsigned char>(c) & 0xC0) != 0x80; });
    CHECK(static_cast<size_t>(chars) == r["chars"].get<size_t>());
    CHECK(s.answers == r["outputs"].get<std::vector<std::string>>());
    CHECK(s.meta["length"] == r["stored_length"]);
    CHECK(t->score(s, " " + s.answers.back() + ".") > 0.0);
    same += equal;
    ++total;
  }
  return same;
}

}  // namespace kvb::test
