#pragma once
// The device copies of the host caches the CUDA backend attends over. The host LayerCache remains the
// cache of record (methods edit it); each copy is re-sent whole when its cache is restructured (a new
// epoch, a segment replaced or shrunk) and extended by the appended tokens otherwise. The dense
// segments are the backend's own; every other format gives its device form itself
// (Segment::device_form), so nothing here names a format.
#include <cuda_runtime.h>

#include <cstdint>
#include <unordered_map>
#include <vector>

#include "harness/engine/cuda/device_memory.hpp"
#include "kernels/cuda/cuda_kernels.hpp"

namespace kvb {

class LayerCache;
class Segment;
class DenseSegment;
class RopeTable;

namespace cuda {

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

class DeviceCaches {
 public:
  explicit DeviceCaches(cudaStream_t stream) : stream_(stream) {}
  // The model's rotary frequencies (host copy, device copy the kernels read): the kernels rotate
  // pre-RoPE segments with them, so a segment with another table is refused.
  void set_rope(std::vector<float> inv_freq, const float* device_inv_freq, bool interleaved);
  // One decoded token's K and V (device rows [n_kv_heads, d]) appended to each head's dense tail on
  // the device, before the host cache has them; false when the copy is out of date (the next
  // layout() then syncs from the host).
  bool append(const LayerCache& cache, const float* k, const float* v, int n_kv_heads);
  // The cache's decode layout for the kernels, after bringing its device copy up to date.
  DecodeLayout layout(const LayerCache& cache);
  void clear() { mirrors_.clear(); }

 private:
  class Uploader;
  void check_rope(const RopeTable& r) const;
  SegmentMirror mirror_of(CacheMirror& m, const Segment& s);
  void upload_dense_rows(const DenseSegment& ds, size_t t0, size_t n, char* k_dst, char* v_dst);
  void grow_dense(SegmentMirror& sm, size_t n);
  void extend_dense(SegmentMirror& sm);
  CacheMirror& sync(const LayerCache& cache);

  cudaStream_t stream_;
  std::vector<float> inv_freq_host_;
  const float* inv_freq_ = nullptr;
  bool interleaved_ = false;
  std::unordered_map<const LayerCache*, CacheMirror> mirrors_;
};

}  // namespace cuda
}  // namespace kvb
