// CPU backend: OpenBLAS for matrix products (linear layers and the tiles of attention), OpenMP for
// the rest; fp32 throughout, except weights stored as bf16 when asked (WeightFormat).
#include <cblas.h>
#include <fmt/format.h>
#include <omp.h>

#include <algorithm>
#include <cmath>
#include <cstdlib>
#include <cstring>
#include <limits>

#include "harness/cache/layer_cache.hpp"
#include "harness/engine/backend.hpp"
#include "harness/engine/op_timer.hpp"
#include "harness/util/error.hpp"
#include "harness/util/machine.hpp"
#include "kernels/cpu/attention.hpp"
#include "kernels/cpu/dequant.hpp"
#include "kernels/cpu/fp16.hpp"
#include "kernels/cpu/linear_bf16.hpp"
#include "kernels/cpu/linear_quant.hpp"
#include "kernels/cpu/ops.hpp"
#include "kernels/cpu/read_bandwidth.hpp"

namespace kvb {

namespace {

class CpuBackend final : public Backend {
 public:
  explicit CpuBackend(int threads) { set_cpu_threads(threads); }

  std::string name() const override { return "cpu"; }

  float* allocate(size_t n) override {
    // 64-byte alignment for vector loads; the size is rounded up as aligned_alloc requires.
    const size_t bytes = (n * sizeof(float) + 63) / 64 * 64;
    auto* p = static_cast<float*>(std::aligned_alloc(64, bytes));
    if (!p) fail("out of memory allocating {} MiB", bytes >> 20);
    return p;
  }
  void release(float* p, size_t) override { std::free(p); }

  void set_weight_format(WeightFormat f) override { format_ = f; }
  WeightFormat weight_format() const override { return format_; }

  bool stores_blocks(DType type) const override { return format_ == WeightFormat::GGUF && linear_quant_supports(type); }
  void* upload_weight_blocks(DType type, std::span<const uint8_t> blocks, int rows, int cols, size_t& bytes) override {
    bytes = stored_bytes(type, rows, cols);
    auto* p = static_cast<uint8_t*>(std::aligned_alloc(64, (bytes + 63) / 64 * 64));
    if (!p) fail("out of memory allocating {} MiB", bytes >> 20);
    store_rows(type, blocks.data(), rows, cols, p);
    return p;
  }

  void* upload_weight(std::span<const float> w, int, int, size_t& bytes) override {
    // Under gguf, matrices of types without block kernels are bf16.
    if (format_ != WeightFormat::F32) {
      bytes = (w.size() * sizeof(uint16_t) + 63) / 64 * 64;
      auto* p = static_cast<uint16_t*>(std::aligned_alloc(64, bytes));
      if (!p) fail("out of memory allocating {} MiB", bytes >> 20);
#pragma omp parallel for schedule(static) if (w.size() > (1u << 20))
      for (size_t i = 0; i < w.size(); ++i) p[i] = float_to_bf16(w[i]);
      bytes = w.size() * sizeof(uint16_t);
      return p;
    }
    float* p = allocate(w.size());
    std::memcpy(p, w.data(), w.size_bytes());
    bytes = w.size_bytes();
    return p;
  }
  void release_weight(void* p) override { std::free(p); }

  DeviceLimits measure_limits() override {
    // OpenBLAS's kernels for this processor, or those OPENBLAS_CORETYPE names: its peak is theirs
    return {fmt::format("OpenBLAS sgemm (fp32, {} kernels)", openblas_get_corename()), measure_sgemm_gflops(),
            measure_read_bandwidth_gbs()};
  }

  double measure_working_set_bandwidth(size_t bytes) override {
    // No cache holds a GiB: a larger working set is read at the memory's rate, measured at a GiB
    return measure_read_bandwidth_gbs(std::min(bytes, size_t{1} << 30));
  }

  size_t peak_memory_bytes() const override { return peak_rss_bytes(); }
  void reset_peak_memory() override { reset_peak_rss(); }

  void upload(Buffer& dst, std::span<const float> src, size_t offset) override {
    std::memcpy(dst.data() + offset, src.data(), src.size_bytes());
  }
  void download(const Buffer& src, std::span<float> dst, size_t offset) override {
    std::memcpy(dst.data(), src.data() + offset, dst.size_bytes());
  }

  float* stage(int slot, size_t n) override {
    if (slot >= static_cast<int>(stages_.size())) stages_.resize(slot + 1);
    if (stages_[slot].size() < n) stages_[slot].resize(n);
    return stages_[slot].data();
  }
  void download_async(const Buffer& src, std::span<float> dst, size_t offset) override { download(src, dst, offset); }

  void set_rope(std::vector<float> inv_freq, bool interleaved) override {
    rope_ = std::make_unique<RopeTable>(std::move(inv_freq), interleaved ? RopeStyle::Interleaved : RopeStyle::NeoX);
  }

  void embed(const Weight& table, std::span<const int32_t> ids, int dim, Buffer& out) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    for (size_t i = 0; i < ids.size(); ++i) {
      const size_t row = size_t(ids[i]) * dim;
      float* y = out.data() + i * dim;
      if (table.blocks() != DType::F32) {
        const auto& info = dtype_info(table.blocks());
        blocks_.resize(size_t(dim) / info.block_elems * info.block_bytes);
        load_rows(table.blocks(), static_cast<const uint8_t*>(table.data()), ids[i], 1, dim, blocks_.data());
        dequantize(table.blocks(), blocks_.data(), y, size_t(dim));
      } else if (format_ != WeightFormat::F32) {
        const auto* w = static_cast<const uint16_t*>(table.data()) + row;
        for (int c = 0; c < dim; ++c) y[c] = bf16_to_float(w[c]);
      } else {
        std::memcpy(y, static_cast<const float*>(table.data()) + row, dim * sizeof(float));
      }
    }
  }

  void rmsnorm(const Buffer& x, const Buffer& w, int n, int dim, float eps, Buffer& y, size_t x_offset) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    kvb::rmsnorm(x.data() + x_offset, w.data(), n, dim, eps, y.data());
  }

  void layernorm(const Buffer& x, const Buffer& w, const Buffer& b, int n, int dim, float eps, Buffer& y,
                 size_t x_offset) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    kvb::layernorm(x.data() + x_offset, w.data(), b.data(), n, dim, eps, y.data());
  }

  void linear(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y) override {
    multiply(x, w, bias, n, in, out, y, false);
  }

  void linear_tokens(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y) override {
    multiply(x, w, bias, n, in, out, y, true);
  }
  void linear_tokens_shared(const Buffer& x, std::span<const Product> ps, int n, int in) override {
    // The products on gguf blocks quantize x once and share one pass over the threads.
    if (!std::all_of(ps.begin(), ps.end(), [](const Product& p) { return p.w->blocks() != DType::F32; }))
      return Backend::linear_tokens_shared(x, ps, n, in);
    OpTimer t(*this, profiling_, stats_.linear_seconds);
    std::vector<QuantProduct>& qs = products_;
    qs.clear();
    for (const Product& p : ps) {
      stats_.linear_flops += 2.0 * n * in * p.out;
      qs.push_back({p.w->blocks(), static_cast<const uint8_t*>(p.w->data()), p.bias ? p.bias->data() : nullptr, p.out,
                    p.y->data()});
    }
    kvb::linear_quant_tokens_shared(qs, x.data(), n, in);
  }
  bool decodes_batches() const override { return true; }

  void rope(Buffer& x, int n, int heads, int d, std::span<const int32_t> pos) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    rope_->ensure(*std::max_element(pos.begin(), pos.end()));
    rope_->apply(x.data(), n, heads, d, pos.data());
  }

  void swiglu(const Buffer& gate, const Buffer& up, size_t n, Buffer& out) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    kvb::swiglu(gate.data(), up.data(), n, out.data());
  }

  void gelu(const Buffer& x, size_t n, Buffer& out) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    kvb::gelu(x.data(), n, out.data());
  }

  void add(Buffer& x, const Buffer& y, size_t n, size_t x_offset) override {
    OpTimer t(*this, profiling_, stats_.other_seconds);
    float* a = x.data() + x_offset;
    const float* b = y.data();
#pragma omp parallel for schedule(static) if (n > 65536)
    for (size_t i = 0; i < n; ++i) a[i] += b[i];
  }

  void attention_prefill(const Buffer& qb, const Buffer& kb, const Buffer& vb, int n, int hq, int hkv, int d,
                         Buffer& outb, std::vector<float>* colsum) override {
    OpTimer t(*this, profiling_, stats_.attention_seconds);
    // Useful work of causal attention: n(n+1)/2 query-key pairs, 2d flops each for QK^T and for PV.
    stats_.attention_flops += 4.0 * d * hq * (static_cast<double>(n) * (n + 1) / 2);
    if (colsum) colsum->resize(size_t(hq) * n);
    attention_prefill_fused(qb.data(), kb.data(), vb.data(), n, hq, hkv, d, outb.data(),
                            colsum ? colsum->data() : nullptr);
  }

  bool continues_prefill() const override { return true; }
  void attention_prefill_continued(const Buffer& qb, const Buffer& kb, const Buffer& vb, const PastKV& past, int n,
                                   int hq, int hkv, int d, Buffer& outb, std::vector<float>* colsum) override {
    OpTimer t(*this, profiling_, stats_.attention_seconds);
    stats_.attention_flops += 4.0 * d * hq * (static_cast<double>(n) * past.n + static_cast<double>(n) * (n + 1) / 2);
    // The kernel reads one key array: the past rows, then the new ones.
    const size_t old = size_t(past.n) * hkv * d, fresh = size_t(n) * hkv * d;
    joined_k_.resize(old + fresh);
    joined_v_.resize(old + fresh);
    std::copy(past.k, past.k + old, joined_k_.begin());
    std::copy(kb.data(), kb.data() + fresh, joined_k_.begin() + old);
    std::copy(past.v, past.v + old, joined_v_.begin());
    std::copy(vb.data(), vb.data() + fresh, joined_v_.begin() + old);
    if (colsum) colsum->resize(size_t(hq) * (past.n + n));
    attention_prefill_fused(qb.data(), joined_k_.data(), joined_v_.data(), n, hq, hkv, d, outb.data(),
                            colsum ? colsum->data() : nullptr, past.n);
  }

  void attention_decode(const LayerCache& cache, const Buffer& q, Buffer& out, size_t row) override {
    const LayerCache* one = &cache;
    const size_t at = row * size_t(cache.n_query_heads()) * size_t(cache.head_dim());
    attend_rows({&one, 1}, q.data() + at, out.data() + at);
  }
  void attention_decode_batch(std::span<const LayerCache* const> caches, const Buffer& q, Buffer& out) override {
    attend_rows(caches, q.data(), out.data());
  }

 private:
  void attend_rows(std::span<const LayerCache* const> caches, const float* q, float* out) {
    OpTimer t(*this, profiling_, stats_.attention_seconds);
    for (const LayerCache* c : caches)
      stats_.attention_flops += 4.0 * c->head_dim() * c->n_query_heads() * static_cast<double>(c->tokens(0));
    attend_batch(caches, q, out);
  }
  // Prefill's products (GEMM for n tokens of one sequence) or `apart` n tokens of n sequences.
  void multiply(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y, bool apart) {
    OpTimer t(*this, profiling_, stats_.linear_seconds);
    stats_.linear_flops += 2.0 * n * in * out;
    const float* b = bias ? bias->data() : nullptr;
    if (w.blocks() != DType::F32) {
      const auto* blocks = static_cast<const uint8_t*>(w.data());
      if (apart)
        kvb::linear_quant_tokens(w.blocks(), blocks, b, x.data(), n, in, out, y.data());
      else
        kvb::linear_quant(w.blocks(), blocks, b, x.data(), n, in, out, y.data());
    } else if (format_ != WeightFormat::F32) {
      const auto* bf = static_cast<const uint16_t*>(w.data());
      if (apart)
        kvb::linear_bf16_tokens(x.data(), bf, b, n, in, out, y.data());
      else
        kvb::linear_bf16(x.data(), bf, b, n, in, out, y.data());
    } else if (apart) {
      kvb::linear_tokens(x.data(), static_cast<const float*>(w.data()), b, n, in, out, y.data());
    } else {
      kvb::linear(x.data(), static_cast<const float*>(w.data()), b, n, in, out, y.data());
    }
  }

  WeightFormat format_ = WeightFormat::F32;
  std::unique_ptr<RopeTable> rope_;
  std::vector<std::vector<float>> stages_;
  std::vector<float> joined_k_, joined_v_;
  std::vector<uint8_t> blocks_;         // an embedding row as the file's blocks
  std::vector<QuantProduct> products_;  // linear_tokens_shared's, kept (a decode step makes some ninety calls)
};

}  // namespace

void set_cpu_threads(int threads) {
  if (threads <= 0) return;
  omp_set_num_threads(threads);
  openblas_set_num_threads(threads);
}

std::unique_ptr<Backend> make_cpu_backend(int threads) { return std::make_unique<CpuBackend>(threads); }

}  // namespace kvb
