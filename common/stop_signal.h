// Graceful stop on SIGTERM, SIGINT and SIGUSR1 (Slurm sends SIGUSR1 with --signal=USR1@T before a
// job's time ends, and SIGTERM on preemption).
//
// While a StopSignals object lives, the first of these signals only records itself (and says on
// stderr that the work will stop at the next safe point); long-running loops poll requested() at
// their safe points, finish cleanly and return. A second signal ends the process at once with
// exit code 128 + signal, as if the handler were not installed. The destructor restores the
// previous handlers and clears the request. One StopSignals at a time per process; requested()
// is async-signal-safe and thread-safe.
#pragma once

#include <string>

namespace kiln {

class StopSignals {
 public:
  // `what` names the work in the stderr notice ("training", "prep").
  explicit StopSignals(const char* what);
  ~StopSignals();
  StopSignals(const StopSignals&) = delete;
  StopSignals& operator=(const StopSignals&) = delete;

  // The first signal received (SIGTERM, SIGINT or SIGUSR1), or 0.
  static int requested();
  // "SIGTERM", "SIGUSR1", ... for messages.
  static std::string name(int sig);
};

}  // namespace kiln
