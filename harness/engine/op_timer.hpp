#pragma once
// Adds the wall time of a scope to one of a backend's OpStats counters when profiling is on. On an
// asynchronous backend it synchronises at both ends so that the time is the operation's own.
#include <chrono>

#include "harness/engine/backend.hpp"

namespace kvb {

class OpTimer {
 public:
  OpTimer(Backend& b, bool on, double& counter) : b_(b), on_(on), counter_(counter) {
    if (!on_) return;
    b_.synchronize();
    t0_ = std::chrono::steady_clock::now();
  }
  ~OpTimer() {
    if (!on_) return;
    b_.synchronize();
    counter_ += std::chrono::duration<double>(std::chrono::steady_clock::now() - t0_).count();
  }
  OpTimer(const OpTimer&) = delete;
  OpTimer& operator=(const OpTimer&) = delete;

 private:
  Backend& b_;
  bool on_;
  double& counter_;
  std::chrono::steady_clock::time_point t0_;
};

}  // namespace kvb
