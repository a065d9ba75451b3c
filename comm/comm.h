// Process groups and collectives.
//
// A ProcessGroup is a set of ranks 0..size()-1 that take part in collectives together. The world
// group comes from world(): under `mpirun` (detected from the launcher's environment) it is the
// MPI backend (comm/mpi_group.cc, built when CMake finds MPI: KILN_HAVE_MPI); otherwise it is the
// single-process backend, where every collective is a local copy. split() derives sub-groups
// (data-parallel, tensor-parallel: comm/topology.h) the way MPI_Comm_split does. The NCCL backend
// (comm/nccl.h) has the same interface over device memory.
//
// Contract shared by every backend:
// - Memory: the MPI and local backends take host pointers; the NCCL backend device pointers.
// - Collectives must be called by every rank of the group in the same order with matching
//   arguments (same root, same element counts where they must match). A mismatch is a program
//   bug (MPI reports it or hangs); it is not detected here.
// - Deterministic reductions: a floating-point kSum gives the same bits on every rank, summed in
//   rank order ((x0 + x1) + x2) + ..., whatever the library's algorithm, so the same inputs always
//   give the same result (bit-exact resume and equivalence tests depend on it). Integer sums, min
//   and max are exact anyway.
// - Blocking calls return when this rank's buffers may be reused. The i*() calls start the same
//   collective and return a Work handle; the buffers belong to the collective until wait()
//   returns. A handle destroyed without wait() waits in its destructor. Collectives' handles of
//   one group complete in the order they were started; start them in the same order on every
//   rank. (Point-to-point handles complete independently: below.)
// - Byte counters: every call adds to counters() under its collective's name. "bytes" is the
//   data volume as the ZeRO paper counts it: all_reduce 2x the buffer (a reduce-scatter plus an
//   all-gather), all_gather the gathered (full) buffer, reduce_scatter the input (full) buffer,
//   broadcast / gather / all_to_all the payload. A bandwidth-optimal (ring) algorithm puts
//   (n-1)/n of that on each rank's link. One-rank groups count nothing (no data moves).
// - Byte counts are size_t; the MPI backend splits transfers larger than MPI's int limits.
// - Only one thread per process calls into a group at a time (MPI_THREAD_FUNNELED semantics:
//   the thread that first called world()). MPI is initialised with MPI_THREAD_MULTIPLE only so
//   that the watchdog's thread can use a communicator of its own.
// - Failures (an MPI / NCCL error code) come back as Status::internal naming the collective.
// - A collective that does not complete within the watchdog's timeout (comm/watchdog.h) stops
//   every rank with a message naming this rank, the collective, the group and the ranks that had
//   not arrived.
//
// Point-to-point messages (send / recv / isend / irecv; pipeline stages):
// - Not collective: only the two ranks take part. Messages from one rank to another with the same
//   tag arrive in the order they were sent; a recv must give exactly the size of the send it
//   matches (a different size is an error naming the peer, tag and sizes where the backend can
//   tell: MPI, local). Size 0 is a message too (it must be received). Tags are 0..32767; the
//   NCCL backend ignores them (its messages between two ranks match in posting order).
// - Blocking send() may wait until the peer posts its receive (MPI's rules: a ring of blocking
//   sends can deadlock); exchanges in both directions at once use isend/irecv, posted before
//   waiting on either (1F1B: isend to the next stage and irecv from the previous one, then wait).
// - Sending to yourself: MPI and local groups copy (the message waits in a mailbox until its
//   recv); NCCL groups refuse it.
// - Counted as "send" (bytes sent) and "recv" (bytes received) in the group's counters (not
//   messages to itself: nothing crosses a link). They do not advance the collectives' numbering
//   (so collectives keep the same #N on every rank of the group).
// - Watched like collectives: a send or recv outstanding longer than the watchdog's timeout stops
//   every rank with a message naming the operation, its number between the two ranks, the group
//   and the peer rank (group and world), and what the peer is doing.
#pragma once

#include <cstddef>
#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "comm/watchdog.h"
#include "common/status.h"

namespace kiln::comm {

enum class ReduceOp { kSum, kMin, kMax };
enum class DType { kInt32, kInt64, kUInt64, kFloat32, kFloat64 };

size_t dtype_size(DType t);
const char* dtype_name(DType t);

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<int32_t>() { return DType::kInt32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kInt64; }
template <> constexpr DType dtype_of<uint64_t>() { return DType::kUInt64; }
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }

// Calls and bytes (see the header comment) of one collective.
struct CollectiveCount {
  uint64_t calls = 0;
  uint64_t bytes = 0;
};
// By collective name: "all_reduce", "all_gather", "reduce_scatter", "broadcast", "barrier",
// "gather", "all_to_all"; point-to-point: "send", "recv".
using CommCounters = std::map<std::string, CollectiveCount>;

// An asynchronous collective in flight.
class Work {
 public:
  virtual ~Work() = default;
  // Blocks until the collective completed on this rank; the first error, if any. Idempotent.
  virtual Status wait() = 0;
  // Progresses without blocking; true once complete (then wait() returns at once).
  virtual bool test() = 0;
};
// A handle that is already complete with `status`.
std::unique_ptr<Work> completed_work(Status status);

class ProcessGroup;
namespace detail {
struct GroupWatch;
uint64_t watch_begin_p2p(ProcessGroup& g, const char* op, int peer, uint64_t seq);
}  // namespace detail

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local", "mpi" or "nccl".
  virtual const char* backend() const = 0;
  // What the group is for ("world", "dp", "tp", ...): names it in counters and messages.
  const std::string& name() const { return name_; }
  void set_name(std::string name) { name_ = std::move(name); }

  Status barrier();
  // root's `bytes` bytes at `data` are copied to every rank's `data`.
  Status bcast(void* data, size_t bytes, int root);
  // Every rank sends `bytes`; `recv` (size() * bytes) receives them in rank order. send may be
  // recv + rank() * bytes (in place).
  Status allgather(const void* send, size_t bytes, void* recv);
  // Variable-size allgather: recv_bytes[r] bytes from rank r land at offset sum(recv_bytes[<r]).
  // recv_bytes (size() entries) must be known (see the typed allgatherv() below).
  Status allgatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes);
  // Variable-size gather to `root`: like allgatherv, but only root's recv is written (other ranks
  // may pass recv = nullptr). recv_bytes must be the same on every rank.
  Status gatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes,
                 int root);
  // Every rank sends bytes_per_rank bytes to each rank: send and recv hold size() blocks.
  Status alltoall(const void* send, size_t bytes_per_rank, void* recv);
  // send holds size() consecutive blocks (send_bytes[r] bytes for rank r); recv receives
  // recv_bytes[r] bytes from rank r, consecutively in rank order.
  Status alltoallv(const void* send, const size_t* send_bytes, void* recv,
                   const size_t* recv_bytes);
  // Element-wise reduction in place over `count` elements of `dtype`; every rank gets the result.
  Status allreduce(void* data, size_t count, DType dtype, ReduceOp op);
  // send holds size() blocks of recv_count elements; rank r receives the reduction of every
  // rank's block r. recv must not overlap send.
  Status reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                        ReduceOp op);

  // Asynchronous forms (see the header comment).
  std::unique_ptr<Work> iallreduce(void* data, size_t count, DType dtype, ReduceOp op);
  std::unique_ptr<Work> iallgather(const void* send, size_t bytes, void* recv);
  std::unique_ptr<Work> ireduce_scatter(const void* send, void* recv, size_t recv_count,
                                        DType dtype, ReduceOp op);
  std::unique_ptr<Work> ibcast(void* data, size_t bytes, int root);
  std::unique_ptr<Work> ibarrier();

  // Point-to-point (see the header comment): `bytes` bytes to / from group rank `peer`. The
  // buffers belong to the operation until it completes (blocking: on return; i*(): wait()).
  // An invalid peer or tag is Status::internal naming it.
  Status send(const void* data, size_t bytes, int peer, int tag = 0);
  Status recv(void* data, size_t bytes, int peer, int tag = 0);
  std::unique_ptr<Work> isend(const void* data, size_t bytes, int peer, int tag = 0);
  std::unique_ptr<Work> irecv(void* data, size_t bytes, int peer, int tag = 0);

  // Ranks with the same color form a new group, ordered by (key, old rank), named `name`.
  Result<std::unique_ptr<ProcessGroup>> split(int color, int key, std::string name = "");
  // Ends every process of the group at once with `code` (use when ranks can no longer agree).
  [[noreturn]] virtual void abort(int code) = 0;
  // Aborts the group's communicator so that calls blocked in it can return (NCCL:
  // ncclCommAbort); the group is unusable afterwards. For the watchdog, from its thread; the
  // MPI and local backends do nothing (MPI_Abort on the world ends them).
  virtual void cancel() {}
  // The watchdog threads' channel (comm/watchdog.h), opened on the world group: nullptr when the
  // backend has none (one process; MPI without MPI_THREAD_MULTIPLE). Collective.
  virtual Result<std::unique_ptr<detail::WatchdogLink>> open_watchdog_link() {
    return std::unique_ptr<detail::WatchdogLink>();
  }

  // This group's members as world ranks, in group-rank order (empty when unknown).
  const std::vector<int>& world_ranks() const { return world_ranks_; }
  void set_world_ranks(std::vector<int> ranks) { world_ranks_ = std::move(ranks); }

  const CommCounters& counters() const { return counters_; }
  void reset_counters() { counters_.clear(); }

 protected:
  virtual Status do_barrier() = 0;
  virtual Status do_bcast(void* data, size_t bytes, int root) = 0;
  virtual Status do_allgatherv(const void* send, size_t send_bytes, void* recv,
                               const size_t* recv_bytes) = 0;
  virtual Status do_gatherv(const void* send, size_t send_bytes, void* recv,
                            const size_t* recv_bytes, int root) = 0;
  virtual Status do_alltoallv(const void* send, const size_t* send_bytes, void* recv,
                              const size_t* recv_bytes) = 0;
  virtual Status do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  virtual Status do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                   ReduceOp op) = 0;
  virtual Result<std::unique_ptr<ProcessGroup>> do_split(int color, int key) = 0;
  // Asynchronous forms; the defaults run the blocking call and return a completed handle.
  virtual std::unique_ptr<Work> do_iallreduce(void* data, size_t count, DType dtype, ReduceOp op);
  virtual std::unique_ptr<Work> do_iallgather(const void* send, size_t bytes, void* recv);
  virtual std::unique_ptr<Work> do_ireduce_scatter(const void* send, void* recv,
                                                   size_t recv_count, DType dtype, ReduceOp op);
  virtual std::unique_ptr<Work> do_ibcast(void* data, size_t bytes, int root);
  virtual std::unique_ptr<Work> do_ibarrier();
  // Point-to-point (peer and tag checked; peer may be rank()). The defaults say the backend has
  // none; blocking send / recv are isend / irecv and wait().
  virtual std::unique_ptr<Work> do_isend(const void* data, size_t bytes, int peer, int tag);
  virtual std::unique_ptr<Work> do_irecv(void* data, size_t bytes, int peer, int tag);

  // Messages to itself for host-memory backends: a copy waits in a mailbox (per tag, in order)
  // until a recv takes it; a recv posted first completes when the send comes (its wait() before
  // that is an error: only this thread could send it).
  std::unique_ptr<Work> self_isend(const void* data, size_t bytes, int tag);
  std::unique_ptr<Work> self_irecv(void* data, size_t bytes, int tag);

  void count(const char* collective, uint64_t bytes);
  // "send to rank 1 (tag 0) on group pp": for messages.
  std::string fmt_p2p(const char* op, int peer, int tag) const;

 private:
  friend uint64_t detail::watch_begin(ProcessGroup& g, const char* collective, uint64_t seq);
  friend uint64_t detail::watch_begin_p2p(ProcessGroup& g, const char* op, int peer, uint64_t seq);
  // The collective's watch: begin() on construction, end() on destruction (blocking calls).
  class Watch;
  // A recv from itself, complete once the mailbox holds its message.
  class SelfRecv;
  // Counts the collective (its number on this group) and starts watching it.
  uint64_t begin(const char* collective);
  // An asynchronous collective's handle, watched until it completes.
  std::unique_ptr<Work> watched(uint64_t id, std::unique_ptr<Work> work);

  std::string name_ = "group";
  CommCounters counters_;
  std::vector<int> world_ranks_;
  // Starts watching a point-to-point operation (its number between this rank and the peer).
  uint64_t begin_p2p(const char* op, int peer);
  Status check_p2p(const char* op, int peer, int tag) const;

  uint64_t seq_ = 0;                          // collectives started on this group
  std::map<int, uint64_t> sends_to_, recvs_from_;           // point-to-point started, by peer
  std::map<int, std::vector<std::vector<char>>> self_box_;  // messages to itself, by tag
  detail::GroupWatch* watch_ = nullptr;       // the watchdog's record of this group (not owned)
};

// The world group (created on first use; MPI is initialised then and finalised at exit).
ProcessGroup& world();
// A group of one process (always the local backend).
std::unique_ptr<ProcessGroup> make_local_group();
// True when the environment shows an MPI launcher (mpirun / srun with PMI).
bool launched_by_mpi();
// This process's rank and the world size as an MPI launcher set them in the environment
// (Open MPI, PMIx, MPICH/PMI, MVAPICH, Slurm's srun): the first launcher whose rank and size
// variables are both set with 0 <= rank < size; {0, 1, ""} when there is none. Read without
// initialising MPI (tools that only need to know their part, like `kiln stream`).
struct LaunchEnv {
  int rank = 0;
  int world = 1;
  std::string world_var;  // the variable the world size came from, e.g. "OMPI_COMM_WORLD_SIZE"
};
LaunchEnv launch_env();
// The world size the launcher announces: launch_env().world (1 when not launched).
int launcher_world_size();
// True when this binary has the MPI backend.
bool mpi_available();

// Element-wise reduction of `count` elements: acc[i] = op(acc[i], in[i]) (host memory).
void reduce_into(void* acc, const void* in, size_t count, DType dtype, ReduceOp op);

// ---- typed helpers ---------------------------------------------------------------------------

template <typename T>
Status allreduce(ProcessGroup& g, T* data, size_t count, ReduceOp op) {
  return g.allreduce(data, count, dtype_of<T>(), op);
}

template <typename T>
Result<T> allreduce_value(ProcessGroup& g, T value, ReduceOp op) {
  KILN_RETURN_IF_ERROR(g.allreduce(&value, 1, dtype_of<T>(), op));
  return value;
}

// Concatenation of every rank's `mine` in rank order; counts (optional) gets each rank's count.
template <typename T>
Result<std::vector<T>> allgatherv(ProcessGroup& g, const std::vector<T>& mine,
                                  std::vector<size_t>* counts = nullptr) {
  static_assert(std::is_trivially_copyable_v<T>);
  std::vector<uint64_t> sizes(g.size());
  uint64_t my_bytes = mine.size() * sizeof(T);
  KILN_RETURN_IF_ERROR(g.allgather(&my_bytes, sizeof(my_bytes), sizes.data()));
  std::vector<size_t> bytes(sizes.begin(), sizes.end());
  size_t total = 0;
  for (size_t b : bytes) total += b;
  std::vector<T> out(total / sizeof(T));
  KILN_RETURN_IF_ERROR(g.allgatherv(mine.data(), my_bytes, out.data(), bytes.data()));
  if (counts) {
    counts->clear();
    for (size_t b : bytes) counts->push_back(b / sizeof(T));
  }
  return out;
}

// Byte strings: every rank's blob in rank order.
Result<std::vector<std::string>> allgather_strings(ProcessGroup& g, const std::string& mine);
// How many ranks of g run on this machine (by host name), e.g. to share its memory: a collective,
// every rank of g calls it. 1 for a group of one; g.size() if the names cannot be gathered.
int ranks_on_this_host(ProcessGroup& g);
// Byte strings gathered on root only (other ranks get an empty vector).
Result<std::vector<std::string>> gather_strings(ProcessGroup& g, const std::string& mine, int root);

// per_dest[r] goes to rank r; the result is what every rank sent here, in rank order
// (counts, optional, gets the number of elements from each rank).
template <typename T>
Result<std::vector<T>> alltoallv(ProcessGroup& g, const std::vector<std::vector<T>>& per_dest,
                                 std::vector<size_t>* counts = nullptr) {
  static_assert(std::is_trivially_copyable_v<T>);
  const int n = g.size();
  if (static_cast<int>(per_dest.size()) != n)
    return Status::internal("alltoallv: per_dest has " + std::to_string(per_dest.size()) +
                            " entries for " + std::to_string(n) + " ranks");
  std::vector<uint64_t> send_sizes(n), recv_sizes(n);
  size_t send_total = 0;
  for (int r = 0; r < n; ++r) {
    send_sizes[r] = per_dest[r].size() * sizeof(T);
    send_total += send_sizes[r];
  }
  KILN_RETURN_IF_ERROR(g.alltoall(send_sizes.data(), sizeof(uint64_t), recv_sizes.data()));
  std::vector<T> send(send_total / sizeof(T));
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    std::copy(per_dest[r].begin(), per_dest[r].end(), send.begin() + at);
    at += per_dest[r].size();
  }
  std::vector<size_t> sb(send_sizes.begin(), send_sizes.end());
  std::vector<size_t> rb(recv_sizes.begin(), recv_sizes.end());
  size_t recv_total = 0;
  for (size_t b : rb) recv_total += b;
  std::vector<T> out(recv_total / sizeof(T));
  KILN_RETURN_IF_ERROR(g.alltoallv(send.data(), sb.data(), out.data(), rb.data()));
  if (counts) {
    counts->clear();
    for (size_t b : rb) counts->push_back(b / sizeof(T));
  }
  return out;
}

// Broadcasts a byte string from root (every rank's `blob` holds root's afterwards).
Status bcast_string(ProcessGroup& g, std::string* blob, int root);

// Agreement on failure: every rank passes its local status; if any rank failed, every rank gets
// an error (the failing rank its own, the others "rank R failed"). Use before collectives that
// must not run when a peer has already given up.
Status agree(ProcessGroup& g, Status local);

}  // namespace kiln::comm
