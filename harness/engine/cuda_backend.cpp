// CUDA backend: weights in bf16 on the device, GEMMs through cuBLAS (bf16 inputs, fp32 accumulation and
// output), decode matrix-vector products and every other operation in our kernels (kernels/cuda).
// Activations stay fp32. The host LayerCache remains the cache of record (methods edit it); the
// backend keeps a device copy of each cache it attends over, re-sent whole when the cache is
// restructured and extended by the appended tokens otherwise.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <chrono>
#include <cstring>
#include <span>
#include <unordered_map>

#include "harness/cache/device_form.hpp"
#include "harness/cache/layer_cache.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/op_timer.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace kvb {
namespace cuda {

void check(cudaError_t e, const char* what) {
  if (e != cudaSuccess) fail("CUDA: {}: {} ({})", what, cudaGetErrorString(e), static_cast<int>(e));
}

}  // namespace cuda

namespace {

using cuda::check;

void check_blas(cublasStatus_t st, const char* what) {
  if (st != CUBLAS_STATUS_SUCCESS) fail("cuBLAS: {}: status {}", what, static_cast<int>(st));
}

// Every device allocation goes through here so that the benchmark can report peak device memory.
struct MemoryTracker {
  std::atomic<size_t> current{0}, peak{0};
  void* allocate(size_t bytes, const char* what) {
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
  void release(void* p, size_t bytes) {
    if (!p) return;
    cudaFree(p);
    current -= bytes;
  }
};
MemoryTracker& memory() {
  static MemoryTracker t;
  return t;
}

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

// The device copy of one segment.
struct SegmentMirror {
  const Segment* seg = nullptr;
  size_t uploaded = 0;  // tokens on the device (dense segments grow by appends)
  size_t capacity = 0;  // dense: tokens the k/v arrays hold
  std::vector<DeviceArray> arrays;
  cuda::DecodeSegment desc;
};

struct CacheMirror {
  uint64_t epoch = 0;
  // The device holds one token more per head than the host until the host appends it
  // (append_on_device); the attention right after trusts the copy.
  bool pending = false;
  std::vector<std::vector<SegmentMirror>> heads;
  std::unordered_map<const void*, DeviceArray> shared;  // bases and estimators, by host address
  DeviceArray meta, scores, partials, scatter;
  PinnedArray meta_host, scatter_host;
};

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
      fail("backend 'cuda': no CUDA GPU is visible (cudaGetDeviceCount found none); use --backend cpu");
    check(cudaSetDevice(0), "cudaSetDevice");
    check(cudaStreamCreateWithFlags(&stream_, cudaStreamNonBlocking), "cudaStreamCreate");
    check_blas(cublasCreate(&blas_), "cublasCreate");
    check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    name_ = fmt::format("cuda ({})", prop.name);
  }
  ~CudaBackend() override {
    mirrors_.clear();
    cublasDestroy(blas_);
    cudaStreamDestroy(stream_);
  }

  std::string name() const override { return name_; }

  float* allocate(size_t n) override {
    return static_cast<float*>(memory().allocate(n * sizeof(float), "activations"));
  }
  void release(float* p, size_t n) override { memory().release(p, n * sizeof(float)); }
  size_t peak_memory_bytes() const override { return memory().peak; }
  void reset_peak_memory() override { memory().peak = memory().current.load(); }

  void set_weight_format(WeightFormat f) override {
    if (f != WeightFormat::BF16)
      fail("the CUDA backend stores weights as bf16 only; weight format {} is for --backend cpu",
           weight_format_name(f));
  }
  WeightFormat weight_format() const override { return WeightFormat::BF16; }

  void* upload_weight(std::span<const float> w, int, int, size_t& bytes) override {
    std::vector<uint16_t> h(w.size());
    // Round to nearest even, as __float2bfloat16_rn does.
#pragma omp parallel for schedule(static) if (w.size() > (1u << 20))
    for (size_t i = 0; i < w.size(); ++i) h[i] = float_to_bf16(w[i]);
    bytes = h.size() * sizeof(uint16_t);
    void* p = memory().allocate(bytes, "a weight");
    check(cudaMemcpy(p, h.data(), bytes, cudaMemcpyHostToDevice), "weight upload");
    weight_sizes_[p] = bytes;
    return p;
  }
  void release_weight(void* p) override {
    memory().release(p, weight_sizes_.at(p));
    weight_sizes_.erase(p);
  }

  void upload(Buffer& dst, std::span<const float> src, size_t offset) override {
    check(cudaMemcpyAsync(dst.data() + offset, src.data(), src.size_bytes(), cudaMemcpyHostToDevice, stream_),
          "upload");
  }
  void download(const Buffer& src, std::span<float> dst, size_t offset) override {
    check(cudaMemcpyAsync(dst.data(), src.data() + offset, dst.size_bytes(), cudaMemcpyDeviceToHost, stream_),
          "download");
    synchronize();
  }
  void forget_caches() override { mirrors_.clear(); }

  float* stage(int slot, size_t n) override {
    if (slot >= static_cast<int>(stages_.size())) stages_.resize(slot + 1);
    return static_cast<float*>(stages_[slot].prepare(n * sizeof(float)));
  }
  void download_async(const Buffer& src, std::span<float> dst, size_t offset) override {
    check(cudaMemcpyAsync(dst.data(), src.data() + offset, dst.size_bytes(), cudaMemcpyDeviceToHost, stream_),
          "download");
  }
  void fence(int slot) override { stages_.at(slot).mark(stream_); }
  void wait(int slot) override { stages_.at(slot).wait(); }

  bool append_on_device(const LayerCache& cache, const Buffer& k, const Buffer& v, int n_kv_heads) override {
    auto it = mirrors_.find(&cache);
    if (it == mirrors_.end()) return false;
    CacheMirror& m = it->second;
    m.pending = false;
    const int hc = cache.n_cache_heads(), d = cache.head_dim();
    if (m.epoch != cache.epoch() || static_cast<int>(m.heads.size()) != hc) return false;
    for (int h = 0; h < hc; ++h) {
      const auto& segs = cache.segments(h);
      const auto& mh = m.heads[h];
      if (segs.empty() || segs.size() != mh.size() || mh.back().desc.kind != cuda::kDense) return false;
      for (size_t i = 0; i < segs.size(); ++i)
        if (mh[i].seg != segs[i].get() || segs[i]->size() != mh[i].uploaded) return false;
    }
    // Row pointers for one scatter launch: k rows then v rows; cache head h reads KV head h / rep.
    const int rep = hc / n_kv_heads;
    auto* ptrs = static_cast<const float**>(m.scatter_host.prepare(4 * size_t(hc) * sizeof(float*)));
    for (int h = 0; h < hc; ++h) {
      SegmentMirror& tail = m.heads[h].back();
      if (tail.uploaded + 1 > tail.capacity) grow_dense(tail, tail.uploaded + 1);
      ptrs[h] = k.data() + size_t(h / rep) * d;
      ptrs[hc + h] = v.data() + size_t(h / rep) * d;
      ptrs[2 * hc + h] = tail.desc.k + tail.uploaded * d;
      ptrs[3 * hc + h] = tail.desc.v + tail.uploaded * d;
      ++tail.uploaded;
    }
    m.scatter.ensure(4 * size_t(hc) * sizeof(float*));
    check(cudaMemcpyAsync(m.scatter.as<void>(), ptrs, 4 * size_t(hc) * sizeof(float*), cudaMemcpyHostToDevice, stream_),
          "scatter pointers");
    m.scatter_host.mark(stream_);
    cuda::copy_rows(m.scatter.as<const float*>(), m.scatter.as<float*>() + 2 * hc, 2 * hc, d, stream_);
    m.pending = true;
    return true;
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  void set_rope(std::vector<float> inv_freq, bool interleaved) override {
    inv_freq_host_ = inv_freq;
    inv_freq_ = to_device(inv_freq, stream_);
    interleaved_ = interleaved;
  }

  void embed(const Weight& table, std::span<const int32_t> ids, int dim, Buffer& out) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    const int32_t* d_ids = upload_ints(ids);
    cuda::embed_bf16(static_cast<const uint16_t*>(table.data()), d_ids, static_cast<int>(ids.size()), dim, out.data(),
                     stream_);
  }

  void rmsnorm(const Buffer& x, const Buffer& w, int n, int dim, float eps, Buffer& y, size_t x_offset) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    cuda::rmsnorm(x.data() + x_offset, w.data(), n, dim, eps, y.data(), stream_);
  }

  void linear(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y) override {
    OpTimer t(*this, profiling_, stats_.linear_seconds);
    stats_.linear_flops += 2.0 * n * in * out;
    const auto* wb = static_cast<const uint16_t*>(w.data());
    if (n <= 4 && in % 8 == 0) {
      cuda::gemv_bf16(x.data(), wb, n, in, out, y.data(), stream_);
    } else {
      xb_.ensure(size_t(n) * in * sizeof(uint16_t));
      cuda::f32_to_bf16(x.data(), xb_.as<uint16_t>(), size_t(n) * in, stream_);
      // Column-major view: Y^T[out, n] = W[in, out]^T X^T[in, n].
      const float alpha = 1.0f, beta = 0.0f;
      check_blas(
          cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, out, n, in, &alpha, wb, CUDA_R_16BF, in, xb_.as<uint16_t>(),
                       CUDA_R_16BF, in, &beta, y.data(), CUDA_R_32F, out, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
          "linear");
    }
    if (bias) cuda::add_bias(y.data(), bias->data(), n, out, stream_);
  }

  void rope(Buffer& x, int n, int heads, int d, std::span<const int32_t> pos) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    bool consecutive = true;
    for (size_t i = 1; i < pos.size() && consecutive; ++i) consecutive = pos[i] == pos[0] + static_cast<int32_t>(i);
    cuda::rope(x.data(), n, heads, d, consecutive ? nullptr : upload_ints(pos), pos[0], inv_freq_.as<float>(),
               interleaved_, 1.0f, stream_);
  }

  void swiglu(const Buffer& gate, const Buffer& up, size_t n, Buffer& out) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    cuda::swiglu(gate.data(), up.data(), n, out.data(), stream_);
  }

  void add(Buffer& x, const Buffer& y, size_t n, size_t x_offset) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    cuda::add(x.data() + x_offset, y.data(), n, stream_);
  }

  void attention_prefill(const Buffer& q, const Buffer& k, const Buffer& v, int n, int hq, int hkv, int d, Buffer& out,
                         std::vector<float>* colsum) override {
    OpTimer t(*this, profiling_, stats_.attention_seconds);
    if (!cuda::attention_prefill_supports(d)) fail("CUDA prefill attention supports head dims 64 and 128, not {}", d);
    stats_.attention_flops += 4.0 * d * hq * (static_cast<double>(n) * (n + 1) / 2);
    lse_.ensure(size_t(hq) * n * sizeof(float));
    qkv_bf16_.ensure(cuda::attention_prefill_scratch_bytes(n, hq, hkv, d));
    cuda::attention_prefill(q.data(), k.data(), v.data(), n, hq, hkv, d, out.data(), lse_.as<float>(),
                            qkv_bf16_.as<uint16_t>(), stream_);
    if (colsum) {
      colsum_.ensure(size_t(hq) * n * sizeof(float));
      cuda::attention_colsum(q.data(), k.data(), lse_.as<float>(), n, hq, hkv, d, colsum_.as<float>(), stream_);
      colsum->resize(size_t(hq) * n);
      check(cudaMemcpyAsync(colsum->data(), colsum_.as<float>(), colsum->size() * sizeof(float), cudaMemcpyDeviceToHost,
                            stream_),
            "colsum download");
      synchronize();
    }
  }

  void attention_decode(const LayerCache& cache, const Buffer& q, Buffer& out) override {
    OpTimer t(*this, profiling_, stats_.attention_seconds);
    stats_.attention_flops += 4.0 * cache.head_dim() * cache.n_query_heads() * static_cast<double>(cache.tokens(0));
    CacheMirror& m = sync(cache);
    cuda::attention_decode(layout(cache, m), q.data(), out.data(), stream_);
  }

  DeviceLimits measure_limits() override {
    DeviceLimits lim;
    lim.gemm_kind = "cuBLAS bf16 GEMM (fp32 accumulate)";
    {
      const int n = 8192;
      DeviceArray a(size_t(n) * n * 2), b(size_t(n) * n * 2), c(size_t(n) * n * 4);
      check(cudaMemsetAsync(a.as<void>(), 0x3c, a.bytes(), stream_), "memset");
      check(cudaMemsetAsync(b.as<void>(), 0x3c, b.bytes(), stream_), "memset");
      const float alpha = 1.0f, beta = 0.0f;
      lim.gemm_gflops = best_rate(2.0 * n * n * double(n) / 1e9, [&] {
        check_blas(
            cublasGemmEx(blas_, CUBLAS_OP_T, CUBLAS_OP_N, n, n, n, &alpha, a.as<void>(), CUDA_R_16BF, n, b.as<void>(),
                         CUDA_R_16BF, n, &beta, c.as<void>(), CUDA_R_32F, n, CUBLAS_COMPUTE_32F, CUBLAS_GEMM_DEFAULT),
            "peak GEMM");
      });
    }
    {
      const size_t bytes = size_t(2) << 30;
      DeviceArray src(bytes), dst(bytes);
      check(cudaMemsetAsync(src.as<void>(), 0, bytes, stream_), "memset");
      // A copy reads and writes every byte; decoding mostly reads, so both count.
      lim.bandwidth_gbs = best_rate(2.0 * double(bytes) / 1e9, [&] {
        check(cudaMemcpyAsync(dst.as<void>(), src.as<void>(), bytes, cudaMemcpyDeviceToDevice, stream_), "copy");
      });
    }
    return lim;
  }

 private:
  // Best rate of `work` units per second over several timed runs after a warm-up.
  template <typename F>
  double best_rate(double work, F&& run) {
    cudaEvent_t a, b;
    check(cudaEventCreate(&a), "event");
    check(cudaEventCreate(&b), "event");
    run();
    double best = 0;
    for (int r = 0; r < 5; ++r) {
      check(cudaEventRecord(a, stream_), "event");
      run();
      check(cudaEventRecord(b, stream_), "event");
      check(cudaEventSynchronize(b), "event");
      float ms = 0;
      check(cudaEventElapsedTime(&ms, a, b), "event");
      best = std::max(best, work / (ms / 1e3));
    }
    cudaEventDestroy(a);
    cudaEventDestroy(b);
    return best;
  }

  // Token ids and positions, through page-locked memory so that the copy does not stall the host;
  // a ring of staging buffers lets several be in flight.
  const int32_t* upload_ints(std::span<const int32_t> v) {
    PinnedArray& st = int_stage_[next_int_stage_++ % int_stage_.size()];
    void* h = st.prepare(v.size_bytes());
    std::memcpy(h, v.data(), v.size_bytes());
    // One device array suffices: the stream orders each copy after the kernels reading the last one.
    ints_.ensure(v.size_bytes());
    check(cudaMemcpyAsync(ints_.as<void>(), h, v.size_bytes(), cudaMemcpyHostToDevice, stream_), "upload ids");
    st.mark(stream_);
    return ints_.as<int32_t>();
  }

  // What a segment's device_form uploads through: arrays kept by its mirror, shared data (bases,
  // estimator matrices) once per rebuild, by host address.
  class Uploader final : public DeviceUploader {
   public:
    Uploader(CudaBackend& b, CacheMirror& m, SegmentMirror& sm) : b_(b), m_(m), sm_(sm) {}
    const float* upload(std::span<const float> x) override { return put(x); }
    const int32_t* upload(std::span<const int32_t> x) override { return put(x); }
    const uint32_t* upload(std::span<const uint32_t> x) override { return put(x); }
    const uint16_t* upload(std::span<const uint16_t> x) override { return put(x); }
    const float* upload_shared(std::span<const float> x) override {
      auto it = m_.shared.find(x.data());
      if (it == m_.shared.end()) it = m_.shared.emplace(x.data(), to_device(x, b_.stream_)).first;
      return it->second.as<float>();
    }
    void check_rope(const RopeTable& r) override { b_.check_rope(r); }

   private:
    template <typename T>
    const T* put(std::span<const T> x) {
      sm_.arrays.push_back(to_device(x, b_.stream_));
      return sm_.arrays.back().template as<T>();
    }
    CudaBackend& b_;
    CacheMirror& m_;
    SegmentMirror& sm_;
  };

  void check_rope(const RopeTable& r) const {
    if (std::vector<float>(r.inv_freq().begin(), r.inv_freq().end()) != inv_freq_host_ ||
        (r.style() == RopeStyle::Interleaved) != interleaved_)
      fail("CUDA decode: a segment's RoPE table differs from the model's");
  }

  // The device form of one segment, built from scratch.
  SegmentMirror mirror_of(CacheMirror& m, const Segment& s) {
    SegmentMirror sm;
    sm.seg = &s;
    sm.uploaded = s.size();
    auto& d = sm.desc;
    if (const auto* ds = dynamic_cast<const DenseSegment*>(&s)) {
      // Room to grow: decoding appends to the dense tail.
      d.kind = cuda::kDense;
      sm.capacity = std::max<size_t>(s.size(), 16);
      const size_t row = size_t(ds->head_dim()) * sizeof(float);
      sm.arrays.emplace_back(sm.capacity * row);
      sm.arrays.emplace_back(sm.capacity * row);
      upload_dense_rows(*ds, 0, s.size(), sm.arrays[0].as<char>(), sm.arrays[1].as<char>());
      d.k = sm.arrays[0].as<float>();
      d.v = sm.arrays[1].as<float>();
      return sm;
    }
    // Every other format describes its own device form (harness/cache/device_form.hpp).
    Uploader up(*this, m, sm);
    if (!s.device_form(up, d)) fail("CUDA decode: segment format '{}' has no GPU form; use --backend cpu", s.format());
    return sm;
  }

  // Rows t0 .. t0+n of a dense segment's K and V to device fp32 rows. 16-bit rows are widened on the
  // host: the device copy holds the same (rounded) numbers the CPU path reads, at fp32 width.
  void upload_dense_rows(const DenseSegment& ds, size_t t0, size_t n, char* k_dst, char* v_dst) {
    if (n == 0) return;
    const size_t count = n * size_t(ds.head_dim()), bytes = count * sizeof(float);
    if (ds.dtype() == KvDtype::F32) {
      check(cudaMemcpyAsync(k_dst, ds.k() + t0 * ds.head_dim(), bytes, cudaMemcpyHostToDevice, stream_), "k rows");
      check(cudaMemcpyAsync(v_dst, ds.v() + t0 * ds.head_dim(), bytes, cudaMemcpyHostToDevice, stream_), "v rows");
      return;
    }
    std::vector<float> k(count), v(count);
    ds.read(t0, n, k.data(), v.data());
    // Pageable sources: the copies are staged before these calls return, so the vectors may go.
    check(cudaMemcpyAsync(k_dst, k.data(), bytes, cudaMemcpyHostToDevice, stream_), "k rows");
    check(cudaMemcpyAsync(v_dst, v.data(), bytes, cudaMemcpyHostToDevice, stream_), "v rows");
  }

  // Makes room for `n` tokens in a dense segment's device copy (doubling).
  void grow_dense(SegmentMirror& sm, size_t n) {
    if (n <= sm.capacity) return;
    const size_t row = size_t(static_cast<const DenseSegment&>(*sm.seg).head_dim()) * sizeof(float);
    const size_t cap = std::max(n, sm.capacity * 2);
    for (int i : {0, 1}) {
      DeviceArray grown(cap * row);
      check(cudaMemcpyAsync(grown.as<void>(), sm.arrays[i].as<void>(), sm.uploaded * row, cudaMemcpyDeviceToDevice,
                            stream_),
            "grow");
      sm.arrays[i] = std::move(grown);
    }
    sm.capacity = cap;
    sm.desc.k = sm.arrays[0].as<float>();
    sm.desc.v = sm.arrays[1].as<float>();
  }

  // Appends a dense segment's new host tokens to its device copy.
  void extend_dense(SegmentMirror& sm) {
    const auto& ds = static_cast<const DenseSegment&>(*sm.seg);
    const size_t n = ds.size(), row = size_t(ds.head_dim()) * sizeof(float);
    grow_dense(sm, n);
    upload_dense_rows(ds, sm.uploaded, n - sm.uploaded, sm.arrays[0].as<char>() + sm.uploaded * row,
                      sm.arrays[1].as<char>() + sm.uploaded * row);
    sm.uploaded = n;
  }

  CacheMirror& sync(const LayerCache& cache) {
    CacheMirror& m = mirrors_[&cache];
    if (m.pending && m.epoch == cache.epoch()) return m;
    const int hc = cache.n_cache_heads();
    bool rebuild = m.epoch != cache.epoch() || int(m.heads.size()) != hc;
    for (int h = 0; h < hc && !rebuild; ++h) {
      const auto& segs = cache.segments(h);
      auto& mh = m.heads[h];
      if (segs.size() < mh.size()) rebuild = true;
      for (size_t i = 0; i < mh.size() && !rebuild; ++i)
        if (mh[i].seg != segs[i].get() || segs[i]->size() < mh[i].uploaded ||
            (segs[i]->size() != mh[i].uploaded && mh[i].desc.kind != cuda::kDense))
          rebuild = true;
    }
    if (rebuild) {
      m.heads.clear();
      m.heads.resize(hc);
      m.shared.clear();
      m.epoch = cache.epoch();
    }
    for (int h = 0; h < hc; ++h) {
      const auto& segs = cache.segments(h);
      auto& mh = m.heads[h];
      for (size_t i = 0; i < segs.size(); ++i) {
        if (i == mh.size()) {
          mh.push_back(mirror_of(m, *segs[i]));
        } else if (segs[i]->size() != mh[i].uploaded) {
          extend_dense(mh[i]);
        }
      }
    }
    return m;
  }

  cuda::DecodeLayout layout(const LayerCache& cache, CacheMirror& m) {
    const int hc = cache.n_cache_heads(), d = cache.head_dim(), group = cache.n_query_heads() / hc;
    std::vector<cuda::DecodeSegment> segs;
    std::vector<int32_t> head_tokens(hc), head_parts(hc + 1, 0);
    int max_chunks = 0, parts = 0, stride = 0;
    for (int h = 0; h < hc; ++h) {
      int offset = 0;
      head_parts[h] = parts;
      for (auto& sm : m.heads[h]) {
        cuda::DecodeSegment s = sm.desc;
        s.cache_head = h;
        s.n = static_cast<int32_t>(sm.uploaded);
        s.offset = offset;
        s.part = parts;
        const int chunks = (s.n + cuda::kDecodeChunk - 1) / cuda::kDecodeChunk;
        offset += s.n;
        parts += chunks;
        max_chunks = std::max(max_chunks, chunks);
        if (s.n) segs.push_back(s);
      }
      head_tokens[h] = offset;
      stride = std::max(stride, offset);
    }
    head_parts[hc] = parts;
    // One upload for all the layer's metadata.
    const size_t seg_bytes = segs.size() * sizeof(cuda::DecodeSegment);
    const size_t meta_bytes = seg_bytes + (head_tokens.size() + head_parts.size()) * sizeof(int32_t);
    auto* meta = static_cast<unsigned char*>(m.meta_host.prepare(meta_bytes));
    std::memcpy(meta, segs.data(), seg_bytes);
    std::memcpy(meta + seg_bytes, head_tokens.data(), head_tokens.size() * sizeof(int32_t));
    std::memcpy(meta + seg_bytes + head_tokens.size() * sizeof(int32_t), head_parts.data(),
                head_parts.size() * sizeof(int32_t));
    m.meta.ensure(meta_bytes);
    check(cudaMemcpyAsync(m.meta.as<void>(), meta, meta_bytes, cudaMemcpyHostToDevice, stream_), "meta");
    m.meta_host.mark(stream_);
    m.scores.ensure(size_t(cache.n_query_heads()) * std::max(stride, 1) * sizeof(float));
    m.partials.ensure(size_t(std::max(parts, 1)) * group * d * sizeof(float));

    cuda::DecodeLayout L;
    L.hq = cache.n_query_heads();
    L.n_cache_heads = hc;
    L.d = d;
    L.n_segments = static_cast<int>(segs.size());
    L.max_chunks = max_chunks;
    L.n_parts = parts;
    L.score_stride = std::max(stride, 1);
    L.segments = m.meta.as<cuda::DecodeSegment>();
    L.head_tokens = reinterpret_cast<const int32_t*>(m.meta.as<unsigned char>() + seg_bytes);
    L.head_part_begin = L.head_tokens + hc;
    L.inv_freq = inv_freq_.as<float>();
    L.interleaved = interleaved_;
    L.scores = m.scores.as<float>();
    L.partials = m.partials.as<float>();
    return L;
  }

  std::string name_;
  cudaStream_t stream_ = nullptr;
  cublasHandle_t blas_ = nullptr;
  std::vector<float> inv_freq_host_;
  DeviceArray inv_freq_, ints_, xb_, lse_, colsum_, qkv_bf16_;
  std::array<PinnedArray, 8> int_stage_;
  size_t next_int_stage_ = 0;
  bool interleaved_ = false;
  std::unordered_map<const LayerCache*, CacheMirror> mirrors_;
  std::unordered_map<const void*, size_t> weight_sizes_;
  std::vector<PinnedArray> stages_;
};

}  // namespace

std::unique_ptr<Backend> make_cuda_backend() { return std::make_unique<CudaBackend>(); }

bool cuda_available() {
  int count = 0;
  return cudaGetDeviceCount(&count) == cudaSuccess && count > 0;
}

}  // namespace kvb
