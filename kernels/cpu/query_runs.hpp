#pragma once
// The queries of a GQA group in runs whose size is a compile-time constant, so that a kernel templated on
// it keeps its accumulators in registers.
#include <algorithm>
#include <type_traits>

namespace kvb {

namespace detail {
template <int G, class F>
void query_run(int m, int j, F& f) {
  if constexpr (G > 1)
    if (m < G) return query_run<G - 1>(m, j, f);
  f(std::integral_constant<int, G>{}, j);
}
}  // namespace detail

// Calls f(std::integral_constant<int, G>{}, j) for queries j .. j + G - 1 of g, in runs of Max (the last
// shorter).
template <int Max, class F>
void for_query_runs(int g, F&& f) {
  for (int j = 0; j < g; j += Max) detail::query_run<Max>(std::min(Max, g - j), j, f);
}

}  // namespace kvb
