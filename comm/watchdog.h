// The collective watchdog: a rank that stops arriving must not hang the job.
//
// Every collective a ProcessGroup starts (blocking or asynchronous) is recorded while it is
// outstanding: from the call until it returns (blocking) or until its Work handle reports
// completion (wait(), test() or its destructor). One thread per process looks at the oldest
// outstanding collective a few times a second; when it has waited longer than the timeout
// (`parallel.collective_timeout_s` in `kiln train`, like PyTorch's NCCL timeout) the thread:
//   1. asks every other rank of that collective's group what it is doing, over a communicator of
//      its own (needs MPI_THREAD_MULTIPLE; each rank's watchdog thread answers within a tick, so
//      a rank whose training thread is stuck in I/O, a deadlock or a stalled GPU still answers),
//      and names the ranks that have not arrived (they have started fewer collectives on that
//      group) with what they are doing ("at step 3, in no collective for 12.0 s; last: ...");
//   2. logs one error naming this rank, the collective, its number on the group, the group, how
//      long it waited and those ranks;
//   3. aborts the group's device communicators (ncclCommAbort) and then every process
//      (MPI_Abort on the world), with a fallback _Exit if that does not return.
// The exit code is 1. Without MPI_THREAD_MULTIPLE the message says the peers could not be asked.
//
// Point-to-point messages (ProcessGroup::send / recv / isend / irecv) are watched the same way,
// from the call until the handle completes; one outstanding too long is reported as a
// "point-to-point timeout" naming the operation, its number between the two ranks ("recv #3":
// the third recv this rank posted from that peer on that group), the group and the peer (group
// and world rank); only the peer is asked, and it answers what it is doing and how many messages
// it has started towards this rank, so "it has not sent this message" (a dead or stalled pipeline
// stage) is told apart from a message that was sent but not matched. Point-to-point messages do
// not advance the collectives' numbers.
//
// Cost when running: a mutex, a clock read and a small map insert per collective, and the
// thread's wake-ups (each a non-blocking MPI_Test); no extra collectives. When not started
// (one process, or timeout 0) only a per-group counter is incremented.
//
// A collective's number (#N) counts the collectives this rank has started on that group since it
// was created, so the same collective has the same number on every rank of the group.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"

namespace kiln::comm {

class ProcessGroup;

// Starts the watchdog over `world` (the group every process is in; its abort() ends the job):
// collectives outstanding longer than timeout_s stop the job. Collective over `world` (every rank
// calls it at the same point: it may create the communicator the watchdog threads talk over).
// timeout_s <= 0: nothing is started. Calling it again changes the timeout only. `setting`: the
// config key or flag that set the timeout, named in the message.
Status start_watchdog(ProcessGroup& world, double timeout_s,
                      const std::string& setting = "parallel.collective_timeout_s");
// Stops the thread (also registered at exit). Collectives are no longer watched.
void stop_watchdog();
// The timeout of the running watchdog, 0 when none runs.
double watchdog_timeout_s();
// What this rank is doing, for the messages (e.g. "step 12"): set by the training loop.
void set_watchdog_context(const std::string& context);
// Test-only: with KILN_TEST_STALL=RANK:STEP:SECONDS in the environment, world rank RANK sleeps
// SECONDS when it reaches `step` (a rank that stops arriving; kiln train calls it before each
// step's collectives, kiln prep with step 0 before its first). Nothing otherwise.
void test_stall(int world_rank, int64_t step);

namespace detail {

// The watchdog threads' channel between ranks (the MPI backend's: a duplicate of the world
// communicator). Used only by the watchdog thread.
class WatchdogLink {
 public:
  virtual ~WatchdogLink() = default;
  // Answers the questions that arrived (non-blocking): answer(question) is sent to the asker.
  virtual void serve(const std::function<std::string(const std::string&)>& answer) = 0;
  // Sends `question` to each of `world_ranks` and waits up to grace_s for their answers (serving
  // questions meanwhile); a rank that did not answer gets nullopt.
  virtual std::vector<std::optional<std::string>> ask(
      const std::vector<int>& world_ranks, const std::string& question, double grace_s,
      const std::function<std::string(const std::string&)>& answer) = 0;
};

// Used by ProcessGroup (comm/comm.cc): a collective started (the id to end it with; 0 when the
// watchdog does not run) and completed.
uint64_t watch_begin(ProcessGroup& g, const char* collective, uint64_t seq);
void watch_end(uint64_t id);

// What a rank answers when asked about group `key` (tests): "<collectives started>\n<activity>";
// asked "<key>\n<asker's group rank>" (point-to-point), a third line "<sends started to the asker>
// <recvs started from it>".
std::string watchdog_answer(const std::string& key);

}  // namespace detail
}  // namespace kiln::comm
