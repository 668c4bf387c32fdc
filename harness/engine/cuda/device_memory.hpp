#pragma once
// Device memory for the CUDA backend: every allocation through one tracker (the benchmark reports its
// peak), self-freeing device arrays, and page-locked host arrays whose reuse waits for the copies
// that last read or filled them.
#include <cublas_v2.h>
#include <cuda_runtime.h>

#include <algorithm>
#include <atomic>
#include <span>
#include <utility>
#include <vector>

#include "kernels/cuda/cuda_kernels.hpp"

namespace kvb::cuda {

void check_blas(cublasStatus_t st, const char* what);

// Every device allocation goes through here so that the benchmark can report peak device memory.
struct MemoryTracker {
  std::atomic<size_t> current{0}, peak{0};
  void* allocate(size_t bytes, const char* what);
  void release(void* p, size_t bytes);
};
MemoryTracker& memory();

// A device allocation that frees itself.
class DeviceArray {
 public:
  DeviceArray() = default;
  explicit DeviceArray(size_t bytes) : bytes_(bytes) {
    if (bytes) p_ = memory().allocate(bytes, "a work array");
  }
  ~DeviceArray() { memory().release(p_, bytes_); }
  DeviceArray(DeviceArray&& o) noexcept : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)) {}
  DeviceArray& operator=(DeviceArray&& o) noexcept {
    std::swap(p_, o.p_);
    std::swap(bytes_, o.bytes_);
    return *this;
  }
  template <typename T>
  T* as() const {
    return static_cast<T*>(p_);
  }
  size_t bytes() const { return bytes_; }
  // Grows to at least `bytes` (contents not kept).
  void ensure(size_t bytes) {
    if (bytes > bytes_) *this = DeviceArray(std::max(bytes, bytes_ * 2));
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
};

// Page-locked host memory (asynchronous copies need it) with an event marking its last use, so that
// it is rewritten only after the copies reading or filling it have finished.
class PinnedArray {
 public:
  PinnedArray() = default;
  ~PinnedArray() {
    if (p_) cudaFreeHost(p_);
    if (done_) cudaEventDestroy(done_);
  }
  PinnedArray(const PinnedArray&) = delete;
  PinnedArray& operator=(const PinnedArray&) = delete;
  PinnedArray(PinnedArray&& o) noexcept
      : p_(std::exchange(o.p_, nullptr)), bytes_(std::exchange(o.bytes_, 0)), done_(std::exchange(o.done_, nullptr)) {}

  // Waits for the last marked use, then returns at least `bytes` of memory.
  void* prepare(size_t bytes) {
    wait();
    if (bytes > bytes_) {
      if (p_) cudaFreeHost(p_);
      p_ = nullptr;
      bytes_ = std::max(bytes, bytes_ * 2);
      check(cudaMallocHost(&p_, bytes_), "cudaMallocHost");
    }
    return p_;
  }
  void mark(cudaStream_t s) {
    if (!done_) check(cudaEventCreateWithFlags(&done_, cudaEventDisableTiming), "cudaEventCreate");
    check(cudaEventRecord(done_, s), "cudaEventRecord");
  }
  void wait() {
    if (done_) check(cudaEventSynchronize(done_), "cudaEventSynchronize");
  }

 private:
  void* p_ = nullptr;
  size_t bytes_ = 0;
  cudaEvent_t done_ = nullptr;
};

template <typename T>
DeviceArray to_device(std::span<const T> v, cudaStream_t s) {
  DeviceArray a(v.size() * sizeof(T));
  if (!v.empty()) check(cudaMemcpyAsync(a.as<void>(), v.data(), a.bytes(), cudaMemcpyHostToDevice, s), "upload");
  return a;
}
template <typename T>
DeviceArray to_device(const std::vector<T>& v, cudaStream_t s) {
  return to_device(std::span<const T>(v), s);
}

}  // namespace kvb::cuda
