#include "harness/util/progress.hpp"

#include <fmt/format.h>

#include <cstdio>

namespace kvb {

Progress::Progress(std::string label, size_t total, std::string unit)
    : label_(std::move(label)), unit_(std::move(unit)), total_(total), start_(std::chrono::steady_clock::now()) {
  draw(true);
}

void Progress::advance(size_t n, const std::string& note) {
  done_ += n;
  note_ = note;
  draw(done_ == total_);
}

void Progress::finish() {
  draw(true);
  fmt::print(stderr, "\n");
}

void Progress::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  if (!force && now - last_draw_ < std::chrono::milliseconds(200)) return;
  last_draw_ = now;
  const double elapsed = std::chrono::duration<double>(now - start_).count();
  const double rate = elapsed > 0 ? static_cast<double>(done_) / elapsed : 0.0;
  const double frac = total_ ? static_cast<double>(done_) / static_cast<double>(total_) : 1.0;
  constexpr int kWidth = 28;
  const int filled = static_cast<int>(frac * kWidth);
  std::string bar(static_cast<size_t>(filled), '#');
  bar.resize(kWidth, '.');
  std::string eta = "--";
  if (rate > 0 && done_ < total_) {
    const auto s = static_cast<long>(static_cast<double>(total_ - done_) / rate);
    eta = fmt::format("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60);
  }
  fmt::print(stderr, "\r{} [{}] {}/{} {:.2f} {}/s ETA {} {}", label_, bar, done_, total_, rate, unit_, eta, note_);
  std::fflush(stderr);
}

}  // namespace kvb
