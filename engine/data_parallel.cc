#include "engine/data_parallel.h"

#include "common/log.h"
#include "engine/plan.h"

namespace kiln::engine {

Result<std::unique_ptr<DataParallel>> DataParallel::create(const TrainConfig& config) {
  if (comm::launched_by_mpi() && comm::launcher_world_size() > 1 && !comm::mpi_available()) {
    return Status::unimplemented("launched by mpirun with " +
                                 std::to_string(comm::launcher_world_size()) +
                                 " ranks, but this build has no MPI backend (install "
                                 "libopenmpi-dev and rebuild)");
  }
  // engine/plan.h layout_trainable() is the list of what runs; its messages are here.
  comm::ProcessGroup& world = comm::world();
  comm::TopologyOptions o;
  o.tp = static_cast<int>(config.parallel.tp);
  o.hierarchical = config.parallel.hierarchical;
  KILN_ASSIGN_OR_RETURN(comm::Topology t, comm::make_topology(world, o));
  KILN_CHECK(layout_trainable(Layout{t.tp_size, t.dp_size, config.parallel.zero_stage,
                                     config.activation_checkpointing}),
             "a layout refused above is trainable per engine/plan.h");
  return std::unique_ptr<DataParallel>(new DataParallel(std::move(t), config.parallel.zero_stage,
                                                         config.parallel.prefetch));
}

Status DataParallel::attach(ParamStore& params, const OptimizerConfig& optimizer) {
  if (stage_ >= 1 && topo_.dp_size > 1) {
    const uint64_t before = params.state_bytes();
    // With tensor parallelism: this TP rank's slices, sharded over its data-parallel group.
    zero_ = std::make_unique<ZeroOptimizer>(params, *topo_.dp, optimizer, static_cast<int>(stage_),
                                            static_cast<int>(prefetch_), topo_.tp.get());
    const uint64_t kept = params.state_bytes(), shards = zero_->shard_bytes();
    KILN_LOG_INFO("ZeRO-{}: {} sharded over {} ranks; model states on rank 0: {} bytes "
                  "({:.1f} MiB: full buffers {:.1f} MiB, shards {:.1f} MiB; ZeRO-0 would hold "
                  "{:.1f} MiB)",
                  stage_,
                  stage_ == 1   ? "AdamW state"
                  : stage_ == 2 ? "AdamW state and gradients"
                                : "AdamW state, gradients and weights",
                  topo_.dp_size, kept + shards, (kept + shards) / 1048576.0, kept / 1048576.0,
                  shards / 1048576.0, before / 1048576.0);
  } else if (stage_ >= 1) {
    KILN_LOG_INFO("ZeRO-{} with one data-parallel rank: nothing to shard", stage_);
  }
  return Status::ok();
}

Status DataParallel::sum(double* values, size_t n) {
  return topo_.dp->allreduce(values, n, comm::DType::kFloat64, comm::ReduceOp::kSum);
}

Status DataParallel::sum(int64_t* values, size_t n) {
  return topo_.dp->allreduce(values, n, comm::DType::kInt64, comm::ReduceOp::kSum);
}

Status DataParallel::reduce_gradients(ParamStore& params) {
  if (topo_.dp_size == 1) return Status::ok();
  for (auto& u : params.units()) {
    KILN_RETURN_IF_ERROR(topo_.dp->allreduce(u.grad.data(), u.numel, comm::DType::kFloat32,
                                             comm::ReduceOp::kSum)
                             .prefixed("gradient all-reduce of " + u.name));
  }
  return Status::ok();
}

Status DataParallel::agree(Status local) { return comm::agree(*topo_.world, std::move(local)); }

Status DataParallel::broadcast(std::string* blob) { return comm::bcast_string(*topo_.world, blob, 0); }

Result<std::vector<std::string>> DataParallel::gather(const std::string& mine) {
  return comm::gather_strings(*topo_.dp, mine, 0);
}

Result<std::vector<std::string>> DataParallel::gather_world(const std::string& mine) {
  return comm::gather_strings(*topo_.world, mine, 0);
}

std::map<std::string, uint64_t> DataParallel::comm_bytes() const {
  std::map<std::string, uint64_t> out;
  for (const comm::ProcessGroup* g : topo_.groups()) {
    for (const auto& [op, c] : g->counters()) {
      if (c.bytes) out[g->name() + "." + op] += c.bytes;
    }
  }
  return out;
}

}  // namespace kiln::engine
