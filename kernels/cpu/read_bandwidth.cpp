#include "kernels/cpu/read_bandwidth.hpp"

#include <immintrin.h>
#include <omp.h>

#include <algorithm>
#include <chrono>
#include <cstring>
#include <vector>

#include "kernels/cpu/kv_rows.hpp"

namespace kvb {
namespace {

// Floats per step of the wide loops: 512 bytes, eight lines to eight independent sums (the loop waits on
// memory, not on adds).
constexpr size_t kStep = 128;
// Fetched ahead in software, as the decode kernels do: on a 2-core Emerald Rapids the fetched stream read
// 26-27 GB/s from memory where the plain one read 17-18.
constexpr size_t kAhead = 4096 / sizeof(float);

void fetch_ahead(const float* x, size_t i, size_t n) {
  if (i + kAhead + kStep > n) return;
  for (size_t l = 0; l < kStep; l += 16) _mm_prefetch(reinterpret_cast<const char*>(x + i + kAhead + l), _MM_HINT_T0);
}

// Each loop sums the thread's share of [0, n) `passes` times. They read the same bytes; 512-bit loads read
// a GiB 8-23% faster than 128-bit ones on that Xeon, so the bound is the widest loop the kernels may use.
float sum_portable(const float* x, size_t n, size_t passes, bool ahead) {
  float acc[16] = {};  // a line a step, one fetch ahead each: wider steps read slower here
  for (size_t pass = 0; pass < passes; ++pass) {
#pragma omp for schedule(static) nowait
    for (size_t i = 0; i < n; i += 16) {
      if (ahead && i + kAhead < n) _mm_prefetch(reinterpret_cast<const char*>(x + i + kAhead), _MM_HINT_T0);
      for (size_t k = 0; k < 16; ++k) acc[k] += x[i + k];
    }
  }
  float total = 0;
  for (float a : acc) total += a;
  return total;
}

// The wide loops, W floats a register (GCC's vector types, compiled for the caller's instructions): eight
// sums, each taking a line a step.
template <int W>
__attribute__((always_inline)) inline float sum_wide(const float* x, size_t n, size_t passes, bool ahead) {
  typedef float Reg __attribute__((vector_size(W * sizeof(float))));
  Reg acc[8] = {};
  for (size_t pass = 0; pass < passes; ++pass) {
#pragma omp for schedule(static) nowait
    for (size_t i = 0; i < n; i += kStep) {
      if (ahead) fetch_ahead(x, i, n);
      for (size_t line = 0; line < 8; ++line)
        for (int j = 0; j < 16; j += W) {
          Reg v;
          std::memcpy(&v, x + i + 16 * line + j, sizeof v);
          acc[line] += v;
        }
    }
  }
  float lanes[8 * W];
  std::memcpy(lanes, acc, sizeof lanes);
  float total = 0;
  for (float v : lanes) total += v;
  return total;
}

__attribute__((target("avx2"))) float sum_avx2(const float* x, size_t n, size_t passes, bool ahead) {
  return sum_wide<8>(x, n, passes, ahead);
}
__attribute__((target("avx512f"))) float sum_avx512(const float* x, size_t n, size_t passes, bool ahead) {
  return sum_wide<16>(x, n, passes, ahead);
}

}  // namespace

double measure_read_bandwidth_gbs(size_t bytes, int reps) {
  const size_t n = std::max<size_t>(bytes / sizeof(float), 1024) / kStep * kStep;
  bytes = n * sizeof(float);
  std::vector<float> x(n);
#pragma omp parallel for schedule(static)
  for (size_t i = 0; i < n; ++i) x[i] = static_cast<float>(i & 7);
  auto* const sum = cpu_has_avx512() ? sum_avx512 : cpu_has_avx2() ? sum_avx2 : sum_portable;
  double best = 0;
  volatile float sink = 0;
  // A small buffer is read several times per timing, so that the parallel region's start is not timed.
  const size_t passes = std::max<size_t>(1, (size_t{64} << 20) / bytes);
  for (int r = 0; r < 2 * reps + 2; ++r) {  // the first two warm up the threads and the pages
    const bool ahead = r % 2 == 1;
    const auto t0 = std::chrono::steady_clock::now();
    float total = 0;
#pragma omp parallel reduction(+ : total)
    total += sum(x.data(), n, passes, ahead);
    const double s = std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    sink = sink + total;
    if (r > 1) best = std::max(best, static_cast<double>(bytes) * static_cast<double>(passes) / s / 1e9);
  }
  return best;
}

}  // namespace kvb
