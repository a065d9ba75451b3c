// NCCL backend of ProcessGroup (device memory). Compiled only into the NCCL module
// libkiln_nccl.so (common/cuda_module.h), built with CUDA and NCCL; comm/nccl.cc loads it when
// make_nccl_group is first called. The module's entry points are the extern "C" functions at the
// end (named apart from comm/nccl.h's: a module's calls to a name the executable also defines go
// to the executable's).
#include <cuda_runtime.h>
#include <nccl.h>

#include <atomic>
#include <cstdlib>
#include <memory>
#include <string>
#include <vector>

#include "comm/nccl.h"
#include "common/cuda_module.h"

namespace kiln::comm {
namespace {

Status nccl_check(ncclResult_t rc, const char* what) {
  if (rc == ncclSuccess) return Status::ok();
  return Status::internal(std::string("NCCL ") + what + ": " + ncclGetErrorString(rc));
}

Status cuda_status(cudaError_t rc, const char* what) {
  if (rc == cudaSuccess) return Status::ok();
  return Status::internal(std::string("CUDA ") + what + ": " + cudaGetErrorString(rc));
}

ncclDataType_t nccl_type(DType t) {
  switch (t) {
    case DType::kInt32: return ncclInt32;
    case DType::kInt64: return ncclInt64;
    case DType::kUInt64: return ncclUint64;
    case DType::kFloat32: return ncclFloat32;
    case DType::kFloat64: return ncclFloat64;
  }
  return ncclFloat32;
}

ncclRedOp_t nccl_op(ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum: return ncclSum;
    case ReduceOp::kMin: return ncclMin;
    case ReduceOp::kMax: return ncclMax;
  }
  return ncclSum;
}

// Completes when the event recorded after the enqueued collective has fired.
class NcclWork final : public Work {
 public:
  NcclWork(cudaEvent_t event, int device) : event_(event), device_(device) {}
  ~NcclWork() override {
    (void)wait();
    cudaEventDestroy(event_);
  }
  Status wait() override {
    if (!done_) {
      cudaSetDevice(device_);
      status_ = cuda_status(cudaEventSynchronize(event_), "event synchronize");
      done_ = true;
    }
    return status_;
  }
  bool test() override {
    if (done_) return true;
    cudaError_t rc = cudaEventQuery(event_);
    if (rc == cudaErrorNotReady) return false;
    status_ = cuda_status(rc, "event query");
    done_ = true;
    return true;
  }

 private:
  cudaEvent_t event_;
  int device_;
  Status status_;
  bool done_ = false;
};

// One launch of point-to-point operations (one ncclGroupStart / ncclGroupEnd): the event recorded
// after it, shared by the handles of the operations in it.
struct P2pLaunch {
  explicit P2pLaunch(int device) : device(device) {}
  ~P2pLaunch() {
    if (event) cudaEventDestroy(event);
  }
  int device;
  bool launched = false;
  cudaEvent_t event = nullptr;
  Status status;  // of the launch itself
};

class NcclGroup;

// An isend / irecv: launched with the others posted since the last launch when it is first waited
// for or tested (NcclGroup::launch_p2p), complete when the launch's event has fired.
class NcclP2pWork final : public Work {
 public:
  NcclP2pWork(NcclGroup& g, std::shared_ptr<P2pLaunch> launch)
      : g_(g), launch_(std::move(launch)) {}
  ~NcclP2pWork() override { (void)wait(); }
  Status wait() override;
  bool test() override;

 private:
  NcclGroup& g_;
  std::shared_ptr<P2pLaunch> launch_;
  Status status_;
  bool done_ = false;
};

// Collectives run on the group's own stream, each ordered after the work queued on `follow` (the
// compute stream) when it is issued: an event recorded there, waited for by the group's stream.
class NcclGroup final : public ProcessGroup {
 public:
  NcclGroup(ncclComm_t comm, int device, cudaStream_t stream, cudaEvent_t ready,
            cudaStream_t follow)
      : comm_(comm), device_(device), stream_(stream), ready_(ready), follow_(follow) {
    ncclCommUserRank(comm_, &rank_);
    ncclCommCount(comm_, &size_);
  }
  ~NcclGroup() override {
    cudaSetDevice(device_);
    if (cancelled_) return;  // the process is being ended (the watchdog)
    (void)launch_p2p();      // (handles must not outlive the group; their transfers still run)
    cudaStreamSynchronize(stream_);
    ncclCommDestroy(comm_);
    cudaEventDestroy(ready_);
    cudaStreamDestroy(stream_);
    if (scratch_) cudaFree(scratch_);
  }

  int rank() const override { return rank_; }
  int size() const override { return size_; }
  const char* backend() const override { return "nccl"; }
  [[noreturn]] void abort(int code) override {
    ncclCommAbort(comm_);
    std::_Exit(code);
  }
  // The watchdog's thread: the kernels of this communicator stop, blocked waits return.
  void cancel() override {
    cancelled_ = true;
    ncclCommAbort(comm_);
  }

 protected:
  Status do_barrier() override {
    KILN_RETURN_IF_ERROR(ensure_scratch());
    KILN_RETURN_IF_ERROR(order());
    KILN_RETURN_IF_ERROR(nccl_check(
        ncclAllReduce(scratch_, scratch_, 1, ncclInt32, ncclSum, comm_, stream_), "barrier"));
    return sync("barrier");
  }
  Status do_bcast(void* data, size_t bytes, int root) override {
    KILN_RETURN_IF_ERROR(order());
    KILN_RETURN_IF_ERROR(enqueue_bcast(data, bytes, root));
    return sync("broadcast");
  }
  Status do_allgatherv(const void* send, size_t send_bytes, void* recv,
                       const size_t* recv_bytes) override {
    KILN_RETURN_IF_ERROR(order());
    bool equal = true;
    for (int r = 0; r < size_; ++r) equal = equal && recv_bytes[r] == recv_bytes[0];
    char* out = static_cast<char*>(recv);
    if (equal) {
      KILN_RETURN_IF_ERROR(nccl_check(
          ncclAllGather(send, out, send_bytes, ncclChar, comm_, stream_), "all_gather"));
      return sync("all_gather");
    }
    // Variable sizes: one broadcast per rank, grouped.
    KILN_RETURN_IF_ERROR(nccl_check(ncclGroupStart(), "group start"));
    size_t at = 0;
    for (int r = 0; r < size_; ++r) {
      const void* src = r == rank_ ? send : out + at;
      KILN_RETURN_IF_ERROR(nccl_check(
          ncclBroadcast(src, out + at, recv_bytes[r], ncclChar, r, comm_, stream_), "allgatherv"));
      at += recv_bytes[r];
    }
    KILN_RETURN_IF_ERROR(nccl_check(ncclGroupEnd(), "group end"));
    return sync("allgatherv");
  }
  Status do_gatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes,
                    int root) override {
    KILN_RETURN_IF_ERROR(order());
    KILN_RETURN_IF_ERROR(nccl_check(ncclGroupStart(), "group start"));
    if (rank_ == root) {
      char* out = static_cast<char*>(recv);
      size_t at = 0;
      for (int r = 0; r < size_; ++r) {
        if (r == rank_) {
          KILN_RETURN_IF_ERROR(cuda_status(cudaMemcpyAsync(out + at, send, send_bytes,
                                                           cudaMemcpyDeviceToDevice, stream_),
                                           "gatherv copy"));
        } else if (recv_bytes[r]) {
          KILN_RETURN_IF_ERROR(nccl_check(
              ncclRecv(out + at, recv_bytes[r], ncclChar, r, comm_, stream_), "gatherv recv"));
        }
        at += recv_bytes[r];
      }
    } else if (send_bytes) {
      KILN_RETURN_IF_ERROR(
          nccl_check(ncclSend(send, send_bytes, ncclChar, root, comm_, stream_), "gatherv send"));
    }
    KILN_RETURN_IF_ERROR(nccl_check(ncclGroupEnd(), "group end"));
    return sync("gatherv");
  }
  Status do_alltoallv(const void* send, const size_t* send_bytes, void* recv,
                      const size_t* recv_bytes) override {
    const char* in = static_cast<const char*>(send);
    char* out = static_cast<char*>(recv);
    KILN_RETURN_IF_ERROR(order());
    KILN_RETURN_IF_ERROR(nccl_check(ncclGroupStart(), "group start"));
    size_t so = 0, ro = 0;
    for (int r = 0; r < size_; ++r) {
      if (send_bytes[r])
        KILN_RETURN_IF_ERROR(nccl_check(
            ncclSend(in + so, send_bytes[r], ncclChar, r, comm_, stream_), "alltoallv send"));
      if (recv_bytes[r])
        KILN_RETURN_IF_ERROR(nccl_check(
            ncclRecv(out + ro, recv_bytes[r], ncclChar, r, comm_, stream_), "alltoallv recv"));
      so += send_bytes[r];
      ro += recv_bytes[r];
    }
    KILN_RETURN_IF_ERROR(nccl_check(ncclGroupEnd(), "group end"));
    return sync("alltoallv");
  }
  Status do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    KILN_RETURN_IF_ERROR(order());
    KILN_RETURN_IF_ERROR(nccl_check(
        ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), comm_, stream_),
        "all_reduce"));
    return sync("all_reduce");
  }
  Status do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                           ReduceOp op) override {
    KILN_RETURN_IF_ERROR(order());
    KILN_RETURN_IF_ERROR(nccl_check(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype),
                                                       nccl_op(op), comm_, stream_),
                                     "reduce_scatter"));
    return sync("reduce_scatter");
  }
  Result<std::unique_ptr<ProcessGroup>> do_split(int color, int key) override {
    ncclComm_t sub = nullptr;
    KILN_RETURN_IF_ERROR(nccl_check(ncclCommSplit(comm_, color, key, &sub, nullptr), "comm split"));
    return wrap(sub, device_, follow_);
  }

  std::unique_ptr<Work> do_iallreduce(void* data, size_t count, DType dtype,
                                      ReduceOp op) override {
    Status st = order();
    if (st.is_ok()) st = nccl_check(
        ncclAllReduce(data, data, count, nccl_type(dtype), nccl_op(op), comm_, stream_),
        "all_reduce");
    return st.is_ok() ? record() : completed_work(std::move(st));
  }
  std::unique_ptr<Work> do_iallgather(const void* send, size_t bytes, void* recv) override {
    Status st = order();
    if (st.is_ok())
      st = nccl_check(ncclAllGather(send, recv, bytes, ncclChar, comm_, stream_), "all_gather");
    return st.is_ok() ? record() : completed_work(std::move(st));
  }
  std::unique_ptr<Work> do_ireduce_scatter(const void* send, void* recv, size_t recv_count,
                                           DType dtype, ReduceOp op) override {
    Status st = order();
    if (st.is_ok()) st = nccl_check(ncclReduceScatter(send, recv, recv_count, nccl_type(dtype),
                                              nccl_op(op), comm_, stream_),
                            "reduce_scatter");
    return st.is_ok() ? record() : completed_work(std::move(st));
  }
  std::unique_ptr<Work> do_ibcast(void* data, size_t bytes, int root) override {
    Status st = order();
    if (st.is_ok()) st = enqueue_bcast(data, bytes, root);
    return st.is_ok() ? record() : completed_work(std::move(st));
  }

  // Point-to-point: NCCL's ncclSend / ncclRecv on the group's stream block that stream until the
  // peer's matching call runs, so two ranks each sending to the other first would deadlock if
  // every call were issued alone. Instead the operations posted one after another are queued and
  // issued together in one ncclGroupStart / ncclGroupEnd (NCCL then progresses them all at
  // once) when one of their handles is first waited for or tested, or before the group's next
  // collective. Tags are not sent: messages between two ranks match in posting order.
  std::unique_ptr<Work> do_isend(const void* data, size_t bytes, int peer, int tag) override {
    return post_p2p(true, const_cast<void*>(data), bytes, peer, tag);
  }
  std::unique_ptr<Work> do_irecv(void* data, size_t bytes, int peer, int tag) override {
    return post_p2p(false, data, bytes, peer, tag);
  }

 public:
  // A group over `comm` with a new stream and event, following `follow`.
  static Result<std::unique_ptr<ProcessGroup>> wrap(ncclComm_t comm, int device,
                                                    cudaStream_t follow) {
    cudaStream_t s = nullptr;
    cudaEvent_t e = nullptr;
    Status st = cuda_status(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), "stream create");
    if (st.is_ok()) st = cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event create");
    if (!st.is_ok()) {
      if (s) cudaStreamDestroy(s);
      ncclCommDestroy(comm);
      return st;
    }
    return std::unique_ptr<ProcessGroup>(new NcclGroup(comm, device, s, e, follow));
  }

  // Issues the queued point-to-point operations (see do_isend) as one NCCL group call.
  Status launch_p2p() {
    if (pending_.empty()) return Status::ok();
    std::vector<PendingP2p> ops = std::move(pending_);
    pending_.clear();
    std::shared_ptr<P2pLaunch> launch = std::move(launch_);
    launch_.reset();
    launch->launched = true;
    Status st = follow_compute();
    if (st.is_ok()) st = nccl_check(ncclGroupStart(), "group start");
    if (st.is_ok()) {
      for (const PendingP2p& op : ops) {
        if (op.bytes == 0) continue;  // (both sides skip it: sizes must match)
        Status one =
            op.send
                ? nccl_check(ncclSend(op.data, op.bytes, ncclChar, op.peer, comm_, stream_), "send")
                : nccl_check(ncclRecv(op.data, op.bytes, ncclChar, op.peer, comm_, stream_),
                             "recv");
        if (!one.is_ok() && st.is_ok()) st = std::move(one);
      }
      Status end = nccl_check(ncclGroupEnd(), "group end");
      if (st.is_ok()) st = std::move(end);
    }
    if (st.is_ok())
      st = cuda_status(cudaEventCreateWithFlags(&launch->event, cudaEventDisableTiming),
                       "event create");
    if (st.is_ok()) st = cuda_status(cudaEventRecord(launch->event, stream_), "event record");
    launch->status = std::move(st);
    return launch->status;
  }

 private:
  struct PendingP2p {
    bool send;
    void* data;
    size_t bytes;
    int peer;
  };

  std::unique_ptr<Work> post_p2p(bool send, void* data, size_t bytes, int peer, int tag) {
    if (peer == rank_) {
      return completed_work(Status::internal(fmt_p2p(send ? "send" : "recv", peer, tag) +
                                             ": the nccl backend cannot send to itself"));
    }
    if (!launch_) launch_ = std::make_shared<P2pLaunch>(device_);
    pending_.push_back(PendingP2p{send, data, bytes, peer});
    return std::make_unique<NcclP2pWork>(*this, launch_);
  }

  // The group's stream waits for the work queued on the compute stream so far (the buffers a
  // collective reads were written there; the ones it writes may still be read there).
  Status follow_compute() {
    KILN_RETURN_IF_ERROR(cuda_status(cudaEventRecord(ready_, follow_), "event record"));
    return cuda_status(cudaStreamWaitEvent(stream_, ready_, 0), "stream wait");
  }
  // Before a collective: the queued point-to-point operations first (the same order on the
  // stream as they were posted), then the compute stream's work.
  Status order() {
    KILN_RETURN_IF_ERROR(launch_p2p());
    return follow_compute();
  }
  Status enqueue_bcast(void* data, size_t bytes, int root) {
    return nccl_check(ncclBroadcast(data, data, bytes, ncclChar, root, comm_, stream_),
                       "broadcast");
  }
  Status sync(const char* what) {
    return cuda_status(cudaStreamSynchronize(stream_), what);
  }
  Status ensure_scratch() {
    if (scratch_) return Status::ok();
    return cuda_status(cudaMalloc(&scratch_, sizeof(int32_t)), "barrier scratch");
  }
  std::unique_ptr<Work> record() {
    cudaEvent_t e = nullptr;
    Status st = cuda_status(cudaEventCreateWithFlags(&e, cudaEventDisableTiming), "event create");
    if (st.is_ok()) st = cuda_status(cudaEventRecord(e, stream_), "event record");
    if (!st.is_ok()) return completed_work(std::move(st));
    return std::make_unique<NcclWork>(e, device_);
  }

  ncclComm_t comm_;
  int device_;
  cudaStream_t stream_;  // owned
  cudaEvent_t ready_;    // owned
  cudaStream_t follow_;  // the compute stream (nullptr: the legacy default stream)
  int rank_ = 0, size_ = 1;
  void* scratch_ = nullptr;
  std::atomic<bool> cancelled_{false};
  std::vector<PendingP2p> pending_;    // posted, not yet issued
  std::shared_ptr<P2pLaunch> launch_;  // the launch they will be issued in
};

Status NcclP2pWork::wait() {
  if (done_) return status_;
  if (!launch_->launched) (void)g_.launch_p2p();
  status_ = launch_->status;
  if (status_.is_ok()) {
    cudaSetDevice(launch_->device);
    status_ = cuda_status(cudaEventSynchronize(launch_->event), "event synchronize");
  }
  done_ = true;
  return status_;
}

bool NcclP2pWork::test() {
  if (done_) return true;
  if (!launch_->launched) (void)g_.launch_p2p();
  if (!launch_->status.is_ok()) return (void)wait(), true;
  cudaError_t rc = cudaEventQuery(launch_->event);
  if (rc == cudaErrorNotReady) return false;
  status_ = cuda_status(rc, "event query");
  done_ = true;
  return true;
}

Result<std::unique_ptr<ProcessGroup>> make_group(ProcessGroup& bootstrap, int device,
                                                 void* stream) {
  Status set = cuda_status(cudaSetDevice(device), ("set device " + std::to_string(device)).c_str());
  if (!set.is_ok()) {
    int count = 0;
    if (cudaGetDeviceCount(&count) != cudaSuccess) count = 0;
    (void)cudaGetLastError();
    set = Status::internal(set.message() + " (this process sees " + std::to_string(count) +
                           " CUDA device" + (count == 1 ? "" : "s") + ")");
  }
  KILN_RETURN_IF_ERROR(agree(bootstrap, std::move(set)));
  ncclUniqueId id{};
  Status local = bootstrap.rank() == 0 ? nccl_check(ncclGetUniqueId(&id), "get unique id")
                                       : Status::ok();
  KILN_RETURN_IF_ERROR(agree(bootstrap, std::move(local)));
  KILN_RETURN_IF_ERROR(bootstrap.bcast(&id, sizeof(id), 0));
  ncclComm_t comm = nullptr;
  KILN_RETURN_IF_ERROR(agree(
      bootstrap, nccl_check(ncclCommInitRank(&comm, bootstrap.size(), id, bootstrap.rank()),
                             "comm init rank")));
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> g,
                        NcclGroup::wrap(comm, device, static_cast<cudaStream_t>(stream)));
  g->set_name(bootstrap.name());
  g->set_world_ranks(bootstrap.world_ranks());
  return g;
}

}  // namespace
}  // namespace kiln::comm

// ---- the module's entry points (looked up by name: comm/nccl.cc) --------------------------------

extern "C" const char* kiln_cuda_module_stamp() { return KILN_CUDA_MODULE_STAMP; }

extern "C" kiln::Result<std::unique_ptr<kiln::comm::ProcessGroup>> kiln_nccl_make_group(
    kiln::comm::ProcessGroup& bootstrap, int device, void* stream) {
  return kiln::comm::make_group(bootstrap, device, stream);
}
