#include "common/progress.h"

#include <cstdio>

#include "common/log.h"

namespace kiln {
namespace {

std::string human_duration(double s) {
  char buf[32];
  if (s < 60) std::snprintf(buf, sizeof buf, "%.0fs", s);
  else if (s < 3600) std::snprintf(buf, sizeof buf, "%dm%02ds", int(s) / 60, int(s) % 60);
  else std::snprintf(buf, sizeof buf, "%dh%02dm", int(s) / 3600, (int(s) % 3600) / 60);
  return buf;
}

}  // namespace

Progress::Progress(std::string label, uint64_t total, std::string unit, double log_every_s)
    : label_(std::move(label)), total_(total), unit_(std::move(unit)),
      log_every_s_(log_every_s), tty_(stderr_is_terminal()),
      start_(std::chrono::steady_clock::now()) {}

Progress::~Progress() { finish(); }

void Progress::add(uint64_t n) {
  count_.fetch_add(n, std::memory_order_relaxed);
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - start_).count();
  if (now >= next_print_ns_.load(std::memory_order_relaxed)) maybe_print();
}

std::string Progress::line() const {
  double elapsed = std::chrono::duration<double>(std::chrono::steady_clock::now() - start_).count();
  uint64_t c = count();
  double rate = elapsed > 0 ? c / elapsed : 0.0;
  char buf[256];
  if (total_ > 0) {
    double eta = rate > 0 && c < total_ ? (total_ - c) / rate : 0.0;
    std::snprintf(buf, sizeof buf, "%s: %llu/%llu %s (%.1f%%), %.1f %s/s, ETA %s", label_.c_str(),
                  (unsigned long long)c, (unsigned long long)total_, unit_.c_str(),
                  100.0 * c / total_, rate, unit_.c_str(), human_duration(eta).c_str());
  } else {
    std::snprintf(buf, sizeof buf, "%s: %llu %s, %.1f %s/s, %s elapsed", label_.c_str(),
                  (unsigned long long)c, unit_.c_str(), rate, unit_.c_str(),
                  human_duration(elapsed).c_str());
  }
  return buf;
}

void Progress::maybe_print() {
  std::unique_lock lock(print_mu_, std::try_to_lock);
  if (!lock.owns_lock() || finished_) return;
  int64_t now = std::chrono::duration_cast<std::chrono::nanoseconds>(
                    std::chrono::steady_clock::now() - start_).count();
  if (now < next_print_ns_.load(std::memory_order_relaxed)) return;
  double interval = tty_ ? 0.2 : log_every_s_;
  next_print_ns_.store(now + static_cast<int64_t>(interval * 1e9), std::memory_order_relaxed);
  if (now < static_cast<int64_t>(interval * 1e9) && !tty_) return;  // no log line at t=0
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s", line().c_str());
    std::fflush(stderr);
  } else {
    KILN_LOG_INFO("{}", line());
  }
}

void Progress::finish() {
  std::lock_guard lock(print_mu_);
  if (finished_) return;
  finished_ = true;
  if (tty_) {
    std::fprintf(stderr, "\r\033[K%s\n", line().c_str());
    std::fflush(stderr);
  } else {
    KILN_LOG_INFO("{} (done)", line());
  }
}

}  // namespace kiln
