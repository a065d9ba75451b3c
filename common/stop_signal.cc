#include "common/stop_signal.h"

#include <signal.h>
#include <unistd.h>

#include <atomic>
#include <cstring>

#include "common/status.h"

namespace kiln {
namespace {

constexpr int kSignals[] = {SIGTERM, SIGINT, SIGUSR1};
std::atomic<int> g_requested{0};
const char* g_what = "work";
struct sigaction g_previous[3];

void write_stderr(const char* s) {
  ssize_t ignored = ::write(STDERR_FILENO, s, std::strlen(s));
  (void)ignored;
}

extern "C" void on_stop_signal(int sig) {
  int expected = 0;
  if (g_requested.compare_exchange_strong(expected, sig)) {
    write_stderr("[kiln] [warn] signal received: stopping ");
    write_stderr(g_what);
    write_stderr(" at the next safe point (send it again to stop at once)\n");
    return;
  }
  write_stderr("[kiln] [warn] second signal: stopping at once\n");
  ::_exit(128 + sig);
}

}  // namespace

StopSignals::StopSignals(const char* what) {
  g_what = what;
  g_requested.store(0);
  struct sigaction sa;
  std::memset(&sa, 0, sizeof sa);
  sa.sa_handler = on_stop_signal;
  sigemptyset(&sa.sa_mask);
  sa.sa_flags = SA_RESTART;
  for (size_t i = 0; i < 3; ++i) {
    KILN_CHECK(::sigaction(kSignals[i], &sa, &g_previous[i]) == 0, "sigaction failed");
  }
}

StopSignals::~StopSignals() {
  for (size_t i = 0; i < 3; ++i) ::sigaction(kSignals[i], &g_previous[i], nullptr);
  g_requested.store(0);
}

int StopSignals::requested() { return g_requested.load(); }

std::string StopSignals::name(int sig) {
  switch (sig) {
    case SIGTERM: return "SIGTERM";
    case SIGINT: return "SIGINT";
    case SIGUSR1: return "SIGUSR1";
    default: return "signal " + std::to_string(sig);
  }
}

}  // namespace kiln
