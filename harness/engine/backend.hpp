#pragma once
// The operations the transformer needs, on memory owned by a backend (host memory for the CPU
// backend, device memory for CUDA). The engine's layer logic is written once against this interface.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

namespace kvb {

class Backend;
class LayerCache;

// A float array in backend memory.
class Buffer {
 public:
  Buffer() = default;
  Buffer(Backend& b, size_t n);
  ~Buffer();
  Buffer(Buffer&& o) noexcept;
  Buffer& operator=(Buffer&& o) noexcept;
  Buffer(const Buffer&) = delete;
  Buffer& operator=(const Buffer&) = delete;

  float* data() { return ptr_; }
  const float* data() const { return ptr_; }
  size_t size() const { return n_; }
  bool empty() const { return n_ == 0; }

 private:
  Backend* backend_ = nullptr;
  float* ptr_ = nullptr;
  size_t n_ = 0;
};

// Time and arithmetic spent per kind of operation, for the benchmark's efficiency figures.
struct OpStats {
  double linear_seconds = 0, linear_flops = 0;        // weight GEMMs / GEMVs
  double attention_seconds = 0, attention_flops = 0;  // QK^T and PV products with their softmax
  double other_seconds = 0;                           // norms, RoPE, SwiGLU, adds, copies
};

class Backend {
 public:
  virtual ~Backend() = default;
  virtual std::string name() const = 0;

  // Profiling adds a clock read around each operation (and, on a GPU, a synchronisation).
  void set_profiling(bool on) { profiling_ = on; }
  const OpStats& stats() const { return stats_; }
  void reset_stats() { stats_ = {}; }

  virtual float* allocate(size_t n) = 0;
  virtual void release(float* p, size_t n) = 0;
  virtual void upload(Buffer& dst, std::span<const float> src, size_t offset = 0) = 0;
  virtual void download(const Buffer& src, std::span<float> dst, size_t offset = 0) = 0;

  // Frequencies for rope(); set once per model.
  virtual void set_rope(std::vector<float> inv_freq, bool interleaved) = 0;

  // out[n, dim] = rows ids[n] of table[vocab, dim].
  virtual void embed(const Buffer& table, std::span<const int32_t> ids, int dim, Buffer& out) = 0;
  virtual void rmsnorm(const Buffer& x, const Buffer& w, int n, int dim, float eps, Buffer& y,
                       size_t x_offset = 0) = 0;
  // y[n, out] = x[n, in] W[out, in]^T (+ bias).
  virtual void linear(const Buffer& x, const Buffer& w, const Buffer* bias, int n, int in, int out,
                      Buffer& y) = 0;
  virtual void rope(Buffer& x, int n, int heads, int d, std::span<const int32_t> pos) = 0;
  virtual void swiglu(const Buffer& gate, const Buffer& up, size_t n, Buffer& out) = 0;
  virtual void add(Buffer& x, const Buffer& y, size_t n, size_t x_offset = 0) = 0;
  // Causal attention of a whole prompt starting at position 0: q[n, hq, d], k/v[n, hkv, d] ->
  // out[n, hq, d]. Memory beyond the inputs is O(chunk x n). If colsum is given it receives, per
  // query head, the attention probability each key got summed over all queries ([hq, n]).
  virtual void attention_prefill(const Buffer& q, const Buffer& k, const Buffer& v, int n, int hq,
                                 int hkv, int d, Buffer& out, std::vector<float>* colsum) = 0;
  // One query token q[hq, d] over a KV cache -> out[hq, d].
  virtual void attention_decode(const LayerCache& cache, const Buffer& q, Buffer& out) = 0;

 protected:
  bool profiling_ = false;
  OpStats stats_;
};

std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// "cpu" or "cuda"; Error naming what is available otherwise.
std::unique_ptr<Backend> make_backend(const std::string& name, int threads = 0);

}  // namespace kvb
