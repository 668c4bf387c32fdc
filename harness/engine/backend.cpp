#include "harness/engine/backend.hpp"

#include <utility>

#include "harness/util/error.hpp"

namespace kvb {

Buffer::Buffer(Backend& b, size_t n) : backend_(&b), ptr_(n ? b.allocate(n) : nullptr), n_(n) {}
Buffer::~Buffer() {
  if (ptr_) backend_->release(ptr_, n_);
}
Buffer::Buffer(Buffer&& o) noexcept
    : backend_(o.backend_), ptr_(std::exchange(o.ptr_, nullptr)), n_(std::exchange(o.n_, 0)) {}
Buffer& Buffer::operator=(Buffer&& o) noexcept {
  if (this != &o) {
    if (ptr_) backend_->release(ptr_, n_);
    backend_ = o.backend_;
    ptr_ = std::exchange(o.ptr_, nullptr);
    n_ = std::exchange(o.n_, 0);
  }
  return *this;
}

Weight::Weight(Backend& b, std::span<const float> w, int rows, int cols) : backend_(&b), rows_(rows), cols_(cols) {
  if (w.size() != size_t(rows) * cols) fail("weight of {} values is not {} x {}", w.size(), rows, cols);
  ptr_ = b.upload_weight(w, rows, cols, bytes_);
}
void* Backend::upload_weight_blocks(DType type, std::span<const uint8_t>, int, int, size_t&) {
  fail("internal: backend {} keeps no {} blocks", name(), dtype_name(type));
}
void Backend::linear_tokens(const Buffer& x, const Weight& w, const Buffer* bias, int n, int in, int out, Buffer& y) {
  if (n != 1) fail("the {} backend decodes one sequence at a time, not a batch of {}", name(), n);
  linear(x, w, bias, 1, in, out, y);
}
void Backend::linear_tokens_shared(const Buffer& x, std::span<const Product> ps, int n, int in) {
  for (const Product& p : ps) linear_tokens(x, *p.w, p.bias, n, in, p.out, *p.y);
}
void Backend::attention_decode_batch(std::span<const LayerCache* const> caches, const Buffer& q, Buffer& out) {
  for (size_t b = 0; b < caches.size(); ++b) attention_decode(*caches[b], q, out, b);
}

void Backend::attention_prefill_continued(const Buffer&, const Buffer&, const Buffer&, const PastKV&, int, int, int,
                                          int, Buffer&, std::vector<float>*) {
  fail("the {} backend cannot continue a prefill from kept keys and values", name());
}

Weight::Weight(Backend& b, DType type, std::span<const uint8_t> blocks, int rows, int cols)
    : backend_(&b), rows_(rows), cols_(cols), blocks_(type) {
  const auto& info = dtype_info(type);
  if (cols % info.block_elems || blocks.size() != size_t(rows) * cols / info.block_elems * info.block_bytes)
    fail("weight of {} bytes is not {} x {} in {} blocks", blocks.size(), rows, cols, dtype_name(type));
  ptr_ = b.upload_weight_blocks(type, blocks, rows, cols, bytes_);
}
Weight::~Weight() {
  if (ptr_) backend_->release_weight(ptr_);
}
Weight::Weight(Weight&& o) noexcept
    : backend_(o.backend_),
      ptr_(std::exchange(o.ptr_, nullptr)),
      rows_(o.rows_),
      cols_(o.cols_),
      bytes_(std::exchange(o.bytes_, 0)),
      blocks_(o.blocks_) {}
Weight& Weight::operator=(Weight&& o) noexcept {
  if (this != &o) {
    if (ptr_) backend_->release_weight(ptr_);
    backend_ = o.backend_;
    ptr_ = std::exchange(o.ptr_, nullptr);
    rows_ = o.rows_;
    cols_ = o.cols_;
    bytes_ = std::exchange(o.bytes_, 0);
    blocks_ = o.blocks_;
  }
  return *this;
}

WeightFormat parse_weight_format(const std::string& s, const std::string& what) {
  if (s == "fp32") return WeightFormat::F32;
  if (s == "bf16") return WeightFormat::BF16;
  if (s == "gguf") return WeightFormat::GGUF;
  fail("{}: unknown weight format '{}' (expected fp32, bf16 or gguf)", what, s);
}

const char* weight_format_name(WeightFormat f) {
  switch (f) {
    case WeightFormat::BF16:
      return "bf16";
    case WeightFormat::GGUF:
      return "gguf";
    default:
      return "fp32";
  }
}

#ifndef KVBENCH_CUDA
std::unique_ptr<Backend> make_cuda_backend() {
  fail(
      "backend 'cuda': this kvbench was built without CUDA (nvcc was not found at configure time); "
      "use --backend cpu or rebuild where the CUDA toolkit is installed");
}
bool cuda_available() { return false; }
#endif

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") return make_cuda_backend();
  fail("unknown backend '{}' (expected cpu or cuda)", name);
}

}  // namespace kvb
