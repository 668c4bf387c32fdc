#include "harness/util/progress.hpp"

#include <fmt/format.h>

#include <unistd.h>

#include <cstdio>

namespace kvb {

Progress::Progress(std::string label, size_t total, std::string unit)
    : label_(std::move(label)),
      unit_(std::move(unit)),
      total_(total),
      tty_(isatty(fileno(stderr)) != 0),
      start_(std::chrono::steady_clock::now()) {
  draw(true);
}

void Progress::advance(size_t n, const std::string& note) {
  done_ += n;
  note_ = note;
  draw(done_ == total_);
}

void Progress::finish() {
  if (tty_) {
    draw(true);
    fmt::print(stderr, "\n");
  } else if (drawn_ != done_) {
    draw(true);
  }
}

void Progress::draw(bool force) {
  const auto now = std::chrono::steady_clock::now();
  // A log file (a batch job's output) gets a line now and then instead of a bar redrawn in place.
  if (!force && now - last_draw_ < std::chrono::milliseconds(tty_ ? 200 : 30000)) return;
  last_draw_ = now;
  drawn_ = done_;
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
  fmt::print(stderr, "{}{} [{}] {}/{} {:.2f} {}/s ETA {} {}{}", tty_ ? "\r" : "", label_, bar, done_, total_, rate,
             unit_, eta, note_, tty_ ? "" : "\n");
  std::fflush(stderr);
}

}  // namespace kvb
