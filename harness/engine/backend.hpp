#pragma once
// The operations the transformer needs, on memory owned by a backend (host memory for the CPU
// backend, device memory for CUDA). The engine's layer logic is written once against this interface.
#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "kernels/dtype.hpp"

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

// How weight matrices are stored. fp32: as loaded (dequantized), the mode that matches Hugging Face
// and the CPU default. bf16: rounded once to nearest even, half the bytes a decode step reads (fp32
// activations and accumulation still); the CUDA backend's only format. gguf (CPU): the file's own
// quantized blocks (Q4_0 to Q8_0 rearranged in tiles of 16 rows, the same bytes), multiplied as ggml
// does (kernels/cpu/linear_quant.hpp); matrices of other types are stored as bf16.
enum class WeightFormat { F32, BF16, GGUF };
// "fp32", "bf16" or "gguf"; an Error naming `what` (the option or field) otherwise.
WeightFormat parse_weight_format(const std::string& s, const std::string& what);
const char* weight_format_name(WeightFormat f);

// A weight matrix [rows, cols] in the backend's weight format. Only linear() and embed() read it.
class Weight {
 public:
  Weight() = default;
  Weight(Backend& b, std::span<const float> w, int rows, int cols);
  // The tensor's own quantized blocks (Backend::stores_blocks(type) must hold).
  Weight(Backend& b, DType type, std::span<const uint8_t> blocks, int rows, int cols);
  ~Weight();
  Weight(Weight&& o) noexcept;
  Weight& operator=(Weight&& o) noexcept;
  Weight(const Weight&) = delete;
  Weight& operator=(const Weight&) = delete;

  const void* data() const { return ptr_; }
  int rows() const { return rows_; }
  int cols() const { return cols_; }
  size_t bytes() const { return bytes_; }
  // The block type of a weight kept in its file's quantized blocks; F32 for one in the backend's
  // weight format.
  DType blocks() const { return blocks_; }

 private:
  Backend* backend_ = nullptr;
  void* ptr_ = nullptr;
  int rows_ = 0, cols_ = 0;
  size_t bytes_ = 0;
  DType blocks_ = DType::F32;
};

// What the hardware under a backend delivers, measured in the same run as a benchmark.
struct DeviceLimits {
  std::string gemm_kind;     // what the GEMM rate was measured with
  double gemm_gflops = 0;    // best GEMM rate in the precision the weights use
  double bandwidth_gbs = 0;  // memory bandwidth counting bytes read
};

// Time and arithmetic spent per kind of operation, for the benchmark's efficiency figures.
struct OpStats {
  double linear_seconds = 0, linear_flops = 0;        // weight GEMMs / GEMVs
  double attention_seconds = 0, attention_flops = 0;  // QK^T and PV products with their softmax
  double other_seconds = 0;                           // norms, RoPE, SwiGLU/GELU, adds, copies
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
  // The format of the weights stored from now on (set before loading a model); an Error if this
  // backend cannot store that format.
  virtual void set_weight_format(WeightFormat f) = 0;
  virtual WeightFormat weight_format() const = 0;
  // Stores a weight matrix; returns its handle and the bytes it occupies.
  virtual void* upload_weight(std::span<const float> w, int rows, int cols, size_t& bytes) = 0;
  virtual void release_weight(void* p) = 0;
  // Whether a matrix of this quantized type is kept in its blocks under the current weight format.
  virtual bool stores_blocks(DType /*type*/) const { return false; }
  virtual void* upload_weight_blocks(DType type, std::span<const uint8_t> blocks, int rows, int cols, size_t& bytes);
  virtual void upload(Buffer& dst, std::span<const float> src, size_t offset = 0) = 0;
  virtual void download(const Buffer& src, std::span<float> dst, size_t offset = 0) = 0;

  // Frequencies for rope(); set once per model.
  virtual void set_rope(std::vector<float> inv_freq, bool interleaved) = 0;

  // out[n, dim] = rows ids[n] of table[vocab, dim].
  virtual void embed(const Weight& table, std::span<const int32_t> ids, int dim, Buffer& out) = 0;
  virtual void rmsnorm(const Buffer& x, const Buffer& w, int n, int dim, float eps, Buffer& y, size_t x_offset = 0) = 0;
  // LayerNorm with bias (Falcon), rows of x from x_offset.
  virtual void layernorm(const Buffer& x, const Buffer& w, const Buffer& b, int n, int dim, float eps, Buffer& y,
                         size_t x_offset = 0) = 0;
  // y[n, out] = x[n, in] W[out, in]^T (+ bias).
  virtual void linear(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y) = 0;
  // The same for n tokens of n different sequences decoded together: row b of y is exactly what
  // linear gives token b alone (n == 1), bit for bit, while the weights are read once for all n where
  // decodes_batches() holds. Elsewhere only n == 1 is accepted.
  virtual void linear_tokens(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y);
  // One product of linear_tokens_shared: y[n, out] = x W^T (+ bias).
  struct Product {
    const Weight* w;
    const Buffer* bias;
    int out;
    Buffer* y;
  };
  // linear_tokens for several matrices against the same x (a layer's q, k and v; its gate and up), each y
  // exactly as linear_tokens gives it; a backend may share the work on x among them.
  virtual void linear_tokens_shared(const Buffer& x, std::span<const Product> ps, int n, int in);
  virtual bool decodes_batches() const { return false; }
  virtual void rope(Buffer& x, int n, int heads, int d, std::span<const int32_t> pos) = 0;
  virtual void swiglu(const Buffer& gate, const Buffer& up, size_t n, Buffer& out) = 0;
  // out = x Phi(x) (erf GELU), elementwise.
  virtual void gelu(const Buffer& x, size_t n, Buffer& out) = 0;
  virtual void add(Buffer& x, const Buffer& y, size_t n, size_t x_offset = 0) = 0;
  // Causal attention of a whole prompt starting at position 0: q[n, hq, d], k/v[n, hkv, d] ->
  // out[n, hq, d]. Memory beyond the inputs is O(chunk x n). If colsum is given it receives, per
  // query head, the attention probability each key got summed over all queries ([hq, n]).
  virtual void attention_prefill(const Buffer& q, const Buffer& k, const Buffer& v, int n, int hq, int hkv, int d,
                                 Buffer& out, std::vector<float>* colsum) = 0;
  // A prefill continued after the positions whose post-RoPE keys and values `past` holds (host memory,
  // rows [past.n, hkv, d]): q[n, hq, d] at positions past.n.., k/v[n, hkv, d] of those positions, each
  // query seeing every past key and the new ones up to its own. colsum ([hq, past.n + n]) sums these
  // n queries only. A row's output is what the whole prompt's attention_prefill gives it (bit for bit on
  // the CPU's AVX2 kernels, to rounding through BLAS). An Error on a backend whose continues_prefill() is
  // false.
  struct PastKV {
    const float* k = nullptr;
    const float* v = nullptr;
    int n = 0;
  };
  virtual bool continues_prefill() const { return false; }
  virtual void attention_prefill_continued(const Buffer& q, const Buffer& k, const Buffer& v, const PastKV& past, int n,
                                           int hq, int hkv, int d, Buffer& out, std::vector<float>* colsum);
  // One query token, row `row` of q[*, hq, d], over a KV cache -> the same row of out[*, hq, d].
  virtual void attention_decode(const LayerCache& cache, const Buffer& q, Buffer& out, size_t row = 0) = 0;
  // A batch of sequences, row b of q and out for caches[b]; by default attention_decode row by row.
  virtual void attention_decode_batch(std::span<const LayerCache* const> caches, const Buffer& q, Buffer& out);
  // A new sequence begins: device copies of earlier caches may be dropped.
  virtual void forget_caches() {}
  // Decoding fast path: appends one token's k/v ([n_kv_heads, d], post-RoPE, still in backend memory)
  // to the backend's copy of `cache` without a round trip through the host. The caller must append
  // the same token to the host cache before the next step. False if the backend keeps no copy or
  // the copy cannot take the token as is (then the caller appends on the host first).
  virtual bool append_on_device(const LayerCache& /*cache*/, const Buffer& /*k*/, const Buffer& /*v*/,
                                int /*n_kv_heads*/) {
    return false;
  }

  // Host memory that downloads fill without waiting for them (page-locked on a GPU), in numbered
  // slots so that the host can work on one while the device fills another.
  virtual float* stage(int slot, size_t n) = 0;
  // Queues a copy of src[offset, offset + dst.size()) into staged memory.
  virtual void download_async(const Buffer& src, std::span<float> dst, size_t offset = 0) = 0;
  // Marks the copies queued so far as the slot's; wait() returns once they have landed.
  virtual void fence(int /*slot*/) {}
  virtual void wait(int /*slot*/) {}
  // Waits for queued work (a no-op where operations are synchronous); timings need it.
  virtual void synchronize() {}
  // Measures the GEMM rate and memory bandwidth of the hardware this backend runs on.
  virtual DeviceLimits measure_limits() = 0;
  // The rate at which a working set of `bytes` is read again and again, GB/s: above the memory's where it
  // stays in a cache, as a small model's weights do in a server CPU's L3. 0 where not measured (a GPU, whose
  // L2 holds a small part of any step).
  virtual double measure_working_set_bandwidth(size_t /*bytes*/) { return 0; }
  // Peak memory held since the last reset: process RSS on the CPU, device allocations on a GPU.
  virtual size_t peak_memory_bytes() const = 0;
  virtual void reset_peak_memory() = 0;

 protected:
  bool profiling_ = false;
  OpStats stats_;
};

std::unique_ptr<Backend> make_cpu_backend(int threads = 0);
// Threads of OpenMP and OpenBLAS for the CPU kernels (0: leave them as they are, all cores).
void set_cpu_threads(int threads);
// Throws an Error when kvbench was built without CUDA or no GPU is visible.
std::unique_ptr<Backend> make_cuda_backend();
bool cuda_available();
// "cpu" or "cuda"; Error naming what is available otherwise.
std::unique_ptr<Backend> make_backend(const std::string& name, int threads = 0);

}  // namespace kvb
