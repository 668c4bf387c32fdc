#pragma once
// How a storage format gives a GPU backend its device form: Segment::device_form fills the decode
// kernels' descriptor (kernels/decode_segment.hpp) with arrays it uploads through the backend's
// uploader, so that each format's device form sits beside its CPU code and the backend names no
// format. A format without one keeps the default (false) and runs on the CPU backend.
#include <cstdint>
#include <span>

namespace kvb {

class RopeTable;

class DeviceUploader {
 public:
  virtual ~DeviceUploader() = default;
  // A device copy owned by the segment's device mirror, valid until the cache is rebuilt.
  virtual const float* upload(std::span<const float> x) = 0;
  virtual const int32_t* upload(std::span<const int32_t> x) = 0;
  virtual const uint32_t* upload(std::span<const uint32_t> x) = 0;
  virtual const uint16_t* upload(std::span<const uint16_t> x) = 0;
  // Data several segments share (a basis, an estimator's matrix), uploaded once per rebuild.
  virtual const float* upload_shared(std::span<const float> x) = 0;
  // Refuses a RoPE table other than the model's, which the kernels apply.
  virtual void check_rope(const RopeTable& rope) = 0;
};

}  // namespace kvb
