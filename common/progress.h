// Progress reporting for long work: count, rate and ETA.
// On a terminal the line redraws in place (at most 5 times a second); otherwise a log line is
// written every `log_every_s` seconds. add() is thread-safe (an atomic add and a clock read).
#pragma once

#include <atomic>
#include <chrono>
#include <cstdint>
#include <mutex>
#include <string>

namespace kiln {

class Progress {
 public:
  // total == 0 means unknown (no ETA). unit is printed after the count ("docs", "MB").
  Progress(std::string label, uint64_t total, std::string unit = "items", double log_every_s = 10.0);
  ~Progress();
  Progress(const Progress&) = delete;
  Progress& operator=(const Progress&) = delete;

  void add(uint64_t n = 1);
  // Prints the final line (count, elapsed, mean rate). Idempotent.
  void finish();
  uint64_t count() const { return count_.load(std::memory_order_relaxed); }
  // Text of the current status line (used by tests and the printer).
  std::string line() const;

 private:
  void maybe_print();
  std::string label_;
  uint64_t total_;
  std::string unit_;
  double log_every_s_;
  bool tty_;
  std::atomic<uint64_t> count_{0};
  std::chrono::steady_clock::time_point start_;
  std::atomic<int64_t> next_print_ns_{0};
  std::mutex print_mu_;
  bool finished_ = false;
};

}  // namespace kiln
