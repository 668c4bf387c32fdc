#pragma once
// Writes NumPy .npy files (format 1.0, little-endian, C order), so that tensors kvbench computes can be
// read by Python tools (np.load) without a conversion step.
#include <cstdint>
#include <span>
#include <string>
#include <vector>

namespace kvb {

void write_npy(const std::string& path, std::span<const float> data, const std::vector<size_t>& shape);
void write_npy(const std::string& path, std::span<const int32_t> data, const std::vector<size_t>& shape);

}  // namespace kvb
