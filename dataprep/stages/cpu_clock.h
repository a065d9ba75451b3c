// CPU time of the prep stages and of their parts, for the run's summary and stats.json
// ("cpu_s"): on a shared machine wall time says little, CPU seconds say what a stage costs.
// process_cpu_seconds() is the whole process (every thread, the shard writer's pool included);
// PartClock adds up the CPU time threads spend in one part (the filters, tagging, tokenizing),
// measured with the calling thread's CPU clock (a clock_gettime call, ~0.1-0.3 us, per start
// and stop). Thread-safe.
#pragma once

#include <sys/resource.h>
#include <time.h>

#include <atomic>
#include <cstdint>

namespace kiln::prep::detail {

inline double process_cpu_seconds() {
  rusage u{};
  getrusage(RUSAGE_SELF, &u);
  return static_cast<double>(u.ru_utime.tv_sec + u.ru_stime.tv_sec) +
         1e-6 * static_cast<double>(u.ru_utime.tv_usec + u.ru_stime.tv_usec);
}

inline uint64_t thread_cpu_ns() {
  timespec t{};
  clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
  return static_cast<uint64_t>(t.tv_sec) * 1000000000ull + static_cast<uint64_t>(t.tv_nsec);
}

// Const to time: a stage that only reads the Context still adds to its clock (instrumentation).
struct PartClock {
  mutable std::atomic<uint64_t> ns{0};
  double seconds() const { return 1e-9 * static_cast<double>(ns.load()); }
  // Times one call of f on this thread.
  template <typename F>
  decltype(auto) time(F&& f) const {
    const uint64_t t0 = thread_cpu_ns();
    struct Add {
      const PartClock* c;
      uint64_t t0;
      ~Add() { c->ns.fetch_add(thread_cpu_ns() - t0, std::memory_order_relaxed); }
    } add{this, t0};
    return f();
  }
};

}  // namespace kiln::prep::detail
