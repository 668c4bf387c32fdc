#pragma once
// The read bandwidth a decode step's bound divides its bytes by, measured with the widest vector loads
// the CPU kernels are allowed (kernels/cpu/kv_rows.hpp: cpu_has_avx512, cpu_has_avx2), as they read.
#include <cstddef>

namespace kvb {

// Best read bandwidth over a buffer of `bytes` read again and again (parallel sum, best of `reps` each with
// and without fetching ahead in software), GB/s:
// by default one larger than the caches, the memory's rate; a smaller one gives the rate at which a
// working set of that size is read where it stays in a cache (a decode step's weights in a large L3).
double measure_read_bandwidth_gbs(size_t bytes = size_t{1} << 30, int reps = 5);

}  // namespace kvb
