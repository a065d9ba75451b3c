// MPI backend of ProcessGroup (host memory). Built only when CMake finds MPI (KILN_HAVE_MPI).
#ifdef KILN_HAVE_MPI

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "comm/comm.h"

namespace kiln::comm {
namespace {

// Largest single MPI transfer we issue (bytes); larger ones are split.
constexpr size_t kMaxChunk = size_t{1} << 30;

Status mpi_status(int rc, const char* what) {
  if (rc == MPI_SUCCESS) return Status::ok();
  char text[MPI_MAX_ERROR_STRING];
  int len = 0;
  MPI_Error_string(rc, text, &len);
  return Status::internal(std::string("MPI ") + what + ": " + std::string(text, len));
}

MPI_Datatype mpi_type(DType t) {
  switch (t) {
    case DType::kInt32: return MPI_INT32_T;
    case DType::kInt64: return MPI_INT64_T;
    case DType::kUInt64: return MPI_UINT64_T;
    case DType::kFloat32: return MPI_FLOAT;
    case DType::kFloat64: return MPI_DOUBLE;
  }
  return MPI_DATATYPE_NULL;
}

// MPI's v-collectives take int counts and displacements; callers keep the total <= kMaxChunk.
struct IntLayout {
  std::vector<int> counts, displs;
};
IntLayout int_layout(const size_t* bytes, int n) {
  IntLayout l{std::vector<int>(n), std::vector<int>(n)};
  size_t at = 0;
  for (int r = 0; r < n; ++r) {
    l.counts[r] = static_cast<int>(bytes[r]);
    l.displs[r] = static_cast<int>(at);
    at += bytes[r];
  }
  return l;
}

size_t dtype_bytes(DType t) {
  return (t == DType::kInt32 || t == DType::kFloat32) ? 4 : 8;
}

MPI_Op mpi_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return MPI_SUM;
    case ReduceOp::kMin: return MPI_MIN;
    case ReduceOp::kMax: return MPI_MAX;
  }
  return MPI_OP_NULL;
}

void finalize_at_exit() {
  int initialized = 0, finalized = 0;
  MPI_Initialized(&initialized);
  MPI_Finalized(&finalized);
  if (initialized && !finalized) MPI_Finalize();
}

class MpiGroup final : public ProcessGroup {
 public:
  explicit MpiGroup(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
  }
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  Status barrier() override { return mpi_status(MPI_Barrier(comm_), "barrier"); }

  Status bcast(void* data, size_t bytes, int root) override {
    char* p = static_cast<char*>(data);
    for (size_t at = 0; at < bytes; at += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, bytes - at));
      KILN_RETURN_IF_ERROR(mpi_status(MPI_Bcast(p + at, n, MPI_BYTE, root, comm_), "bcast"));
    }
    return Status::ok();
  }

  Status allgather(const void* send, size_t bytes, void* recv) override {
    std::vector<size_t> counts(size_, bytes);
    return allgatherv(send, bytes, recv, counts.data());
  }

  Status allgatherv(const void* send, size_t send_bytes, void* recv,
                    const size_t* recv_bytes) override {
    size_t total = 0;
    for (int r = 0; r < size_; ++r) total += recv_bytes[r];
    char* out = static_cast<char*>(recv);
    if (total <= kMaxChunk) {
      auto [counts, displs] = int_layout(recv_bytes, size_);
      // MPI forbids aliasing send and recv buffers; copy our block first when they overlap.
      std::vector<char> tmp;
      const void* src = send;
      if (send_bytes && send == out + displs[rank_]) {
        tmp.assign(static_cast<const char*>(send), static_cast<const char*>(send) + send_bytes);
        src = tmp.data();
      }
      return mpi_status(MPI_Allgatherv(src, static_cast<int>(send_bytes), MPI_BYTE, out,
                                       counts.data(), displs.data(), MPI_BYTE, comm_),
                        "allgatherv");
    }
    // Large: each rank broadcasts its block in chunks.
    size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ && send_bytes) std::memmove(out + at, send, send_bytes);
      KILN_RETURN_IF_ERROR(bcast(out + at, recv_bytes[r], r));
      at += recv_bytes[r];
    }
    return Status::ok();
  }

  Status gatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes,
                 int root) override {
    size_t total = 0;
    for (int r = 0; r < size_; ++r) total += recv_bytes[r];
    char* out = static_cast<char*>(recv);
    if (total <= kMaxChunk) {
      auto [counts, displs] = int_layout(recv_bytes, size_);
      return mpi_status(MPI_Gatherv(send, static_cast<int>(send_bytes), MPI_BYTE, out,
                                    counts.data(), displs.data(), MPI_BYTE, root, comm_),
                        "gatherv");
    }
    // Large: point-to-point to root in chunks.
    std::vector<MPI_Request> reqs;
    if (rank_ == root) {
      size_t at = 0;
      for (int r = 0; r < size_; ++r) {
        int tag = 0;
        for (size_t off = 0; off < recv_bytes[r]; off += kMaxChunk, ++tag) {
          int n = static_cast<int>(std::min(kMaxChunk, recv_bytes[r] - off));
          if (r == rank_) {
            std::memmove(out + at + off, static_cast<const char*>(send) + off, n);
            continue;
          }
          reqs.emplace_back();
          KILN_RETURN_IF_ERROR(mpi_status(
              MPI_Irecv(out + at + off, n, MPI_BYTE, r, tag, comm_, &reqs.back()), "irecv"));
        }
        at += recv_bytes[r];
      }
    } else {
      int tag = 0;
      for (size_t off = 0; off < send_bytes; off += kMaxChunk, ++tag) {
        int n = static_cast<int>(std::min(kMaxChunk, send_bytes - off));
        reqs.emplace_back();
        KILN_RETURN_IF_ERROR(mpi_status(MPI_Isend(static_cast<const char*>(send) + off, n,
                                                  MPI_BYTE, root, tag, comm_, &reqs.back()),
                                        "isend"));
      }
    }
    return mpi_status(
        MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), MPI_STATUSES_IGNORE),
        "gatherv waitall");
  }

  Status alltoall(const void* send, size_t bytes_per_rank, void* recv) override {
    std::vector<size_t> counts(size_, bytes_per_rank);
    return alltoallv(send, counts.data(), recv, counts.data());
  }

  Status alltoallv(const void* send, const size_t* send_bytes, void* recv,
                   const size_t* recv_bytes) override {
    uint64_t local_max = 0, send_total = 0, recv_total = 0;
    for (int r = 0; r < size_; ++r) {
      send_total += send_bytes[r];
      recv_total += recv_bytes[r];
    }
    local_max = std::max(send_total, recv_total);
    uint64_t global_max = 0;
    KILN_RETURN_IF_ERROR(mpi_status(
        MPI_Allreduce(&local_max, &global_max, 1, MPI_UINT64_T, MPI_MAX, comm_), "alltoallv"));
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    if (global_max <= kMaxChunk) {
      const IntLayout sl = int_layout(send_bytes, size_), rl = int_layout(recv_bytes, size_);
      return mpi_status(MPI_Alltoallv(in, sl.counts.data(), sl.displs.data(), MPI_BYTE, out,
                                      rl.counts.data(), rl.displs.data(), MPI_BYTE, comm_),
                        "alltoallv");
    }
    // Large: point-to-point in chunks, all posted at once.
    std::vector<size_t> soff(size_ + 1, 0), roff(size_ + 1, 0);
    for (int r = 0; r < size_; ++r) {
      soff[r + 1] = soff[r] + send_bytes[r];
      roff[r + 1] = roff[r] + recv_bytes[r];
    }
    std::vector<MPI_Request> reqs;
    for (int r = 0; r < size_; ++r) {
      int tag = 0;
      for (size_t at = 0; at < recv_bytes[r]; at += kMaxChunk, ++tag) {
        int n = static_cast<int>(std::min(kMaxChunk, recv_bytes[r] - at));
        reqs.emplace_back();
        KILN_RETURN_IF_ERROR(mpi_status(
            MPI_Irecv(out + roff[r] + at, n, MPI_BYTE, r, tag, comm_, &reqs.back()), "irecv"));
      }
    }
    for (int r = 0; r < size_; ++r) {
      int tag = 0;
      for (size_t at = 0; at < send_bytes[r]; at += kMaxChunk, ++tag) {
        int n = static_cast<int>(std::min(kMaxChunk, send_bytes[r] - at));
        reqs.emplace_back();
        KILN_RETURN_IF_ERROR(mpi_status(
            MPI_Isend(in + soff[r] + at, n, MPI_BYTE, r, tag, comm_, &reqs.back()), "isend"));
      }
    }
    return mpi_status(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(),
                                  MPI_STATUSES_IGNORE),
                      "alltoallv waitall");
  }

  Status allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    const size_t elem = dtype_bytes(dtype);
    const size_t max_count = kMaxChunk / elem;
    char* p = static_cast<char*>(data);
    for (size_t at = 0; at < count; at += max_count) {
      int n = static_cast<int>(std::min(max_count, count - at));
      KILN_RETURN_IF_ERROR(mpi_status(
          MPI_Allreduce(MPI_IN_PLACE, p + at * elem, n, mpi_type(dtype), mpi_op(op), comm_),
          "allreduce"));
    }
    return Status::ok();
  }

  Result<std::unique_ptr<ProcessGroup>> split(int color, int key) override {
    MPI_Comm sub;
    KILN_RETURN_IF_ERROR(mpi_status(MPI_Comm_split(comm_, color, key, &sub), "comm_split"));
    return std::unique_ptr<ProcessGroup>(new MpiGroup(sub, true));
  }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::_Exit(code);
  }

 private:
  MPI_Comm comm_;
  bool owned_;
  int rank_ = 0;
  int size_ = 1;
};

}  // namespace

std::unique_ptr<ProcessGroup> make_mpi_world() {
  int initialized = 0;
  MPI_Initialized(&initialized);
  if (!initialized) {
    int provided = 0;
    MPI_Init_thread(nullptr, nullptr, MPI_THREAD_FUNNELED, &provided);
    std::atexit(finalize_at_exit);
  }
  return std::make_unique<MpiGroup>(MPI_COMM_WORLD, false);
}

}  // namespace kiln::comm

#endif  // KILN_HAVE_MPI
