#pragma once
// A one-line progress bar on stderr with rate and ETA, redrawn at most every 0.2 s; where stderr is
// not a terminal (a batch job's log), a line every 30 s and one at the end.
#include <chrono>
#include <string>

namespace kvb {

class Progress {
 public:
  Progress(std::string label, size_t total, std::string unit = "it");
  // Marks `n` more items done; `note` (e.g. the last score) is shown after the counts.
  void advance(size_t n = 1, const std::string& note = "");
  void finish();

 private:
  void draw(bool force);
  std::string label_, unit_, note_;
  size_t total_, done_ = 0, drawn_ = 0;
  bool tty_;
  std::chrono::steady_clock::time_point start_, last_draw_;
};

}  // namespace kvb
