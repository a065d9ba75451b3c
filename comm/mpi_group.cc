// MPI backend of ProcessGroup (host memory). Built only when CMake finds MPI (KILN_HAVE_MPI).
#ifdef KILN_HAVE_MPI

#include <mpi.h>

#include <algorithm>
#include <chrono>
#include <climits>
#include <cstdlib>
#include <cstring>
#include <deque>
#include <functional>
#include <numeric>
#include <string>
#include <thread>
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

// A point-to-point message: one request per chunk of at most kMaxChunk bytes (the same split on
// both sides, so chunk i matches chunk i: MPI keeps messages of one source and tag in order).
class P2pWork final : public Work {
 public:
  ~P2pWork() override { (void)wait(); }
  Status wait() override {
    if (!done_)
      finish(MPI_Waitall(static_cast<int>(reqs.size()), reqs.data(), statuses_for_wait()));
    return status_;
  }
  bool test() override {
    if (done_) return true;
    int flag = 0;
    const int rc =
        MPI_Testall(static_cast<int>(reqs.size()), reqs.data(), &flag, statuses_for_wait());
    if (rc != MPI_SUCCESS || flag) finish(rc);
    return done_;
  }

  std::vector<MPI_Request> reqs;
  std::vector<size_t> expect;  // recv: each chunk's size (checked against what arrived)
  std::string what;            // "recv from rank 1 (tag 0) on group pp"

 private:
  MPI_Status* statuses_for_wait() {
    statuses_.resize(reqs.size());
    return statuses_.data();
  }
  void finish(int rc) {
    done_ = true;
    if (rc != MPI_SUCCESS) {
      // MPI_ERR_IN_STATUS: the failing request's own code.
      if (rc == MPI_ERR_IN_STATUS)
        for (const MPI_Status& st : statuses_)
          if (st.MPI_ERROR != MPI_SUCCESS && st.MPI_ERROR != MPI_ERR_PENDING) rc = st.MPI_ERROR;
      status_ = mpi_status(rc, what.c_str());
      return;
    }
    for (size_t i = 0; i < expect.size(); ++i) {
      int got = 0;
      MPI_Get_count(&statuses_[i], MPI_BYTE, &got);
      if (static_cast<size_t>(got) != expect[i]) {
        status_ = Status::internal("MPI " + what + ": received " + std::to_string(got) +
                                   " bytes where " + std::to_string(expect[i]) +
                                   " were expected (the send and the recv differ in size)");
        return;
      }
    }
  }
  std::vector<MPI_Status> statuses_;
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

// The watchdog threads' channel (comm/watchdog.h): a duplicate of the world communicator, used
// only by the watchdog thread of each process (MPI_THREAD_MULTIPLE). A question is a group key;
// the answer goes back to the asker with another tag.
class MpiWatchdogLink final : public detail::WatchdogLink {
 public:
  explicit MpiWatchdogLink(MPI_Comm comm) : comm_(comm) { post(); }
  ~MpiWatchdogLink() override {
    if (req_ != MPI_REQUEST_NULL) {
      MPI_Cancel(&req_);
      MPI_Wait(&req_, MPI_STATUS_IGNORE);
    }
    reap(true);
    MPI_Comm_free(&comm_);
  }

  void serve(const std::function<std::string(const std::string&)>& answer) override {
    reap(false);
    for (;;) {
      int flag = 0;
      MPI_Status st;
      if (req_ == MPI_REQUEST_NULL || MPI_Test(&req_, &flag, &st) != MPI_SUCCESS || !flag) return;
      int n = 0;
      MPI_Get_count(&st, MPI_CHAR, &n);
      Send& s = sends_.emplace_back();
      s.text = answer(std::string(question_, std::max(0, n)));
      if (s.text.size() > kMax) s.text.resize(kMax);
      if (MPI_Isend(s.text.data(), static_cast<int>(s.text.size()), MPI_CHAR, st.MPI_SOURCE,
                    kAnswer, comm_, &s.req) != MPI_SUCCESS)
        s.req = MPI_REQUEST_NULL;
      post();
    }
  }

  std::vector<std::optional<std::string>> ask(
      const std::vector<int>& ranks, const std::string& question, double grace_s,
      const std::function<std::string(const std::string&)>& answer) override {
    const size_t n = ranks.size();
    asked_ = question.substr(0, kMax);
    std::vector<MPI_Request> recv(n, MPI_REQUEST_NULL);
    std::vector<std::vector<char>> bufs(n, std::vector<char>(kMax));
    std::vector<std::optional<std::string>> out(n);
    for (size_t i = 0; i < n; ++i) {
      MPI_Irecv(bufs[i].data(), static_cast<int>(kMax), MPI_CHAR, ranks[i], kAnswer, comm_,
                &recv[i]);
      Send& s = sends_.emplace_back();
      if (MPI_Isend(asked_.data(), static_cast<int>(asked_.size()), MPI_CHAR, ranks[i], kAsk,
                    comm_, &s.req) != MPI_SUCCESS)
        s.req = MPI_REQUEST_NULL;
    }
    const auto deadline = std::chrono::steady_clock::now() + std::chrono::duration<double>(grace_s);
    size_t pending = n;
    while (pending > 0 && std::chrono::steady_clock::now() < deadline) {
      for (size_t i = 0; i < n; ++i) {
        if (recv[i] == MPI_REQUEST_NULL) continue;
        int flag = 0;
        MPI_Status st;
        if (MPI_Test(&recv[i], &flag, &st) != MPI_SUCCESS) {
          recv[i] = MPI_REQUEST_NULL;
          --pending;
          continue;
        }
        if (!flag) continue;
        int got = 0;
        MPI_Get_count(&st, MPI_CHAR, &got);
        out[i] = std::string(bufs[i].data(), std::max(0, got));
        --pending;
      }
      serve(answer);  // ranks asking this one meanwhile
      if (pending > 0) std::this_thread::sleep_for(std::chrono::milliseconds(5));
    }
    for (MPI_Request& q : recv) {
      if (q == MPI_REQUEST_NULL) continue;
      MPI_Cancel(&q);
      MPI_Wait(&q, MPI_STATUS_IGNORE);
    }
    return out;
  }

 private:
  static constexpr int kAsk = 1, kAnswer = 2;
  static constexpr size_t kMax = 4096;
  struct Send {
    std::string text;
    MPI_Request req = MPI_REQUEST_NULL;
  };
  void post() {
    if (MPI_Irecv(question_, static_cast<int>(kMax), MPI_CHAR, MPI_ANY_SOURCE, kAsk, comm_,
                  &req_) != MPI_SUCCESS)
      req_ = MPI_REQUEST_NULL;
  }
  // Drops the sends that completed (all: also those that did not, whose buffers are then leaked
  // rather than freed under MPI).
  void reap(bool all) {
    while (!sends_.empty()) {
      Send& s = sends_.front();
      int flag = 1;
      if (s.req != MPI_REQUEST_NULL) MPI_Test(&s.req, &flag, MPI_STATUS_IGNORE);
      if (!flag) {
        if (!all) return;
        MPI_Request_free(&s.req);
        new std::string(std::move(s.text));  // leaked on purpose: MPI may still read it
      }
      sends_.pop_front();
    }
  }

  MPI_Comm comm_;
  MPI_Request req_ = MPI_REQUEST_NULL;
  char question_[kMax];
  std::string asked_;
  std::deque<Send> sends_;
};

class MpiGroup final : public ProcessGroup {
 public:
  explicit MpiGroup(MPI_Comm comm, bool owned) : comm_(comm), owned_(owned) {
    MPI_Comm_rank(comm_, &rank_);
    MPI_Comm_size(comm_, &size_);
    MPI_Comm_set_errhandler(comm_, MPI_ERRORS_RETURN);
    // Point-to-point messages travel on a communicator of their own (collective, like the
    // group's creation): the large collectives' own sends and receives (tags 0, 1, ...) can never
    // match a user's message.
    MPI_Comm_dup(comm_, &p2p_);
    MPI_Comm_set_errhandler(p2p_, MPI_ERRORS_RETURN);
    // The members' world ranks (a local translation, no communication): the watchdog's messages.
    MPI_Group mine, all;
    MPI_Comm_group(comm_, &mine);
    MPI_Comm_group(MPI_COMM_WORLD, &all);
    std::vector<int> in(size_), out(size_, -1);
    std::iota(in.begin(), in.end(), 0);
    MPI_Group_translate_ranks(mine, size_, in.data(), all, out.data());
    MPI_Group_free(&mine);
    MPI_Group_free(&all);
    set_world_ranks(std::move(out));
  }
  ~MpiGroup() override {
    int finalized = 0;
    MPI_Finalized(&finalized);
    if (!finalized) MPI_Comm_free(&p2p_);
    if (owned_ && !finalized) MPI_Comm_free(&comm_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "mpi"; }

  [[noreturn]] void abort(int code) override {
    MPI_Abort(comm_, code);
    std::_Exit(code);
  }

  Result<std::unique_ptr<detail::WatchdogLink>> open_watchdog_link() override {
    // Every rank decides alike: the watchdog thread may use MPI only if every rank allows it.
    int level = MPI_THREAD_SINGLE, lowest = MPI_THREAD_SINGLE;
    MPI_Query_thread(&level);
    KILN_RETURN_IF_ERROR(mpi_status(
        MPI_Allreduce(&level, &lowest, 1, MPI_INT, MPI_MIN, comm_), "watchdog thread level"));
    if (lowest < MPI_THREAD_MULTIPLE) return std::unique_ptr<detail::WatchdogLink>();
    MPI_Comm dup = MPI_COMM_NULL;
    KILN_RETURN_IF_ERROR(mpi_status(MPI_Comm_dup(comm_, &dup), "watchdog comm_dup"));
    MPI_Comm_set_errhandler(dup, MPI_ERRORS_RETURN);
    return std::unique_ptr<detail::WatchdogLink>(new MpiWatchdogLink(dup));
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

  // ---- point-to-point ----
  std::unique_ptr<Work> do_isend(const void* data, size_t bytes, int peer, int tag) override {
    if (peer == rank_) return self_isend(data, bytes, tag);
    auto w = std::make_unique<P2pWork>();
    w->what = fmt_p2p("send", peer, tag);
    const char* p = static_cast<const char*>(data);
    size_t at = 0;
    do {  // (a message of 0 bytes is one empty chunk: it must still be matched)
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - at));
      MPI_Request& req = w->reqs.emplace_back(MPI_REQUEST_NULL);
      Status st =
          mpi_status(MPI_Isend(p + at, n, MPI_BYTE, peer, tag, p2p_, &req), w->what.c_str());
      if (!st.is_ok()) {
        w->reqs.pop_back();
        (void)w->wait();  // the chunks already posted
        return completed_work(std::move(st));
      }
      at += n;
    } while (at < bytes);
    return w;
  }

  std::unique_ptr<Work> do_irecv(void* data, size_t bytes, int peer, int tag) override {
    if (peer == rank_) return self_irecv(data, bytes, tag);
    auto w = std::make_unique<P2pWork>();
    w->what = fmt_p2p("recv", peer, tag);
    char* p = static_cast<char*>(data);
    size_t at = 0;
    do {
      const int n = static_cast<int>(std::min(kMaxChunk, bytes - at));
      MPI_Request& req = w->reqs.emplace_back(MPI_REQUEST_NULL);
      Status st =
          mpi_status(MPI_Irecv(p + at, n, MPI_BYTE, peer, tag, p2p_, &req), w->what.c_str());
      if (!st.is_ok()) {
        w->reqs.pop_back();
        w->expect.clear();
        for (MPI_Request& q : w->reqs) {
          MPI_Cancel(&q);
          MPI_Wait(&q, MPI_STATUS_IGNORE);
        }
        w->reqs.clear();
        return completed_work(std::move(st));
      }
      w->expect.push_back(n);
      at += n;
    } while (at < bytes);
    return w;
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
  MPI_Comm p2p_ = MPI_COMM_NULL;  // point-to-point messages (a duplicate of comm_)
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
    // MPI_THREAD_MULTIPLE: the collective watchdog's thread asks the other ranks what they are
    // doing (comm/watchdog.h); the training thread is still the only one calling collectives.
    // KILN_MPI_THREAD_MULTIPLE=0 asks for MPI_THREAD_FUNNELED (an MPI slower with threads): the
    // watchdog then still stops the job, without naming the ranks that had not arrived.
    const char* multiple = std::getenv("KILN_MPI_THREAD_MULTIPLE");
    const bool funneled = multiple != nullptr && std::string(multiple) == "0";
    MPI_Init_thread(nullptr, nullptr, funneled ? MPI_THREAD_FUNNELED : MPI_THREAD_MULTIPLE,
                    &provided);
    std::atexit(finalize_at_exit);
  }
  return std::make_unique<MpiGroup>(MPI_COMM_WORLD, false);
}

}  // namespace kiln::comm

#endif  // KILN_HAVE_MPI
