#pragma once
// Measurements of the machine a benchmark runs on, so that speeds can be reported as fractions of
// what the hardware delivers in the same run.
#include <cstddef>

namespace kvb {

// Best fp32 GEMM rate of the BLAS (square n x n x n products, best of `reps`), GFLOP/s.
double measure_sgemm_gflops(int n = 2048, int reps = 5);
// Peak resident memory of this process since start or since the last reset, bytes.
size_t peak_rss_bytes();
// Resets the peak to the current resident size (Linux clear_refs); false if not possible.
bool reset_peak_rss();

}  // namespace kvb
