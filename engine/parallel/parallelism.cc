#include "engine/parallel/parallelism.h"

#include <unistd.h>

#include <chrono>
#include <climits>
#include <cstdio>
#include <cstdlib>
#include <thread>

#include "comm/nccl.h"
#include "comm/watchdog.h"
#include "common/log.h"
#include "engine/device/runtime.h"
#include "engine/parallel/layout_plan.h"

namespace kiln::engine {

LocalPlace local_place(const std::vector<std::string>& hosts, int world_rank) {
  LocalPlace p{0, 0};
  for (int r = 0; r < static_cast<int>(hosts.size()); ++r) {
    if (hosts[r] != hosts[world_rank]) continue;
    if (r < world_rank) ++p.rank;
    ++p.size;
  }
  return p;
}

int cuda_device_for(LocalPlace local, const char* visible) {
  if (visible != nullptr && *visible != '\0' && std::string(visible).find(',') == std::string::npos)
    return 0;  // one GPU bound to this rank by the launcher
  return local.rank;
}

Status cuda_group_error(int world_rank, LocalPlace local, const std::string& host, int device,
                        const Status& why) {
  return Status::config(
             "'cuda' under mpirun: rank " + std::to_string(world_rank) + " (local rank " +
             std::to_string(local.rank) + " of " + std::to_string(local.size) + " on " + host +
             ") cannot use GPU " + std::to_string(device) + ": " + why.message() +
             ". Each rank needs its own GPU (NCCL refuses two ranks on one): " +
             std::to_string(local.size) + " ranks on " + host + " need " +
             std::to_string(local.size) + " GPUs; start fewer ranks per machine or use device: cpu")
      .with_key("device");
}

Status Parallelism::open_device_groups(const ParallelConfig& parallel) {
  comm::ProcessGroup& world = *topo_.world;
  // What the build decides (the same on every rank) first, then the GPU.
  if (const Status nccl = comm::nccl_status(); !nccl.is_ok()) {
    return Status::unimplemented("'cuda' with " + std::to_string(world.size()) +
                                 " ranks needs the NCCL backend for the gradients in GPU memory: " +
                                 nccl.message() + "; run one process, or use device: cpu")
        .with_key("device");
  }
  char name[HOST_NAME_MAX + 1] = {};
  if (gethostname(name, sizeof name - 1) != 0) std::snprintf(name, sizeof name, "unknown");
  KILN_ASSIGN_OR_RETURN(std::vector<std::string> hosts, comm::allgather_strings(world, name));
  const LocalPlace local = local_place(hosts, world.rank());
  cuda_device_ = cuda_device_for(local, std::getenv("CUDA_VISIBLE_DEVICES"));
  // This rank's GPU, before anything is allocated on one (the CUDA backend opens on it), agreed by
  // every rank: one rank without a GPU must not leave the others waiting in NCCL's set-up. No
  // usable GPU is backend_for's error; a missing ordinal says how many GPUs the machine needs.
  Status selected = comm::agree(world, select_cuda_device(cuda_device_));
  if (!selected.is_ok()) {
    if (selected.code() == StatusCode::kUnimplemented) return selected;
    return cuda_group_error(world.rank(), local, name, cuda_device_, selected);
  }
  KILN_RETURN_IF_ERROR(comm::agree(world, runtime_for(Device::kCuda).status()));
  // The NCCL module's CUDA runtime selects the same device (make_nccl_group: cudaSetDevice).
  auto g = comm::make_nccl_group(*topo_.dp, cuda_device_, nullptr);
  if (!g.is_ok()) {
    const Status why = g.status();
    return cuda_group_error(world.rank(), local, name, cuda_device_, why);
  }
  dp_data_ = std::move(g).value();
  dp_data_->set_name(topo_.dp->name());
  if (topo_.tp_size > 1) {  // tensor parallelism: activations, embedding, cross-entropy statistics
    auto t = comm::make_nccl_group(*topo_.tp, cuda_device_, nullptr);
    if (!t.is_ok()) return cuda_group_error(world.rank(), local, name, cuda_device_, t.status());
    tp_data_ = std::move(t).value();
    tp_data_->set_name(topo_.tp->name());
  }
  if (topo_.pp_size > 1) {  // pipeline: activations and their gradients between the stages
    auto p = comm::make_nccl_group(*topo_.pp, cuda_device_, nullptr);
    if (!p.is_ok()) return cuda_group_error(world.rank(), local, name, cuda_device_, p.status());
    pp_data_ = std::move(p).value();
    pp_data_->set_name(topo_.pp->name());
  }
  if (topo_.embed) {  // the tied embedding's gradients between the first and last stage
    auto e = comm::make_nccl_group(*topo_.embed, cuda_device_, nullptr);
    if (!e.is_ok()) return cuda_group_error(world.rank(), local, name, cuda_device_, e.status());
    embed_data_ = std::move(e).value();
    embed_data_->set_name(topo_.embed->name());
  }
  if (parallel.hierarchical) {
    KILN_LOG_INFO(
        "parallel.hierarchical applies to the host groups; on cuda NCCL chooses its own "
        "algorithms across machines");
  }
  KILN_LOG_INFO("rank {}: local rank {} of {} on {}, GPU {}, gradients{} over NCCL", world.rank(),
                local.rank, local.size, name, cuda_device_,
                tp_data_ ? " and tensor-parallel activations" : "");
  return Status::ok();
}

Result<std::unique_ptr<Parallelism>> Parallelism::create(const ParallelConfig& parallel,
                                                         Recompute recompute, Device device) {
  if (comm::launched_by_mpi() && comm::launcher_world_size() > 1 && !comm::mpi_available()) {
    return Status::unimplemented("launched by mpirun with " +
                                 std::to_string(comm::launcher_world_size()) +
                                 " ranks, but this build has no MPI backend (install "
                                 "libopenmpi-dev and rebuild)");
  }
  // engine/parallel/layout_plan.h layout_trainable() is the list of what runs; its messages are
  // here.
  comm::ProcessGroup& world = comm::world();
  comm::TopologyOptions o;
  o.tp = static_cast<int>(parallel.tp);
  o.hierarchical = parallel.hierarchical;
  o.pp = static_cast<int>(parallel.pp);
  KILN_ASSIGN_OR_RETURN(comm::Topology t, comm::make_topology(world, o));
  KILN_CHECK(layout_trainable(Layout{t.tp_size, t.dp_size, parallel.zero_stage, recompute}),
             "a layout refused above is trainable per engine/parallel/layout_plan.h");
  std::unique_ptr<Parallelism> dp(
      new Parallelism(std::move(t), parallel.zero_stage, parallel.prefetch));
  if (world.size() > 1 && parallel.collective_timeout_s > 0) {
    // Every rank starts it here, after the same collectives (it may open a communicator).
    KILN_RETURN_IF_ERROR(comm::start_watchdog(world, parallel.collective_timeout_s));
    KILN_LOG_DEBUG("collective watchdog: {} s", parallel.collective_timeout_s);
  }
  if (device == Device::kCuda && world.size() > 1) {
    KILN_RETURN_IF_ERROR(dp->open_device_groups(parallel));
  }
  return dp;
}

Parallelism::~Parallelism() {
  // Before the groups go: the watchdog may look at an outstanding collective's group.
  if (topo_.world && topo_.world->size() > 1) comm::stop_watchdog();
}

void Parallelism::begin_step(int64_t step) {
  comm::set_watchdog_context("step " + std::to_string(step));
  comm::test_stall(world_rank(), step);
}

Status Parallelism::attach(ParamStore& params, const OptimizerConfig& optimizer,
                           StateSource& source) {
  if (!shards_states()) {
    if (stage_ >= 1) KILN_LOG_INFO("ZeRO-{} with one data-parallel rank: nothing to shard", stage_);
    return params.fill(source);
  }
  // With tensor parallelism: this TP rank's slices, sharded over its data-parallel group.
  KILN_ASSIGN_OR_RETURN(
      zero_, ZeroOptimizer::create(params, source, data_dp(), optimizer, static_cast<int>(stage_),
                                   static_cast<int>(prefetch_), topo_.tp.get(), topo_.dp.get(),
                                   topo_.pp_size > 1 ? topo_.pp.get() : nullptr));
  const uint64_t kept = params.state_bytes(), shards = zero_->shard_bytes();
  // master, gradients, two moments (fp32) and the bf16/fp16 copy of every padded element.
  const uint64_t unsharded =
      params.padded_numel() * (16 + (params.precision() == Precision::kFp32 ? 0 : 2));
  KILN_LOG_INFO(
      "ZeRO-{}: {} sharded over {} ranks; model states on rank 0: {} bytes "
      "({:.1f} MiB: full buffers {:.1f} MiB, shards {:.1f} MiB; ZeRO-0 would hold "
      "{:.1f} MiB)",
      stage_,
      stage_ == 1   ? "AdamW state"
      : stage_ == 2 ? "AdamW state and gradients"
                    : "AdamW state, gradients and weights",
      topo_.dp_size, kept + shards, (kept + shards) / 1048576.0, kept / 1048576.0,
      shards / 1048576.0, unsharded / 1048576.0);
  return Status::ok();
}

Status Parallelism::sum(double* values, size_t n) {
  return topo_.dp->allreduce(values, n, comm::DType::kFloat64, comm::ReduceOp::kSum);
}

Status Parallelism::sum(int64_t* values, size_t n) {
  return topo_.dp->allreduce(values, n, comm::DType::kInt64, comm::ReduceOp::kSum);
}

Status Parallelism::sum_world(int64_t* values, size_t n) {
  return topo_.world->allreduce(values, n, comm::DType::kInt64, comm::ReduceOp::kSum);
}

Status Parallelism::reduce_gradients(ParamStore& params) {
  if (topo_.dp_size == 1) return Status::ok();
  for (size_t i = 0; i < params.units().size(); ++i) {
    if (!params.holds(static_cast<int>(i))) continue;  // another pipeline stage's
    ParamUnit& u = params.units()[i];
    KILN_RETURN_IF_ERROR(
        data_dp()
            .allreduce(u.grad.data(), u.numel, comm::DType::kFloat32, comm::ReduceOp::kSum)
            .prefixed("gradient all-reduce of " + u.name));
  }
  return Status::ok();
}

Status Parallelism::sum_tied_embedding(ParamStore& params) {
  comm::ProcessGroup* e = data_embed();
  if (!e || !params.model().tie_embeddings || !params.holds(0)) return Status::ok();
  ParamUnit& u = params.units()[0];
  return e->allreduce(u.grad.data(), u.numel, comm::DType::kFloat32, comm::ReduceOp::kSum)
      .prefixed("tied embedding gradient sum between the first and last pipeline stage");
}

Status Parallelism::agree(Status local) { return comm::agree(*topo_.world, std::move(local)); }

Status Parallelism::broadcast(std::string* blob) {
  return comm::bcast_string(*topo_.world, blob, 0);
}

Result<std::vector<std::string>> Parallelism::gather(const std::string& mine) {
  return comm::gather_strings(*topo_.dp, mine, 0);
}

Result<std::vector<std::string>> Parallelism::gather_world(const std::string& mine) {
  return comm::gather_strings(*topo_.world, mine, 0);
}

std::map<std::string, uint64_t> Parallelism::comm_bytes() const {
  std::map<std::string, uint64_t> out;
  std::vector<const comm::ProcessGroup*> groups = topo_.groups();
  if (dp_data_) groups.push_back(dp_data_.get());  // its bytes add to the host group's name
  if (tp_data_) groups.push_back(tp_data_.get());
  if (pp_data_) groups.push_back(pp_data_.get());
  if (embed_data_) groups.push_back(embed_data_.get());
  for (const comm::ProcessGroup* g : groups) {
    for (const auto& [op, c] : g->counters()) {
      if (c.bytes) out[g->name() + "." + op] += c.bytes;
    }
  }
  return out;
}

ShardContent Parallelism::checkpoint_shard(const ParamStore& params) {
  ZeroOptimizer* z = zero();
  ShardContent c;
  c.writes = z != nullptr || rank() == 0;
  c.index = z != nullptr ? rank() : 0;
  c.tp_rank = tp_rank();
  c.views = [z, &params](std::deque<std::vector<float>>* scratch) {
    return z != nullptr ? owned_views(params, z->checkpoint_partition(scratch))
                        : unit_partition(params, scratch);
  };
  return c;
}

}  // namespace kiln::engine
