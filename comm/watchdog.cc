#include "comm/watchdog.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cinttypes>
#include <cmath>
#include <condition_variable>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <mutex>
#include <thread>

#include "comm/comm.h"
#include "common/log.h"
#include "common/text.h"

namespace kiln::comm {

using Clock = std::chrono::steady_clock;

void test_stall(int world_rank, int64_t step) {
  static const char* stall = std::getenv("KILN_TEST_STALL");  // RANK:STEP:SECONDS, tests only
  if (stall == nullptr || *stall == '\0') return;
  long rank = -1, at = -1;
  double secs = 0;
  if (std::sscanf(stall, "%ld:%ld:%lf", &rank, &at, &secs) != 3) return;
  if (rank != world_rank || at != step) return;
  KILN_LOG_WARN("rank {}: KILN_TEST_STALL: sleeping {} s at step {} before its collectives", rank,
                secs, step);
  std::this_thread::sleep_for(std::chrono::duration<double>(secs));
}

namespace detail {

// The watchdog's record of one group (owned by the registry, never freed: a ProcessGroup keeps a
// pointer to it, and the watchdog thread reads it while the group may be gone).
struct GroupWatch {
  std::string key;  // "name/backend": how ranks ask each other about the group
  std::string name;
  std::string backend;
  int rank = 0, size = 1;
  std::vector<int> world_ranks;
  uint64_t started = 0;  // the number of the last collective started on the group
  // Point-to-point operations started, by peer (group rank): the number of the last one.
  std::map<int, uint64_t> sends_to, recvs_from;
  uint64_t used = 0;     // when it was last used (of several groups with one key, the newest answers)
};

}  // namespace detail

namespace {

using detail::GroupWatch;

struct Op {
  GroupWatch* group;
  ProcessGroup* pg;  // alive while the collective is outstanding
  const char* collective;  // or "send" / "recv"
  uint64_t seq;            // point-to-point: the number between this rank and `peer`
  Clock::time_point start;
  int peer = -1;  // point-to-point: the other rank (group rank); -1: a collective
};

// "recv #3 from rank 0 (world rank 4)" / "all_reduce #42".
std::string describe(const std::string& what, uint64_t seq, int peer, const GroupWatch& g) {
  std::string out = fmt::format("{} #{}", what, seq);
  if (peer < 0) return out;
  out += fmt::format(" {} rank {}", what == "send" ? "to" : "from", peer);
  if (peer < static_cast<int>(g.world_ranks.size()))
    out += fmt::format(" (world rank {})", g.world_ranks[peer]);
  return out;
}

struct Registry {
  std::mutex mu;
  std::condition_variable cv;
  bool running = false, stopping = false;
  double timeout_s = 0;
  std::string setting;  // what sets the timeout, for the message
  ProcessGroup* world = nullptr;
  std::unique_ptr<detail::WatchdogLink> link;
  std::thread thread;
  std::map<uint64_t, Op> ops;  // outstanding, by id: the first is the oldest
  std::vector<std::unique_ptr<GroupWatch>> groups;
  uint64_t next_id = 1, uses = 0;
  std::string context;
  // The last collective this rank completed, and when.
  const GroupWatch* last_group = nullptr;
  const char* last_collective = nullptr;
  uint64_t last_seq = 0;
  int last_peer = -1;
  Clock::time_point last_end = Clock::now();
};

// Leaked: collectives may end during static destruction.
Registry& reg() {
  static Registry* r = new Registry;
  return *r;
}
std::atomic<bool> g_on{false};

std::string key_of(const std::string& name, const std::string& backend) {
  return name + "/" + backend;
}

// What this rank is doing (r.mu held): "at step 3; in all_reduce #42 on dp for 5.0 s".
std::string activity(const Registry& r) {
  std::string out = r.context.empty() ? std::string() : "at " + r.context + "; ";
  if (!r.ops.empty()) {
    const Op& op = r.ops.begin()->second;
    out +=
        fmt::format("in {} on {} for {:.1f} s", describe(op.collective, op.seq, op.peer, *op.group),
                    op.group->name, seconds_since(op.start));
    if (r.ops.size() > 1) out += fmt::format(" ({} collectives outstanding)", r.ops.size());
  } else if (r.last_group != nullptr) {
    out += fmt::format("in no collective for {:.1f} s (the last one it completed: {} on {})",
                       seconds_since(r.last_end),
                       describe(r.last_collective, r.last_seq, r.last_peer, *r.last_group),
                       r.last_group->name);
  } else {
    out += fmt::format("in no collective for {:.1f} s (none completed since the watchdog started)",
                       seconds_since(r.last_end));
  }
  return out;
}

// The question is a group key, optionally followed by "\n<asker's group rank>" (a point-to-point
// timeout): the answer is "<collectives started>\n<activity>", and then for a point-to-point
// question "\n<sends started to the asker> <recvs started from it>".
std::string answer_locked(Registry& r, const std::string& question) {
  const size_t nl = question.find('\n');
  const std::string key = question.substr(0, nl);
  const GroupWatch* g = nullptr;
  for (const auto& w : r.groups)
    if (w->key == key && (g == nullptr || w->used > g->used)) g = w.get();
  std::string out = std::to_string(g ? g->started : 0) + "\n" + activity(r);
  if (nl != std::string::npos) {
    const int asker = std::atoi(question.c_str() + nl + 1);
    uint64_t sent = 0, received = 0;
    if (g) {
      if (auto it = g->sends_to.find(asker); it != g->sends_to.end()) sent = it->second;
      if (auto it = g->recvs_from.find(asker); it != g->recvs_from.end()) received = it->second;
    }
    out += "\n" + std::to_string(sent) + " " + std::to_string(received);
  }
  return out;
}

std::string answer(const std::string& key) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  return answer_locked(r, key);
}

constexpr double kGrace = 5.0;  // how long the other ranks' watchdog threads have to answer
void report_peer(int me, const Op& op, const GroupWatch& g, detail::WatchdogLink* link);
void report_collective(int me, const Op& op, const GroupWatch& g, detail::WatchdogLink* link);

// The oldest collective has waited past the timeout: report and end the job. Called by the
// watchdog thread with `lk` held; does not return.
[[noreturn]] void fire(Registry& r, std::unique_lock<std::mutex>& lk) {
  const Op op = r.ops.begin()->second;
  const GroupWatch g = *op.group;
  const double waited = seconds_since(op.start), timeout = r.timeout_s;
  const std::string context = r.context, setting = r.setting;
  const int me = r.world->rank();
  std::vector<ProcessGroup*> outstanding;
  for (const auto& [id, o] : r.ops) outstanding.push_back(o.pg);
  detail::WatchdogLink* link = r.link.get();
  lk.unlock();

  if (op.peer >= 0) {
    KILN_LOG_ERROR(
        "rank {}: point-to-point timeout: {} on group {} ({}, rank {} of {}) has not "
        "completed after {:.1f} s ({} {}){}",
        me, describe(op.collective, op.seq, op.peer, g), g.name, g.backend, g.rank, g.size, waited,
        setting, timeout, context.empty() ? "" : "; this rank is at " + context);
    report_peer(me, op, g, link);
  } else {
    KILN_LOG_ERROR(
        "rank {}: collective timeout: {} #{} on group {} ({}, rank {} of {}) has not "
        "completed after {:.1f} s ({} {}){}",
        me, op.collective, op.seq, g.name, g.backend, g.rank, g.size, waited, setting, timeout,
        context.empty() ? "" : "; this rank is at " + context);
    report_collective(me, op, g, link);
  }
  KILN_LOG_ERROR("rank {}: stopping every rank", me);
  spdlog::default_logger()->flush();
  std::fflush(stderr);
  // If the abort below does not end this process, this does.
  std::thread([] {
    std::this_thread::sleep_for(std::chrono::seconds(20));
    std::_Exit(1);
  }).detach();
  for (ProcessGroup* pg : outstanding)
    if (pg != r.world) pg->cancel();
  r.world->abort(1);
  std::_Exit(1);
}

// A send / recv timed out: what the peer is doing, and whether it has posted its side.
void report_peer(int me, const Op& op, const GroupWatch& g, detail::WatchdogLink* link) {
  const bool known = op.peer < static_cast<int>(g.world_ranks.size());
  const std::string who =
      known ? fmt::format("peer rank {} (world rank {})", op.peer, g.world_ranks[op.peer])
            : fmt::format("peer rank {}", op.peer);
  if (link == nullptr || !known) {
    KILN_LOG_ERROR("rank {}: {} of {} could not be asked what it is doing ({})", me, who, g.name,
                   link == nullptr ? "MPI without MPI_THREAD_MULTIPLE" : "members unknown");
    return;
  }
  const int peer_world = g.world_ranks[op.peer];
  if (peer_world == me) {
    KILN_LOG_ERROR("rank {}: the peer is this rank itself (a message to itself never matched)", me);
    return;
  }
  const auto answers =
      link->ask({peer_world}, g.key + "\n" + std::to_string(g.rank), kGrace, answer);
  if (!answers[0]) {
    KILN_LOG_ERROR(
        "rank {}: {} did not answer within {:.0f} s (its process or machine is not "
        "responding)",
        me, who, kGrace);
    return;
  }
  // "<collectives>\n<activity>\n<sends to me> <recvs from me>"
  const std::string& a = *answers[0];
  const size_t nl1 = a.find('\n');
  const size_t nl2 = nl1 == std::string::npos ? std::string::npos : a.rfind('\n');
  const std::string what = nl1 == std::string::npos
                               ? a
                               : a.substr(nl1 + 1, nl2 == nl1 ? std::string::npos : nl2 - nl1 - 1);
  uint64_t sent = 0, received = 0;
  if (nl2 != std::string::npos && nl2 != nl1)
    (void)std::sscanf(a.c_str() + nl2 + 1, "%" SCNu64 " %" SCNu64, &sent, &received);
  const bool recv = std::string(op.collective) == "recv";
  const uint64_t theirs = recv ? sent : received;
  KILN_LOG_ERROR(
      "rank {}: {} on {} has started {} {} {} this rank (this is {} #{}): {}{}", me, who, g.name,
      theirs, recv ? "sends" : "recvs", recv ? "to" : "from", op.collective, op.seq,
      theirs < op.seq
          ? (recv ? "it has not sent this message; " : "it has not posted the matching recv; ")
          : "",
      what);
}

// A collective timed out: which ranks of its group have not arrived.
void report_collective(int me, const Op& op, const GroupWatch& g, detail::WatchdogLink* link) {
  std::vector<int> peers;
  for (int w : g.world_ranks)
    if (w != me) peers.push_back(w);
  if (link == nullptr || g.world_ranks.empty()) {
    KILN_LOG_ERROR("rank {}: the other ranks of {} could not be asked which of them have not "
                   "arrived ({})",
                   me, g.name,
                   link == nullptr ? "MPI without MPI_THREAD_MULTIPLE" : "members unknown");
  } else if (!peers.empty()) {
    const auto answers = link->ask(peers, g.key, kGrace, answer);
    std::string missing, arrived;
    for (size_t i = 0; i < peers.size(); ++i) {
      const std::string who = "rank " + std::to_string(peers[i]);
      if (!answers[i]) {
        KILN_LOG_ERROR("rank {}: {} did not answer within {:.0f} s (its process or machine is "
                       "not responding)",
                       me, who, kGrace);
        missing += (missing.empty() ? "" : ", ") + std::to_string(peers[i]);
        continue;
      }
      const std::string& a = *answers[i];
      const size_t nl = a.find('\n');
      const uint64_t started = std::strtoull(a.substr(0, nl).c_str(), nullptr, 10);
      const std::string what = nl == std::string::npos ? std::string() : a.substr(nl + 1);
      if (started < op.seq) {
        KILN_LOG_ERROR("rank {}: not arrived: {} (it has started {} collectives on {}, this is "
                       "#{}): {}",
                       me, who, started, g.name, op.seq, what);
        missing += (missing.empty() ? "" : ", ") + std::to_string(peers[i]);
      } else {
        arrived += (arrived.empty() ? "" : ", ") + std::to_string(peers[i]);
      }
    }
    KILN_LOG_ERROR("rank {}: {} #{} on {}: ranks not arrived or not answering: {}; arrived: {}",
                   me, op.collective, op.seq, g.name, missing.empty() ? "none" : missing,
                   arrived.empty() ? "none" : arrived);
  }
}

void run() {
  Registry& r = reg();
  std::unique_lock<std::mutex> lk(r.mu);
  while (!r.stopping) {
    // Answer peers within a fraction of a second; look at the clock often enough for the timeout.
    const double tick = std::clamp(r.timeout_s / 4, 0.01, 0.2);
    r.cv.wait_for(lk, std::chrono::duration<double>(tick));
    if (r.stopping) break;
    if (!r.ops.empty() && seconds_since(r.ops.begin()->second.start) > r.timeout_s) fire(r, lk);
    if (r.link) {
      lk.unlock();
      r.link->serve(answer);
      lk.lock();
    }
  }
}

}  // namespace

Status start_watchdog(ProcessGroup& world, double timeout_s, const std::string& setting) {
  // (NaN would pass `<= 0` and every comparison after it: a watchdog that spins and never fires.)
  if (!std::isfinite(timeout_s) || timeout_s < 0) {
    return Status::usage(setting + " must be a finite number of seconds >= 0 (0: off), got " +
                         std::to_string(timeout_s));
  }
  if (timeout_s == 0) return Status::ok();
  Registry& r = reg();
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (r.running) {
      r.timeout_s = timeout_s;
      r.setting = setting;
      return Status::ok();
    }
  }
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<detail::WatchdogLink> link, world.open_watchdog_link());
  {
    std::lock_guard<std::mutex> lk(r.mu);
    r.world = &world;
    r.link = std::move(link);
    r.timeout_s = timeout_s;
    r.setting = setting;
    r.running = true;
    r.stopping = false;
    r.last_end = Clock::now();
    r.thread = std::thread(run);
  }
  g_on.store(true, std::memory_order_release);
  static std::once_flag at_exit;
  std::call_once(at_exit, [] { std::atexit(stop_watchdog); });
  return Status::ok();
}

void stop_watchdog() {
  Registry& r = reg();
  {
    std::lock_guard<std::mutex> lk(r.mu);
    if (!r.running || r.stopping) return;
    r.stopping = true;
  }
  g_on.store(false, std::memory_order_release);
  r.cv.notify_all();
  r.thread.join();
  std::lock_guard<std::mutex> lk(r.mu);
  r.link.reset();
  r.ops.clear();
  r.running = false;
  r.stopping = false;
  r.timeout_s = 0;
}

double watchdog_timeout_s() {
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  return r.running ? r.timeout_s : 0;
}

void set_watchdog_context(const std::string& context) {
  if (!g_on.load(std::memory_order_acquire)) return;
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  r.context = context;
}

namespace detail {

// The watchdog's record of g (r.mu held), created on first use.
GroupWatch* group_watch(Registry& r, ProcessGroup& g, GroupWatch*& slot, uint64_t started,
                        const std::map<int, uint64_t>& sends_to,
                        const std::map<int, uint64_t>& recvs_from) {
  if (slot == nullptr) {
    auto owned = std::make_unique<GroupWatch>();
    owned->name = g.name();
    owned->backend = g.backend();
    owned->key = key_of(owned->name, owned->backend);
    owned->rank = g.rank();
    owned->size = g.size();
    owned->world_ranks = g.world_ranks();
    owned->started = started;
    owned->sends_to = sends_to;
    owned->recvs_from = recvs_from;
    slot = owned.get();
    r.groups.push_back(std::move(owned));
  }
  slot->used = ++r.uses;
  return slot;
}

uint64_t watch_begin(ProcessGroup& g, const char* collective, uint64_t seq) {
  if (!g_on.load(std::memory_order_acquire)) return 0;
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!r.running || r.stopping) return 0;
  GroupWatch* w = group_watch(r, g, g.watch_, seq, g.sends_to_, g.recvs_from_);
  w->started = seq;
  const uint64_t id = r.next_id++;
  r.ops.emplace(id, Op{w, &g, collective, seq, Clock::now()});
  return id;
}

uint64_t watch_begin_p2p(ProcessGroup& g, const char* op, int peer, uint64_t seq) {
  if (!g_on.load(std::memory_order_acquire)) return 0;
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  if (!r.running || r.stopping) return 0;
  GroupWatch* w = group_watch(r, g, g.watch_, g.seq_, g.sends_to_, g.recvs_from_);
  (std::string(op) == "send" ? w->sends_to : w->recvs_from)[peer] = seq;
  const uint64_t id = r.next_id++;
  r.ops.emplace(id, Op{w, &g, op, seq, Clock::now(), peer});
  return id;
}

void watch_end(uint64_t id) {
  Registry& r = reg();
  std::lock_guard<std::mutex> lk(r.mu);
  auto it = r.ops.find(id);
  if (it == r.ops.end()) return;  // the watchdog was stopped meanwhile
  r.last_group = it->second.group;
  r.last_collective = it->second.collective;
  r.last_seq = it->second.seq;
  r.last_peer = it->second.peer;
  r.last_end = Clock::now();
  r.ops.erase(it);
}

std::string watchdog_answer(const std::string& key) { return answer(key); }

}  // namespace detail
}  // namespace kiln::comm
