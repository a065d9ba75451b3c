#include "comm/comm.h"

#include <cstdlib>
#include <cstring>
#include <mutex>

namespace kiln::comm {

#ifdef KILN_HAVE_MPI
// comm/mpi_group.cc
std::unique_ptr<ProcessGroup> make_mpi_world();
#endif

namespace {

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

// One process: every collective is a copy (or nothing).
class LocalGroup final : public ProcessGroup {
 public:
  int rank() const override { return 0; }
  int size() const override { return 1; }
  const char* backend() const override { return "local"; }
  Status barrier() override { return Status::ok(); }
  Status bcast(void*, size_t, int root) override { return check_root(root); }
  Status allgather(const void* send, size_t bytes, void* recv) override {
    if (bytes && send != recv) std::memmove(recv, send, bytes);
    return Status::ok();
  }
  Status allgatherv(const void* send, size_t send_bytes, void* recv,
                    const size_t* recv_bytes) override {
    if (recv_bytes[0] != send_bytes)
      return Status::internal("allgatherv: receive count differs from send count");
    if (send_bytes && send != recv) std::memmove(recv, send, send_bytes);
    return Status::ok();
  }
  Status gatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes,
                 int root) override {
    KILN_RETURN_IF_ERROR(check_root(root));
    return allgatherv(send, send_bytes, recv, recv_bytes);
  }
  Status alltoall(const void* send, size_t bytes_per_rank, void* recv) override {
    if (bytes_per_rank && send != recv) std::memmove(recv, send, bytes_per_rank);
    return Status::ok();
  }
  Status alltoallv(const void* send, const size_t* send_bytes, void* recv,
                   const size_t* recv_bytes) override {
    if (send_bytes[0] != recv_bytes[0])
      return Status::internal("alltoallv: receive count differs from send count");
    if (send_bytes[0] && send != recv) std::memmove(recv, send, send_bytes[0]);
    return Status::ok();
  }
  Status allreduce(void*, size_t, DType dtype, ReduceOp) override {
    if (dtype_size(dtype) == 0) return Status::internal("allreduce: unknown dtype");
    return Status::ok();
  }
  Result<std::unique_ptr<ProcessGroup>> split(int, int) override {
    return std::unique_ptr<ProcessGroup>(new LocalGroup());
  }
  [[noreturn]] void abort(int code) override { std::_Exit(code); }

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
  });
  return *group;
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
