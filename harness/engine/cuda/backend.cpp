// CUDA backend: weights in bf16 on the device, GEMMs through cuBLAS (bf16 inputs, fp32 accumulation and
// output), decode matrix-vector products and every other operation in our kernels (kernels/cuda).
// Activations stay fp32. Device memory is in device_memory.*, the device copies of the caches the
// backend attends over in device_caches.*.
#include <cublas_v2.h>
#include <cuda_runtime.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <array>
#include <cstring>
#include <span>
#include <unordered_map>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/cuda/device_caches.hpp"
#include "harness/engine/cuda/device_memory.hpp"
#include "harness/engine/op_timer.hpp"
#include "harness/util/error.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace kvb {
namespace {

using cuda::check;
using cuda::check_blas;
using cuda::DeviceArray;
using cuda::memory;
using cuda::PinnedArray;
using cuda::to_device;

// The first GPU, and a stream on it for all the backend's work.
cudaStream_t open_device() {
  int count = 0;
  if (cudaGetDeviceCount(&count) != cudaSuccess || count == 0)
    fail("backend 'cuda': no CUDA GPU is visible (cudaGetDeviceCount found none); use --backend cpu");
  check(cudaSetDevice(0), "cudaSetDevice");
  cudaStream_t s = nullptr;
  check(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "cudaStreamCreate");
  return s;
}

class CudaBackend final : public Backend {
 public:
  CudaBackend() {
    check_blas(cublasCreate(&blas_), "cublasCreate");
    check_blas(cublasSetStream(blas_, stream_), "cublasSetStream");
    cudaDeviceProp prop{};
    check(cudaGetDeviceProperties(&prop, 0), "cudaGetDeviceProperties");
    name_ = fmt::format("cuda ({})", prop.name);
  }
  ~CudaBackend() override {
    caches_.clear();
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
  void forget_caches() override { caches_.clear(); }

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
    return caches_.append(cache, k.data(), v.data(), n_kv_heads);
  }
  void synchronize() override { check(cudaStreamSynchronize(stream_), "cudaStreamSynchronize"); }

  void set_rope(std::vector<float> inv_freq, bool interleaved) override {
    inv_freq_ = to_device(inv_freq, stream_);
    interleaved_ = interleaved;
    caches_.set_rope(std::move(inv_freq), inv_freq_.as<float>(), interleaved);
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

  void layernorm(const Buffer& x, const Buffer& w, const Buffer& b, int n, int dim, float eps, Buffer& y,
                 size_t x_offset) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    cuda::layernorm(x.data() + x_offset, w.data(), b.data(), n, dim, eps, y.data(), stream_);
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

  void gelu(const Buffer& x, size_t n, Buffer& out) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    cuda::gelu(x.data(), n, out.data(), stream_);
  }

  void add(Buffer& x, const Buffer& y, size_t n, size_t x_offset) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    cuda::add(x.data() + x_offset, y.data(), n, stream_);
  }

  void attention_prefill(const Buffer& q, const Buffer& k, const Buffer& v, int n, int hq, int hkv, int d, Buffer& out,
                         std::vector<float>* colsum) override {
    OpTimer t(*this, profiling_, stats_.attention_seconds);
    stats_.attention_flops += 4.0 * d * hq * (static_cast<double>(n) * (n + 1) / 2);
    prefill_attention(q, k.data(), v.data(), n, 0, hq, hkv, d, out, colsum);
  }

  bool continues_prefill() const override { return true; }
  void attention_prefill_continued(const Buffer& q, const Buffer& k, const Buffer& v, const PastKV& past, int n, int hq,
                                   int hkv, int d, Buffer& out, std::vector<float>* colsum) override {
    OpTimer t(*this, profiling_, stats_.attention_seconds);
    stats_.attention_flops += 4.0 * d * hq * (static_cast<double>(n) * past.n + static_cast<double>(n) * (n + 1) / 2);
    // The kernel reads one key array: the past rows (host memory, the engine's page-locked staging),
    // then the new ones.
    const size_t old = size_t(past.n) * hkv * d * sizeof(float), fresh = size_t(n) * hkv * d * sizeof(float);
    joined_k_.ensure(old + fresh);
    joined_v_.ensure(old + fresh);
    auto* jk = joined_k_.as<unsigned char>();
    auto* jv = joined_v_.as<unsigned char>();
    check(cudaMemcpyAsync(jk, past.k, old, cudaMemcpyHostToDevice, stream_), "past keys upload");
    check(cudaMemcpyAsync(jv, past.v, old, cudaMemcpyHostToDevice, stream_), "past values upload");
    check(cudaMemcpyAsync(jk + old, k.data(), fresh, cudaMemcpyDeviceToDevice, stream_), "key join");
    check(cudaMemcpyAsync(jv + old, v.data(), fresh, cudaMemcpyDeviceToDevice, stream_), "value join");
    prefill_attention(q, joined_k_.as<float>(), joined_v_.as<float>(), n, past.n, hq, hkv, d, out, colsum);
  }

  void attention_decode(const LayerCache& cache, const Buffer& q, Buffer& out, size_t row) override {
    OpTimer t(*this, profiling_, stats_.attention_seconds);
    stats_.attention_flops += 4.0 * cache.head_dim() * cache.n_query_heads() * static_cast<double>(cache.tokens(0));
    const size_t at = row * size_t(cache.n_query_heads()) * size_t(cache.head_dim());
    cuda::attention_decode(caches_.layout(cache), q.data() + at, out.data() + at, stream_);
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

  // n queries after `past` positions over keys k/v[past + n] (device), and the keys' column sums
  // ([hq, past + n], these queries only) when asked.
  void prefill_attention(const Buffer& q, const float* k, const float* v, int n, int past, int hq, int hkv, int d,
                         Buffer& out, std::vector<float>* colsum) {
    if (!cuda::attention_prefill_supports(d)) fail("CUDA prefill attention supports head dims 64 and 128, not {}", d);
    lse_.ensure(size_t(hq) * n * sizeof(float));
    qkv_bf16_.ensure(cuda::attention_prefill_scratch_bytes(n, past, hq, hkv, d));
    cuda::attention_prefill(q.data(), k, v, n, past, hq, hkv, d, out.data(), lse_.as<float>(), qkv_bf16_.as<uint16_t>(),
                            stream_);
    if (!colsum) return;
    const size_t keys = size_t(past) + n;
    colsum_.ensure(size_t(hq) * keys * sizeof(float));
    cuda::attention_colsum(q.data(), k, lse_.as<float>(), n, past, hq, hkv, d, colsum_.as<float>(), stream_);
    colsum->resize(size_t(hq) * keys);
    check(cudaMemcpyAsync(colsum->data(), colsum_.as<float>(), colsum->size() * sizeof(float), cudaMemcpyDeviceToHost,
                          stream_),
          "colsum download");
    synchronize();
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

  cudaStream_t stream_ = open_device();
  std::string name_;
  cublasHandle_t blas_ = nullptr;
  DeviceArray inv_freq_, ints_, xb_, lse_, colsum_, qkv_bf16_, joined_k_, joined_v_;
  std::array<PinnedArray, 8> int_stage_;
  size_t next_int_stage_ = 0;
  bool interleaved_ = false;
  cuda::DeviceCaches caches_{stream_};
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
