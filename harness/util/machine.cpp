#include "harness/util/machine.hpp"

#include <cblas.h>

#include <algorithm>
#include <chrono>
#include <fstream>
#include <string>
#include <vector>

namespace kvb {

double measure_sgemm_gflops(int n, int reps) {
  std::vector<float> a(size_t(n) * n, 0.5f), b(size_t(n) * n, 0.25f), c(size_t(n) * n);
  double best = 0;
  for (int r = 0; r < reps + 1; ++r) {  // the first run warms up threads and pages
    const auto t0 = std::chrono::steady_clock::now();
    cblas_sgemm(CblasRowMajor, CblasNoTrans, CblasNoTrans, n, n, n, 1.0f, a.data(), n, b.data(), n, 0.0f, c.data(), n);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (r > 0) best = std::max(best, 2.0 * n * n * static_cast<double>(n) / s / 1e9);
  }
  return best;
}

double measure_read_bandwidth_gbs(size_t bytes, int reps) {
  constexpr size_t kLanes = 16;  // independent accumulators, so the loop waits on memory, not on adds
  const size_t n = std::max<size_t>(bytes / sizeof(float), 1024) / kLanes * kLanes;
  bytes = n * sizeof(float);
  std::vector<float> x(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i & 7);
  double best = 0;
  volatile float sink = 0;
  // A small buffer is read several times per timing, so that the parallel region's start is not timed.
  const size_t passes = std::max<size_t>(1, (size_t{64} << 20) / bytes);
  // Each timing alternately with and without fetching 4 KiB ahead in software, as the decode kernels do:
  // on a 2-core Emerald Rapids the fetched stream read 26-27 GB/s from memory where the plain one read 17-18.
  constexpr size_t kAhead = 4096 / sizeof(float);
  for (int r = 0; r < 2 * reps + 2; ++r) {
    const bool ahead = r % 2 == 1;
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    {
      float acc[kLanes] = {};
      for (size_t pass = 0; pass < passes; ++pass) {
#pragma omp for schedule(static) nowait
        for (size_t i = 0; i < n; i += kLanes) {
          if (ahead && i + kAhead < n) __builtin_prefetch(x.data() + i + kAhead, 0, 3);
          for (size_t k = 0; k < kLanes; ++k) acc[k] += x[i + k];
        }
      }
      for (float a : acc) total += a;
    }
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    if (r > 1) best = std::max(best, static_cast<double>(bytes) * static_cast<double>(passes) / s / 1e9);
  }
  return best;
}

size_t peak_rss_bytes() {
  std::ifstream in("/proc/self/status");
  std::string key;
  while (in >> key) {
    if (key == "VmHWM:") {
      size_t kb = 0;
      in >> kb;
      return kb * 1024;
    }
    in.ignore(1 << 12, '\n');
  }
  return 0;
}

bool reset_peak_rss() {
  std::ofstream out("/proc/self/clear_refs");
  if (!out) return false;
  out << "5";
  return static_cast<bool>(out);
}

}  // namespace kvb
