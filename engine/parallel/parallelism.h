// Internal to engine/ (used by the trainer): the run's parallelism, every dimension of it - the
// ranks of `mpirun` and their data, tensor and pipeline groups (comm/topology.h), ZeRO's sharded
// states (zero()), what each rank writes into a sharded checkpoint (checkpoint_shard()), and
// every value the ranks must agree on. (Named DataParallel until issue 38: it always held more.)
//
// Parallelism::create() builds the topology (comm/topology.h) over the world: one process
// without mpirun, N ranks under it. Each data-parallel rank reads its own part of the data
// (DataRank); gradients are summed across ranks unit by unit (embeddings, each block, the final
// norm: one all-reduce each, deterministic rank-order sums, so every rank holds the same bits
// and takes the same clip / overflow decision); losses, token counts and per-domain sums are
// summed the same way before they are logged. Rank 0 alone writes the run directory's files;
// decisions it makes alone (the live mixture file) are broadcast. A failure on one rank becomes
// an error on every rank that names it (agree()), so no rank hangs in a collective.
//
// Implemented: ZeRO stages 0-3 (engine/parallel/zero.h), tensor parallelism
// (engine/parallel/tensor_parallel.h, over tp_group()) and pipeline parallelism
// (engine/parallel/pipeline.h, over pp_group(); with ZeRO 0-1 only), together in any combination
// (ZeRO shards each TP rank's slices of its stage's units over its DP group).
//
// Two kinds of groups, chosen once here: the host groups (MPI under mpirun) carry every value the
// host holds (losses, token and per-domain counts, the gradient norm's scalars, the control file,
// checkpoint digests, failures), and the data group data_dp() carries the model's buffers (the
// Runtime's memory: gradients, ZeRO's shards and gathers). On the CPU the data group is the host
// group; with `device: cuda` under mpirun it is an NCCL group over the same ranks, bootstrapped
// through the MPI group, on the GPU of the rank's local index on its machine (cuda_device_for).
// The code that issues the collectives is the same for both. With tensor parallelism on cuda the
// TP group has its NCCL twin too (data_tp()): activation sums, the vocabulary-parallel embedding
// and the cross-entropy statistics stay on the GPU.
// Not thread-safe: the training thread owns it.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "comm/topology.h"
#include "common/status.h"
#include "engine/checkpoint/sharded_save.h"
#include "engine/config/memory.h"
#include "engine/config/optimizer.h"
#include "engine/config/parallel.h"
#include "engine/data/data_source.h"
#include "engine/model/params.h"
#include "engine/parallel/zero.h"
#include "kernels/ops.h"

namespace kiln::engine {

// A rank's place on its machine: its index among the world ranks on the same host (in rank
// order), and how many there are. hosts: every world rank's host name, in rank order.
struct LocalPlace {
  int rank = 0;
  int size = 1;
};
LocalPlace local_place(const std::vector<std::string>& hosts, int world_rank);
// The CUDA device a rank uses: its local rank, or 0 when CUDA_VISIBLE_DEVICES (visible, may be
// nullptr) names exactly one device (the launcher bound one GPU to each rank).
int cuda_device_for(LocalPlace local, const char* visible);
// The config error (key `device`) when rank `world_rank`, local rank local.rank of local.size on
// `host`, cannot use GPU `device` (it does not exist, or NCCL could not be set up on it): names
// the GPUs the machine needs.
Status cuda_group_error(int world_rank, LocalPlace local, const std::string& host, int device,
                        const Status& why);

class Parallelism final : public ShardedSaveGroup {
 public:
  // `parallel`: the layout; `recompute` (activation_checkpointing) and `device` decide what it
  // can run and which groups it opens.
  static Result<std::unique_ptr<Parallelism>> create(const ParallelConfig& parallel,
                                                     Recompute recompute, Device device);

  int rank() const { return topo_.dp_rank; }
  int size() const { return topo_.dp_size; }
  bool is_root() const override { return topo_.world->rank() == 0; }
  int world_rank() const { return topo_.world->rank(); }
  int world_size() const { return topo_.world->size(); }
  // The ranks that split each layer with this one (tensor parallelism; one rank when tp is 1).
  comm::ProcessGroup& tp_group() { return *topo_.tp; }
  // The data-parallel ranks over the model's memory (see the header comment): the MPI group on
  // the CPU, an NCCL group with device: cuda under mpirun.
  comm::ProcessGroup& data_dp() { return dp_data_ ? *dp_data_ : *topo_.dp; }
  // The tensor-parallel ranks over the model's memory: tp_group() on the CPU, its NCCL twin with
  // device: cuda under mpirun.
  comm::ProcessGroup& data_tp() { return tp_data_ ? *tp_data_ : *topo_.tp; }
  // The CUDA device this rank uses (-1 on the CPU or in one process).
  int cuda_device() const { return cuda_device_; }
  DataRank data_rank() const { return DataRank{topo_.dp_rank, topo_.dp_size}; }
  const char* backend() const { return topo_.world->backend(); }

  // In-place sums over the data-parallel ranks.
  Status sum(double* values, size_t n);
  Status sum(int64_t* values, size_t n);
  // In-place sum over every rank (a decision every rank must take: the stop signals).
  Status sum_world(int64_t* values, size_t n);
  // Sums every unit's fp32 gradients over the data-parallel ranks (ZeRO-0): the units this
  // rank's pipeline stage holds (all of them without a pipeline).
  Status reduce_gradients(ParamStore& params);
  // Everyone gets an error if anyone failed (the message names the failing rank).
  Status agree(Status local) override;
  // Root's value on every rank.
  Status broadcast(std::string* blob) override;
  // Every data-parallel rank's blob, in rank order, on the root only.
  Result<std::vector<std::string>> gather(const std::string& mine);
  // Every rank's blob (the world), in world-rank order, on the root only.
  Result<std::vector<std::string>> gather_world(const std::string& mine) override;
  // What this rank writes into a sharded checkpoint: with ZeRO-1/2/3 every rank its shards of the
  // units its stage owns, else data-parallel rank 0 of each TP rank and stage its slices.
  ShardContent checkpoint_shard(const ParamStore& params);
  int tp_rank() const { return topo_.tp_rank; }
  int tp_size() const { return topo_.tp_size; }

  // Pipeline parallelism (engine/parallel/pipeline.h; parallel.pp, comm/topology.h): this rank's
  // stage and the stage count; the stages of its pipeline over host memory (pp_group()) and over
  // the model's memory (data_pp(): the NCCL twin with device: cuda under mpirun); the first and
  // last stage's pair for the tied embedding's gradients (nullptr on middle stages and with one
  // stage), likewise twice.
  int pp_rank() const { return topo_.pp_rank; }
  int pp_size() const { return topo_.pp_size; }
  comm::ProcessGroup& pp_group() { return *topo_.pp; }
  comm::ProcessGroup& data_pp() { return pp_data_ ? *pp_data_ : *topo_.pp; }
  comm::ProcessGroup* embed_group() { return topo_.embed.get(); }
  comm::ProcessGroup* data_embed() { return embed_data_ ? embed_data_.get() : topo_.embed.get(); }
  // Sums every held unit's fp32 gradients of the tied embedding (unit 0) over the embed pair
  // (the first stage's embedding gradient plus the last stage's LM-head gradient: both copies
  // then take the same update). Nothing without a pipeline or on middle stages.
  Status sum_tied_embedding(ParamStore& params);

  // True when this rank keeps only shards of its model states (ZeRO-1/2/3 with more than one
  // data-parallel rank): its ParamStore is then made without buffers (allocate = false).
  bool shards_states() const { return stage_ >= 1 && topo_.dp_size > 1; }
  // Builds the model states from `source` (the initialisation, a checkpoint, a consolidated
  // file): with shards_states() each rank computes or reads only its shards and the full
  // buffers its stage keeps (ZeroOptimizer::create: the peak is the rank's own states plus a
  // bounded staging buffer, never the unsharded states); else params (with buffers) is filled.
  // Logs the model-state bytes this rank holds. Stages 2-3 also need the model to call zero()'s
  // unit hooks (Model::set_unit_hooks).
  Status attach(ParamStore& params, const OptimizerConfig& optimizer, StateSource& source);
  // The sharded model states, or nullptr (ZeRO-0, or one data-parallel rank).
  ZeroOptimizer* zero() { return zero_.get(); }

  // Bytes moved so far by each collective of every group ("dp.all_reduce", ...).
  std::map<std::string, uint64_t> comm_bytes() const;
  // Called at the start of every training step: names the step in the collective watchdog's
  // messages. Test-only hook: KILN_TEST_STALL=RANK:STEP:SECONDS makes world rank RANK sleep
  // SECONDS before the first collective of step STEP (a rank that stops arriving).
  void begin_step(int64_t step);
  ~Parallelism();

 private:
  Parallelism(comm::Topology t, int64_t stage, int64_t prefetch)
      : topo_(std::move(t)), stage_(stage), prefetch_(prefetch) {}
  // device: cuda under mpirun: binds this rank to its GPU and opens the NCCL data group.
  Status open_device_groups(const ParallelConfig& parallel);
  comm::Topology topo_;
  std::unique_ptr<comm::ProcessGroup> dp_data_;     // NCCL, with device: cuda under mpirun
  std::unique_ptr<comm::ProcessGroup> tp_data_;     // NCCL, with device: cuda and parallel.tp > 1
  std::unique_ptr<comm::ProcessGroup> pp_data_;     // NCCL, with device: cuda and parallel.pp > 1
  std::unique_ptr<comm::ProcessGroup> embed_data_;  // NCCL, where embed_group() is
  int cuda_device_ = -1;
  int64_t stage_ = 0;
  int64_t prefetch_ = 1;
  std::unique_ptr<ZeroOptimizer> zero_;
};

}  // namespace kiln::engine
