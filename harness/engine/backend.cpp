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

std::unique_ptr<Backend> make_backend(const std::string& name, int threads) {
  if (name == "cpu") return make_cpu_backend(threads);
  if (name == "cuda") fail("backend 'cuda' is not built into this kvbench yet; use --backend cpu");
  fail("unknown backend '{}' (expected cpu or cuda)", name);
}

}  // namespace kvb
