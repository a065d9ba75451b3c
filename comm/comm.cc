#include "comm/comm.h"

#include <unistd.h>

#include <algorithm>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <mutex>

namespace kiln::comm {

#ifdef KILN_HAVE_MPI
// comm/mpi_group.cc
std::unique_ptr<ProcessGroup> make_mpi_world();
#endif

size_t dtype_size(DType t) {
  switch (t) {
    case DType::kInt32: return 4;
    case DType::kFloat32: return 4;
    case DType::kInt64: return 8;
    case DType::kUInt64: return 8;
    case DType::kFloat64: return 8;
  }
  return 0;
}

const char* dtype_name(DType t) {
  switch (t) {
    case DType::kInt32: return "int32";
    case DType::kFloat32: return "float32";
    case DType::kInt64: return "int64";
    case DType::kUInt64: return "uint64";
    case DType::kFloat64: return "float64";
  }
  return "?";
}

namespace {

template <typename T>
void reduce_typed(T* acc, const T* in, size_t n, ReduceOp op) {
  switch (op) {
    case ReduceOp::kSum:
      for (size_t i = 0; i < n; ++i) acc[i] += in[i];
      break;
    case ReduceOp::kMin:
      for (size_t i = 0; i < n; ++i) acc[i] = in[i] < acc[i] ? in[i] : acc[i];
      break;
    case ReduceOp::kMax:
      for (size_t i = 0; i < n; ++i) acc[i] = in[i] > acc[i] ? in[i] : acc[i];
      break;
  }
}

class DoneWork final : public Work {
 public:
  explicit DoneWork(Status s) : status_(std::move(s)) {}
  Status wait() override { return status_; }
  bool test() override { return true; }

 private:
  Status status_;
};

}  // namespace

void reduce_into(void* acc, const void* in, size_t count, DType dtype, ReduceOp op) {
  switch (dtype) {
    case DType::kInt32:
      return reduce_typed(static_cast<int32_t*>(acc), static_cast<const int32_t*>(in), count, op);
    case DType::kInt64:
      return reduce_typed(static_cast<int64_t*>(acc), static_cast<const int64_t*>(in), count, op);
    case DType::kUInt64:
      return reduce_typed(static_cast<uint64_t*>(acc), static_cast<const uint64_t*>(in), count,
                          op);
    case DType::kFloat32:
      return reduce_typed(static_cast<float*>(acc), static_cast<const float*>(in), count, op);
    case DType::kFloat64:
      return reduce_typed(static_cast<double*>(acc), static_cast<const double*>(in), count, op);
  }
}

std::unique_ptr<Work> completed_work(Status status) {
  return std::make_unique<DoneWork>(std::move(status));
}

// ---- ProcessGroup: counting and watching front, backend behind --------------------------------

class ProcessGroup::Watch {
 public:
  Watch(ProcessGroup& g, const char* collective) : id_(g.begin(collective)) {}
  ~Watch() {
    if (id_) detail::watch_end(id_);
  }
  Watch(const Watch&) = delete;
  Watch& operator=(const Watch&) = delete;

 private:
  uint64_t id_;
};

namespace {

// An asynchronous collective's handle whose completion ends its watch.
class WatchedWork final : public Work {
 public:
  WatchedWork(uint64_t id, std::unique_ptr<Work> inner) : id_(id), inner_(std::move(inner)) {}
  ~WatchedWork() override {
    inner_.reset();  // waits
    end();
  }
  Status wait() override {
    Status st = inner_->wait();
    end();
    return st;
  }
  bool test() override {
    const bool done = inner_->test();
    if (done) end();
    return done;
  }

 private:
  void end() {
    if (id_) detail::watch_end(id_);
    id_ = 0;
  }
  uint64_t id_;
  std::unique_ptr<Work> inner_;
};

}  // namespace

uint64_t ProcessGroup::begin(const char* collective) {
  return detail::watch_begin(*this, collective, ++seq_);
}

std::unique_ptr<Work> ProcessGroup::watched(uint64_t id, std::unique_ptr<Work> work) {
  if (id == 0) return work;
  return std::make_unique<WatchedWork>(id, std::move(work));
}

void ProcessGroup::count(const char* collective, uint64_t bytes) {
  if (size() <= 1) return;
  CollectiveCount& c = counters_[collective];
  ++c.calls;
  c.bytes += bytes;
}

Status ProcessGroup::barrier() {
  count("barrier", 0);
  Watch w(*this, "barrier");
  return do_barrier();
}

Status ProcessGroup::bcast(void* data, size_t bytes, int root) {
  count("broadcast", bytes);
  Watch w(*this, "broadcast");
  return do_bcast(data, bytes, root);
}

Status ProcessGroup::allgather(const void* send, size_t bytes, void* recv) {
  std::vector<size_t> counts(size(), bytes);
  return allgatherv(send, bytes, recv, counts.data());
}

Status ProcessGroup::allgatherv(const void* send, size_t send_bytes, void* recv,
                                const size_t* recv_bytes) {
  uint64_t total = 0;
  for (int r = 0; r < size(); ++r) total += recv_bytes[r];
  count("all_gather", total);
  Watch w(*this, "all_gather");
  return do_allgatherv(send, send_bytes, recv, recv_bytes);
}

Status ProcessGroup::gatherv(const void* send, size_t send_bytes, void* recv,
                             const size_t* recv_bytes, int root) {
  uint64_t total = 0;
  for (int r = 0; r < size(); ++r) total += recv_bytes[r];
  count("gather", total);
  Watch w(*this, "gather");
  return do_gatherv(send, send_bytes, recv, recv_bytes, root);
}

Status ProcessGroup::alltoall(const void* send, size_t bytes_per_rank, void* recv) {
  std::vector<size_t> counts(size(), bytes_per_rank);
  return alltoallv(send, counts.data(), recv, counts.data());
}

Status ProcessGroup::alltoallv(const void* send, const size_t* send_bytes, void* recv,
                               const size_t* recv_bytes) {
  uint64_t total = 0;
  for (int r = 0; r < size(); ++r) total += send_bytes[r];
  count("all_to_all", total);
  Watch w(*this, "all_to_all");
  return do_alltoallv(send, send_bytes, recv, recv_bytes);
}

Status ProcessGroup::allreduce(void* data, size_t count_, DType dtype, ReduceOp op) {
  count("all_reduce", 2 * count_ * dtype_size(dtype));
  Watch w(*this, "all_reduce");
  return do_allreduce(data, count_, dtype, op);
}

Status ProcessGroup::reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                                    ReduceOp op) {
  count("reduce_scatter", recv_count * dtype_size(dtype) * static_cast<uint64_t>(size()));
  Watch w(*this, "reduce_scatter");
  return do_reduce_scatter(send, recv, recv_count, dtype, op);
}

std::unique_ptr<Work> ProcessGroup::iallreduce(void* data, size_t count_, DType dtype,
                                               ReduceOp op) {
  count("all_reduce", 2 * count_ * dtype_size(dtype));
  const uint64_t id = begin("all_reduce");
  return watched(id, do_iallreduce(data, count_, dtype, op));
}

std::unique_ptr<Work> ProcessGroup::iallgather(const void* send, size_t bytes, void* recv) {
  count("all_gather", bytes * static_cast<uint64_t>(size()));
  const uint64_t id = begin("all_gather");
  return watched(id, do_iallgather(send, bytes, recv));
}

std::unique_ptr<Work> ProcessGroup::ireduce_scatter(const void* send, void* recv,
                                                    size_t recv_count, DType dtype, ReduceOp op) {
  count("reduce_scatter", recv_count * dtype_size(dtype) * static_cast<uint64_t>(size()));
  const uint64_t id = begin("reduce_scatter");
  return watched(id, do_ireduce_scatter(send, recv, recv_count, dtype, op));
}

std::unique_ptr<Work> ProcessGroup::ibcast(void* data, size_t bytes, int root) {
  count("broadcast", bytes);
  const uint64_t id = begin("broadcast");
  return watched(id, do_ibcast(data, bytes, root));
}

std::unique_ptr<Work> ProcessGroup::ibarrier() {
  count("barrier", 0);
  const uint64_t id = begin("barrier");
  return watched(id, do_ibarrier());
}

// ---- point-to-point ----------------------------------------------------------------------------

namespace {
// MPI guarantees tags up to 32767 (MPI_TAG_UB may be larger; portable code stays below).
constexpr int kMaxTag = 32767;
}  // namespace

Status ProcessGroup::check_p2p(const char* op, int peer, int tag) const {
  if (peer < 0 || peer >= size())
    return Status::internal(fmt_p2p(op, peer, tag) + ": peer rank " + std::to_string(peer) +
                            " is not in the group (" + std::to_string(size()) + " ranks)");
  if (tag < 0 || tag > kMaxTag)
    return Status::internal(fmt_p2p(op, peer, tag) + ": tag must be 0.." + std::to_string(kMaxTag));
  return Status::ok();
}

std::string ProcessGroup::fmt_p2p(const char* op, int peer, int tag) const {
  return std::string(op) + (std::strcmp(op, "send") == 0 ? " to" : " from") + " rank " +
         std::to_string(peer) + " (tag " + std::to_string(tag) + ") on group " + name_;
}

uint64_t ProcessGroup::begin_p2p(const char* op, int peer) {
  const bool sending = std::strcmp(op, "send") == 0;
  const uint64_t seq = ++(sending ? sends_to_ : recvs_from_)[peer];
  return detail::watch_begin_p2p(*this, op, peer, seq);
}

std::unique_ptr<Work> ProcessGroup::isend(const void* data, size_t bytes, int peer, int tag) {
  Status st = check_p2p("send", peer, tag);
  if (!st.is_ok()) return completed_work(std::move(st));
  if (peer != rank()) count("send", bytes);
  const uint64_t id = begin_p2p("send", peer);
  return watched(id, do_isend(data, bytes, peer, tag));
}

std::unique_ptr<Work> ProcessGroup::irecv(void* data, size_t bytes, int peer, int tag) {
  Status st = check_p2p("recv", peer, tag);
  if (!st.is_ok()) return completed_work(std::move(st));
  if (peer != rank()) count("recv", bytes);
  const uint64_t id = begin_p2p("recv", peer);
  return watched(id, do_irecv(data, bytes, peer, tag));
}

Status ProcessGroup::send(const void* data, size_t bytes, int peer, int tag) {
  return isend(data, bytes, peer, tag)->wait();
}

Status ProcessGroup::recv(void* data, size_t bytes, int peer, int tag) {
  return irecv(data, bytes, peer, tag)->wait();
}

std::unique_ptr<Work> ProcessGroup::do_isend(const void*, size_t, int peer, int tag) {
  return completed_work(Status::unimplemented(fmt_p2p("send", peer, tag) + ": the " + backend() +
                                              " backend has no point-to-point"));
}

std::unique_ptr<Work> ProcessGroup::do_irecv(void*, size_t, int peer, int tag) {
  return completed_work(Status::unimplemented(fmt_p2p("recv", peer, tag) + ": the " + backend() +
                                              " backend has no point-to-point"));
}

class ProcessGroup::SelfRecv final : public Work {
 public:
  SelfRecv(ProcessGroup& g, void* data, size_t bytes, int tag)
      : g_(g), data_(data), bytes_(bytes), tag_(tag) {}
  Status wait() override {
    if (!test())
      return Status::internal(g_.fmt_p2p("recv", g_.rank(), tag_) +
                              ": nothing was sent to itself with this tag (a rank sends to "
                              "itself before it waits for the message)");
    return status_;
  }
  bool test() override {
    if (done_) return true;
    auto it = g_.self_box_.find(tag_);
    if (it == g_.self_box_.end() || it->second.empty()) return false;
    std::vector<char> msg = std::move(it->second.front());
    it->second.erase(it->second.begin());
    if (it->second.empty()) g_.self_box_.erase(it);
    if (msg.size() != bytes_) {
      status_ = Status::internal(g_.fmt_p2p("recv", g_.rank(), tag_) + ": receives " +
                                 std::to_string(bytes_) + " bytes, the message has " +
                                 std::to_string(msg.size()));
    } else if (bytes_) {
      std::memcpy(data_, msg.data(), bytes_);
    }
    done_ = true;
    return true;
  }

 private:
  ProcessGroup& g_;
  void* data_;
  size_t bytes_;
  int tag_;
  Status status_;
  bool done_ = false;
};

std::unique_ptr<Work> ProcessGroup::self_isend(const void* data, size_t bytes, int tag) {
  const char* p = static_cast<const char*>(data);
  self_box_[tag].emplace_back(p, p + bytes);
  return completed_work(Status::ok());
}

std::unique_ptr<Work> ProcessGroup::self_irecv(void* data, size_t bytes, int tag) {
  auto w = std::make_unique<SelfRecv>(*this, data, bytes, tag);
  (void)w->test();  // already sent: complete now
  return w;
}

Result<std::unique_ptr<ProcessGroup>> ProcessGroup::split(int color, int key, std::string name) {
  KILN_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> g, do_split(color, key));
  g->set_name(name.empty() ? name_ + ".split" : std::move(name));
  return g;
}

std::unique_ptr<Work> ProcessGroup::do_iallreduce(void* data, size_t count_, DType dtype,
                                                  ReduceOp op) {
  return completed_work(do_allreduce(data, count_, dtype, op));
}
std::unique_ptr<Work> ProcessGroup::do_iallgather(const void* send, size_t bytes, void* recv) {
  std::vector<size_t> counts(size(), bytes);
  return completed_work(do_allgatherv(send, bytes, recv, counts.data()));
}
std::unique_ptr<Work> ProcessGroup::do_ireduce_scatter(const void* send, void* recv,
                                                       size_t recv_count, DType dtype,
                                                       ReduceOp op) {
  return completed_work(do_reduce_scatter(send, recv, recv_count, dtype, op));
}
std::unique_ptr<Work> ProcessGroup::do_ibcast(void* data, size_t bytes, int root) {
  return completed_work(do_bcast(data, bytes, root));
}
std::unique_ptr<Work> ProcessGroup::do_ibarrier() { return completed_work(do_barrier()); }

namespace {

// One process: every collective is a copy (or nothing).
class LocalGroup final : public ProcessGroup {
 public:
  LocalGroup() { set_name("local"); }
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

 protected:
  Status do_barrier() override { return Status::ok(); }
  Status do_bcast(void*, size_t, int root) override { return check_root(root); }
  Status do_allgatherv(const void* send, size_t send_bytes, void* recv,
                       const size_t* recv_bytes) override {
    if (recv_bytes[0] != send_bytes)
      return Status::internal("allgatherv: receive count differs from send count");
    if (send_bytes && send != recv) std::memmove(recv, send, send_bytes);
    return Status::ok();
  }
  Status do_gatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes,
                    int root) override {
    KILN_RETURN_IF_ERROR(check_root(root));
    return do_allgatherv(send, send_bytes, recv, recv_bytes);
  }
  Status do_alltoallv(const void* send, const size_t* send_bytes, void* recv,
                      const size_t* recv_bytes) override {
    if (send_bytes[0] != recv_bytes[0])
      return Status::internal("alltoallv: receive count differs from send count");
    if (send_bytes[0] && send != recv) std::memmove(recv, send, send_bytes[0]);
    return Status::ok();
  }
  Status do_allreduce(void*, size_t, DType dtype, ReduceOp) override {
    if (dtype_size(dtype) == 0) return Status::internal("allreduce: unknown dtype");
    return Status::ok();
  }
  Status do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                           ReduceOp) override {
    const size_t bytes = recv_count * dtype_size(dtype);
    if (bytes && send != recv) std::memmove(recv, send, bytes);
    return Status::ok();
  }
  Result<std::unique_ptr<ProcessGroup>> do_split(int, int) override {
    return std::unique_ptr<ProcessGroup>(new LocalGroup());
  }
  // The only peer is itself (checked by the front end).
  std::unique_ptr<Work> do_isend(const void* data, size_t bytes, int, int tag) override {
    return self_isend(data, bytes, tag);
  }
  std::unique_ptr<Work> do_irecv(void* data, size_t bytes, int, int tag) override {
    return self_irecv(data, bytes, tag);
  }

 private:
  static Status check_root(int root) {
    if (root != 0) return Status::internal("bcast: root " + std::to_string(root) + " of 1 rank");
    return Status::ok();
  }
};

}  // namespace

std::unique_ptr<ProcessGroup> make_local_group() { return std::make_unique<LocalGroup>(); }

bool launched_by_mpi() {
  for (const char* var : {"OMPI_COMM_WORLD_SIZE", "PMI_SIZE", "PMIX_RANK", "PMI_RANK",
                          "MPI_LOCALNRANKS", "MV2_COMM_WORLD_SIZE"}) {
    if (std::getenv(var) != nullptr) return true;
  }
  return false;
}

LaunchEnv launch_env() {
  const char* pairs[][2] = {{"OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE"},
                            {"PMIX_RANK", "PMIX_SIZE"},
                            {"PMI_RANK", "PMI_SIZE"},
                            {"MV2_COMM_WORLD_RANK", "MV2_COMM_WORLD_SIZE"},
                            {"SLURM_PROCID", "SLURM_NTASKS"}};
  for (const auto& p : pairs) {
    const char* r = std::getenv(p[0]);
    const char* w = std::getenv(p[1]);
    if (r && w) {
      const int rank = std::atoi(r), world = std::atoi(w);
      if (world >= 1 && rank >= 0 && rank < world) return {rank, world, p[1]};
    }
  }
  return {};
}

int launcher_world_size() { return launch_env().world; }

bool mpi_available() {
#ifdef KILN_HAVE_MPI
  return true;
#else
  return false;
#endif
}

ProcessGroup& world() {
  static std::unique_ptr<ProcessGroup> group;
  static std::once_flag once;
  std::call_once(once, [] {
#ifdef KILN_HAVE_MPI
    if (launched_by_mpi()) group = make_mpi_world();
#endif
    if (!group) group = make_local_group();
    group->set_name("world");
  });
  return *group;
}

int ranks_on_this_host(ProcessGroup& g) {
  if (g.size() == 1) return 1;
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name - 1) != 0) std::snprintf(name, sizeof name, "unknown");
  auto hosts = allgather_strings(g, name);  // every rank takes part, whatever its host name
  if (!hosts.is_ok()) return g.size();
  return static_cast<int>(std::count(hosts->begin(), hosts->end(), std::string(name)));
}

Result<std::vector<std::string>> allgather_strings(ProcessGroup& g, const std::string& mine) {
  std::vector<char> bytes(mine.begin(), mine.end());
  std::vector<size_t> counts;
  KILN_ASSIGN_OR_RETURN(std::vector<char> all, allgatherv(g, bytes, &counts));
  std::vector<std::string> out;
  size_t at = 0;
  for (size_t c : counts) {
    out.emplace_back(all.data() + at, c);
    at += c;
  }
  return out;
}

Result<std::vector<std::string>> gather_strings(ProcessGroup& g, const std::string& mine,
                                                int root) {
  std::vector<uint64_t> sizes(g.size());
  uint64_t my = mine.size();
  KILN_RETURN_IF_ERROR(g.allgather(&my, sizeof(my), sizes.data()));
  std::vector<size_t> bytes(sizes.begin(), sizes.end());
  size_t total = 0;
  for (size_t b : bytes) total += b;
  std::string all;
  if (g.rank() == root) all.resize(total);
  KILN_RETURN_IF_ERROR(g.gatherv(mine.data(), mine.size(), g.rank() == root ? all.data() : nullptr,
                                 bytes.data(), root));
  std::vector<std::string> out;
  if (g.rank() != root) return out;
  size_t at = 0;
  for (size_t b : bytes) {
    out.push_back(all.substr(at, b));
    at += b;
  }
  return out;
}

Status bcast_string(ProcessGroup& g, std::string* blob, int root) {
  uint64_t n = blob->size();
  KILN_RETURN_IF_ERROR(g.bcast(&n, sizeof(n), root));
  blob->resize(n);
  return g.bcast(blob->data(), n, root);
}

Status agree(ProcessGroup& g, Status local) {
  if (g.size() == 1) return local;
  int32_t mine = local.is_ok() ? 0 : static_cast<int32_t>(local.code());
  std::vector<int32_t> codes(g.size());
  KILN_RETURN_IF_ERROR(g.allgather(&mine, sizeof(mine), codes.data()));
  int first = -1;
  for (int r = 0; r < g.size(); ++r)
    if (codes[r] != 0) {
      first = r;
      break;
    }
  if (first < 0) return Status::ok();
  std::string msg = first == g.rank() ? local.to_string() : std::string();
  KILN_RETURN_IF_ERROR(bcast_string(g, &msg, first));
  if (!local.is_ok()) return local;
  StatusCode code = static_cast<StatusCode>(codes[first]);
  std::string text = "rank " + std::to_string(first) + " failed: " + msg;
  switch (code) {
    case StatusCode::kUsage: return Status::usage(text);
    case StatusCode::kConfig: return Status::config(text);
    case StatusCode::kData: return Status::data(text);
    case StatusCode::kIo: return Status::io(text);
    case StatusCode::kNotFound: return Status::not_found(text);
    case StatusCode::kUnimplemented: return Status::unimplemented(text);
    default: return Status::internal(text);
  }
}

}  // namespace kiln::comm
