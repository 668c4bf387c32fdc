#include "harness/task/string_match.hpp"

#include <algorithm>

#include "harness/task/text.hpp"
#include "harness/util/error.hpp"

namespace kvb {

double ruler_string_match(const std::string& prediction, const std::vector<std::string>& references, bool part) {
  // evaluate.py: strip, control characters to newlines, strip again.
  std::string p = python_strip(prediction);
  for (char& c : p)
    if (static_cast<unsigned char>(c) < 0x20) c = '\n';
  p = python_lower(python_strip(p));
  // RULER's evaluator divides by the references (string_match_all) or takes their max (string_match_part):
  // both fail on none.
  if (references.empty()) fail("'answers' is empty; RULER's string match needs at least one reference");
  double hits = 0, any = 0;
  for (const auto& r : references) {
    const double h = p.find(python_lower(r)) != std::string::npos ? 1.0 : 0.0;
    hits += h;
    any = std::max(any, h);
  }
  return part ? any : hits / double(references.size());
}

}  // namespace kvb
