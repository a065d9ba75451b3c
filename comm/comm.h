// Process groups and collectives on host memory.
//
// A ProcessGroup is a set of ranks 0..size()-1 that take part in collectives together. The world
// group comes from world(): under `mpirun` (detected from the launcher's environment) it is the
// MPI backend (comm/mpi_group.cc, built when CMake finds MPI: KILN_HAVE_MPI); otherwise it is the
// single-process backend, where every collective is a local copy. split() derives sub-groups
// (data-parallel, tensor-parallel) the way MPI_Comm_split does.
//
// Contract shared by every backend:
// - Collectives are blocking and must be called by every rank of the group in the same order
//   with matching arguments (same root, same element counts where they must match). A mismatch
//   is a program bug (MPI reports it or hangs); it is not detected here.
// - Byte counts are size_t; the MPI backend splits transfers larger than MPI's int limits.
// - Only one thread per process calls into a group at a time (MPI_THREAD_FUNNELED semantics:
//   the thread that first called world()).
// - Failures (an MPI error code) come back as Status::internal naming the collective.
// Device-memory collectives (NCCL) will live beside this header with the same shapes.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>
#include <type_traits>
#include <vector>

#include "common/status.h"

namespace kiln::comm {

enum class ReduceOp { kSum, kMin, kMax };
enum class DType { kInt32, kInt64, kUInt64, kFloat32, kFloat64 };

template <typename T>
constexpr DType dtype_of();
template <> constexpr DType dtype_of<int32_t>() { return DType::kInt32; }
template <> constexpr DType dtype_of<int64_t>() { return DType::kInt64; }
template <> constexpr DType dtype_of<uint64_t>() { return DType::kUInt64; }
template <> constexpr DType dtype_of<float>() { return DType::kFloat32; }
template <> constexpr DType dtype_of<double>() { return DType::kFloat64; }

class ProcessGroup {
 public:
  virtual ~ProcessGroup() = default;

  virtual int rank() const = 0;
  virtual int size() const = 0;
  // "local" or "mpi".
  virtual const char* backend() const = 0;

  virtual Status barrier() = 0;
  // root's `bytes` bytes at `data` are copied to every rank's `data`.
  virtual Status bcast(void* data, size_t bytes, int root) = 0;
  // Every rank sends `bytes`; `recv` (size() * bytes) receives them in rank order.
  virtual Status allgather(const void* send, size_t bytes, void* recv) = 0;
  // Variable-size allgather: recv_bytes[r] bytes from rank r land at offset sum(recv_bytes[<r]).
  // recv_bytes (size() entries) must be known (see the typed allgatherv() below).
  virtual Status allgatherv(const void* send, size_t send_bytes, void* recv,
                            const size_t* recv_bytes) = 0;
  // Variable-size gather to `root`: like allgatherv, but only root's recv is written (other ranks
  // may pass recv = nullptr). recv_bytes must be the same on every rank.
  virtual Status gatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes,
                         int root) = 0;
  // Every rank sends bytes_per_rank bytes to each rank: send and recv hold size() blocks.
  virtual Status alltoall(const void* send, size_t bytes_per_rank, void* recv) = 0;
  // send holds size() consecutive blocks (send_bytes[r] bytes for rank r); recv receives
  // recv_bytes[r] bytes from rank r, consecutively in rank order.
  virtual Status alltoallv(const void* send, const size_t* send_bytes, void* recv,
                           const size_t* recv_bytes) = 0;
  // Element-wise reduction in place over `count` elements of `dtype`; every rank gets the result.
  virtual Status allreduce(void* data, size_t count, DType dtype, ReduceOp op) = 0;
  // Ranks with the same color form a new group, ordered by (key, old rank).
  virtual Result<std::unique_ptr<ProcessGroup>> split(int color, int key) = 0;
  // Ends every process of the group at once with `code` (use when ranks can no longer agree).
  [[noreturn]] virtual void abort(int code) = 0;
};

// The world group (created on first use; MPI is initialised then and finalised at exit).
ProcessGroup& world();
// A group of one process (always the local backend).
std::unique_ptr<ProcessGroup> make_local_group();
// True when the environment shows an MPI launcher (mpirun / srun with PMI).
bool launched_by_mpi();
// True when this binary has the MPI backend.
bool mpi_available();

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
