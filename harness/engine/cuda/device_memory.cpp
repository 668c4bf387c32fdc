#include "harness/engine/cuda/device_memory.hpp"

#include "harness/util/error.hpp"

namespace kvb::cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: {}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e));
}

void check_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: {}: status {}", what, static_cast<int>(st));
}

void* MemoryTracker::allocate(size_t bytes, const char* what) {
  void* p = nullptr;
  if (cudaMalloc(&p, std::max<size_t>(bytes, 1)) != cudaSuccess) {
    cudaGetLastError();  // clear the sticky-free error state
    size_t free = 0, total = 0;
    cudaMemGetInfo(&free, &total);
    fail("CUDA: out of device memory allocating {} MiB for {} ({} MiB free of {} MiB)", bytes >> 20, what, free >> 20,
         total >> 20);
  }
  const size_t now = current += bytes;
  size_t old = peak.load();
  while (now > old && !peak.compare_exchange_weak(old, now)) {
  }
  return p;
}

void MemoryTracker::release(void* p, size_t bytes) {
  if (!p) return;
  cudaFree(p);
  current -= bytes;
}

MemoryTracker& memory() {
  static MemoryTracker t;
  return t;
}

}  // namespace kvb::cuda
