// MPI backend of ProcessGroup (host memory). Built only when CMake finds MPI (KILN_HAVE_MPI).
#ifdef KILN_HAVE_MPI

#include <mpi.h>

#include <algorithm>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <functional>
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

// An MPI nonblocking collective, possibly followed by local work and a second collective
// (the deterministic reductions: all-to-all, local sum in rank order, all-gather).
class MpiWork final : public Work {
 public:
  using Next = std::function<Status(MpiWork&)>;
  ~MpiWork() override { (void)wait(); }

  Status wait() override {
    while (!done_) {
      if (req != MPI_REQUEST_NULL) {
        Status st = mpi_status(MPI_Wait(&req, MPI_STATUS_IGNORE), what);
        if (!st.is_ok()) return finish(std::move(st));
      }
      advance();
    }
    return status_;
  }
  bool test() override {
    while (!done_) {
      if (req != MPI_REQUEST_NULL) {
        int flag = 0;
        Status st = mpi_status(MPI_Test(&req, &flag, MPI_STATUS_IGNORE), what);
        if (!st.is_ok()) {
          (void)finish(std::move(st));
          return true;
        }
        if (!flag) return false;
      }
      advance();
    }
    return true;
  }
  // Starting a request: rc is the MPI call's result.
  Status started(int rc) {
    Status st = mpi_status(rc, what);
    if (!st.is_ok()) req = MPI_REQUEST_NULL;
    return st;
  }

  MPI_Request req = MPI_REQUEST_NULL;
  Next next;
  const char* what = "collective";
  std::vector<char> scratch;
  std::vector<int> counts_a, displs_a, counts_b, displs_b;

 private:
  void advance() {
    if (!next) {
      done_ = true;
      return;
    }
    Next f = std::move(next);
    next = nullptr;
    Status st = f(*this);
    if (!st.is_ok()) (void)finish(std::move(st));
  }
  Status finish(Status st) {
    status_ = std::move(st);
    done_ = true;
    next = nullptr;
    return status_;
  }
  Status status_;
  bool done_ = false;
};

// Element range [begin, end) of rank r's block when `count` elements are split over n ranks.
struct Blocks {
  size_t count, per;
  int n;
  Blocks(size_t c, int n_) : count(c), per((c + n_ - 1) / n_), n(n_) {}
  size_t begin(int r) const { return std::min(count, per * r); }
  size_t len(int r) const { return std::min(count, per * (r + 1)) - begin(r); }
};

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

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::_Exit(code);
  }

 protected:
  Status do_barrier() override { return mpi_status(MPI_Barrier(comm_), "barrier"); }

  Status do_bcast(void* data, size_t bytes, int root) override {
    char* p = static_cast<char*>(data);
    for (size_t at = 0; at < bytes; at += kMaxChunk) {
      int n = static_cast<int>(std::min(kMaxChunk, bytes - at));
      KILN_RETURN_IF_ERROR(mpi_status(MPI_Bcast(p + at, n, MPI_BYTE, root, comm_), "bcast"));
    }
    return Status::ok();
  }

  Status do_allgatherv(const void* send, size_t send_bytes, void* recv,
                       const size_t* recv_bytes) override {
    size_t total = 0;
    for (int r = 0; r < size_; ++r) total += recv_bytes[r];
    char* out = static_cast<char*>(recv);
    if (total <= kMaxChunk) {
      auto [counts, displs] = int_layout(recv_bytes, size_);
      // MPI forbids aliasing send and recv buffers: in place is MPI_IN_PLACE.
      const bool in_place = send_bytes && send == out + displs[rank_];
      return mpi_status(MPI_Allgatherv(in_place ? MPI_IN_PLACE : send,
                                       static_cast<int>(send_bytes), MPI_BYTE, out,
                                       counts.data(), displs.data(), MPI_BYTE, comm_),
                        "allgatherv");
    }
    // Large: each rank broadcasts its block in chunks.
    size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      if (r == rank_ && send_bytes && send != out + at) std::memmove(out + at, send, send_bytes);
      KILN_RETURN_IF_ERROR(do_bcast(out + at, recv_bytes[r], r));
      at += recv_bytes[r];
    }
    return Status::ok();
  }

  Status do_gatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes,
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

  Status do_alltoallv(const void* send, const size_t* send_bytes, void* recv,
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

  Status do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    if (size_ == 1 || count == 0) return Status::ok();
    const size_t elem = dtype_size(dtype);
    const size_t max_count = kMaxChunk / elem;
    char* p = static_cast<char*>(data);
    for (size_t at = 0; at < count; at += max_count) {
      const size_t n = std::min(max_count, count - at);
      if (deterministic(dtype, op)) {
        // Pieces of at most kMaxChunk bytes: MPI's int counts hold them.
        auto work = start_ordered_allreduce(p + at * elem, n, dtype, op);
        KILN_RETURN_IF_ERROR(work->wait());
      } else {
        KILN_RETURN_IF_ERROR(mpi_status(MPI_Allreduce(MPI_IN_PLACE, p + at * elem,
                                                      static_cast<int>(n), mpi_type(dtype),
                                                      mpi_op(op), comm_),
                                        "allreduce"));
      }
    }
    return Status::ok();
  }

  Status do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                           ReduceOp op) override {
    const size_t elem = dtype_size(dtype);
    if (size_ == 1) {
      if (recv_count) std::memmove(recv, send, recv_count * elem);
      return Status::ok();
    }
    const size_t piece = std::max<size_t>(1, kMaxChunk / (elem * size_));
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    std::vector<char> packed, gathered;
    for (size_t a = 0; a < recv_count; a += piece) {
      const size_t n = std::min(piece, recv_count - a);
      const size_t block = n * elem;
      const char* src = in;
      if (n != recv_count) {  // gather this piece of every block contiguously
        packed.resize(block * size_);
        for (int r = 0; r < size_; ++r)
          std::memcpy(packed.data() + r * block, in + (r * recv_count + a) * elem, block);
        src = packed.data();
      }
      gathered.resize(block * size_);
      KILN_RETURN_IF_ERROR(mpi_status(MPI_Alltoall(src, static_cast<int>(block), MPI_BYTE,
                                                   gathered.data(), static_cast<int>(block),
                                                   MPI_BYTE, comm_),
                                      "reduce_scatter"));
      sum_in_rank_order(out + a * elem, gathered.data(), n, dtype, op);
    }
    return Status::ok();
  }

  Result<std::unique_ptr<ProcessGroup>> do_split(int color, int key) override {
    MPI_Comm sub;
    KILN_RETURN_IF_ERROR(mpi_status(MPI_Comm_split(comm_, color, key, &sub), "comm_split"));
    return std::unique_ptr<ProcessGroup>(new MpiGroup(sub, true));
  }

  // ---- asynchronous ----
  std::unique_ptr<Work> do_iallreduce(void* data, size_t count, DType dtype,
                                      ReduceOp op) override {
    const size_t elem = dtype_size(dtype);
    if (size_ == 1 || count == 0) return completed_work(Status::ok());
    if (count * elem > kMaxChunk) return completed_work(do_allreduce(data, count, dtype, op));
    if (deterministic(dtype, op)) return start_ordered_allreduce(data, count, dtype, op);
    auto w = std::make_unique<MpiWork>();
    w->what = "iallreduce";
    Status st = w->started(MPI_Iallreduce(MPI_IN_PLACE, data, static_cast<int>(count),
                                          mpi_type(dtype), mpi_op(op), comm_, &w->req));
    if (!st.is_ok()) return completed_work(std::move(st));
    return w;
  }

  std::unique_ptr<Work> do_iallgather(const void* send, size_t bytes, void* recv) override {
    if (bytes * size_ > kMaxChunk) {
      std::vector<size_t> counts(size_, bytes);
      return completed_work(do_allgatherv(send, bytes, recv, counts.data()));
    }
    auto w = std::make_unique<MpiWork>();
    w->what = "iallgather";
    char* out = static_cast<char*>(recv);
    const bool in_place = bytes && send == out + bytes * rank_;
    Status st = w->started(MPI_Iallgather(in_place ? MPI_IN_PLACE : send, static_cast<int>(bytes),
                                          MPI_BYTE, out, static_cast<int>(bytes), MPI_BYTE, comm_,
                                          &w->req));
    if (!st.is_ok()) return completed_work(std::move(st));
    return w;
  }

  std::unique_ptr<Work> do_ireduce_scatter(const void* send, void* recv, size_t recv_count,
                                           DType dtype, ReduceOp op) override {
    const size_t elem = dtype_size(dtype);
    const size_t block = recv_count * elem;
    if (size_ == 1 || block * size_ > kMaxChunk)
      return completed_work(do_reduce_scatter(send, recv, recv_count, dtype, op));
    auto w = std::make_unique<MpiWork>();
    w->what = "ireduce_scatter";
    w->scratch.resize(block * size_);
    Status st = w->started(MPI_Ialltoall(send, static_cast<int>(block), MPI_BYTE,
                                         w->scratch.data(), static_cast<int>(block), MPI_BYTE,
                                         comm_, &w->req));
    if (!st.is_ok()) return completed_work(std::move(st));
    const int n = size_;
    w->next = [recv, recv_count, dtype, op, n](MpiWork& self) {
      sum_in_rank_order(static_cast<char*>(recv), self.scratch.data(), recv_count, dtype, op, n);
      return Status::ok();
    };
    return w;
  }

  std::unique_ptr<Work> do_ibcast(void* data, size_t bytes, int root) override {
    if (bytes > kMaxChunk) return completed_work(do_bcast(data, bytes, root));
    auto w = std::make_unique<MpiWork>();
    w->what = "ibcast";
    Status st = w->started(
        MPI_Ibcast(data, static_cast<int>(bytes), MPI_BYTE, root, comm_, &w->req));
    if (!st.is_ok()) return completed_work(std::move(st));
    return w;
  }

  std::unique_ptr<Work> do_ibarrier() override {
    auto w = std::make_unique<MpiWork>();
    w->what = "ibarrier";
    Status st = w->started(MPI_Ibarrier(comm_, &w->req));
    if (!st.is_ok()) return completed_work(std::move(st));
    return w;
  }

 private:
  static bool deterministic(DType dtype, ReduceOp op) {
    return op == ReduceOp::kSum && (dtype == DType::kFloat32 || dtype == DType::kFloat64);
  }

  // out[i] = op over ranks r = 0, 1, ... of blocks[r][i] (blocks: n consecutive blocks of count).
  static void sum_in_rank_order(char* out, const char* blocks, size_t count, DType dtype,
                                ReduceOp op, int n) {
    const size_t bytes = count * dtype_size(dtype);
    if (bytes == 0) return;
    std::memcpy(out, blocks, bytes);
    for (int r = 1; r < n; ++r) reduce_into(out, blocks + r * bytes, count, dtype, op);
  }
  void sum_in_rank_order(char* out, const char* blocks, size_t count, DType dtype,
                         ReduceOp op) const {
    sum_in_rank_order(out, blocks, count, dtype, op, size_);
  }

  // Floating-point sums in a fixed order: each rank reduces its block of the buffer from every
  // rank's copy in rank order (an all-to-all), then the blocks are all-gathered in place. The
  // same volume as a ring all-reduce; count * elem <= kMaxChunk.
  std::unique_ptr<Work> start_ordered_allreduce(void* data, size_t count, DType dtype,
                                                ReduceOp op) {
    const size_t elem = dtype_size(dtype);
    const int n = size_;
    const Blocks b(count, n);
    auto w = std::make_unique<MpiWork>();
    w->what = "allreduce";
    w->counts_a.resize(n);
    w->displs_a.resize(n);
    w->counts_b.resize(n);
    w->displs_b.resize(n);
    const size_t mine = b.len(rank_);
    for (int r = 0; r < n; ++r) {
      w->counts_a[r] = static_cast<int>(b.len(r) * elem);   // what I send to r (its block)
      w->displs_a[r] = static_cast<int>(b.begin(r) * elem);
      w->counts_b[r] = static_cast<int>(mine * elem);       // what r sends me (my block)
      w->displs_b[r] = static_cast<int>(r * mine * elem);
    }
    w->scratch.resize(std::max<size_t>(1, mine * elem * n));
    Status st = w->started(MPI_Ialltoallv(data, w->counts_a.data(), w->displs_a.data(), MPI_BYTE,
                                          w->scratch.data(), w->counts_b.data(),
                                          w->displs_b.data(), MPI_BYTE, comm_, &w->req));
    if (!st.is_ok()) return completed_work(std::move(st));
    char* base = static_cast<char*>(data);
    const int me = rank_;
    MPI_Comm comm = comm_;
    w->next = [base, mine, elem, dtype, op, n, me, comm, b](MpiWork& self) {
      sum_in_rank_order(base + b.begin(me) * elem, self.scratch.data(), mine, dtype, op, n);
      // The all-gather reuses the send layout: rank r's block at its offset.
      return self.started(MPI_Iallgatherv(MPI_IN_PLACE, 0, MPI_BYTE, base, self.counts_a.data(),
                                          self.displs_a.data(), MPI_BYTE, comm, &self.req));
    };
    return w;
  }

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
