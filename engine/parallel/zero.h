// Internal to engine/ (used by the trainer): ZeRO stages 1-3: model states sharded over the
// data-parallel ranks.
//
// Every parameter unit (ParamStore: embed, blocks.l, final) of N elements is split into dp shards
// of S = shard_numel(N, dp) elements (engine/parallel/layout_plan.h); rank r owns elements [r*S,
// r*S + S) ∩ [0, N). Each rank keeps, for its shard only: the summed fp32 gradients, the AdamW
// moments, the fp32 master weights (ZeRO-3; in bf16/fp16 at every stage, as they are then optimizer
// state) and (ZeRO-3, bf16/fp16) the low-precision working copy.
//   stage 1  after backward, each unit's full local gradients are reduce-scattered (a rank-order
//            sum, as comm/comm.h) into the shard; AdamW updates the shard; the updated working
//            weights (fp32 master, or the bf16/fp16 copy) are all-gathered into the full
//            ParamStore buffers. Bytes per step: RS 4N + AG eN per unit.
//   stage 2  as 1, but a unit's full gradient buffer exists only while backward writes it: the
//            model tells (UnitHooks, engine/model/model.h) when a unit's gradients of a micro-batch
//            are final, the buffer is reduce-scattered (asynchronously, overlapping the next unit's
//            backward) and added into the shard, then freed. Per micro-batch: RS 4N.
//   stage 3  as 2, and the weights are sharded too: a unit's working weights are all-gathered
//            just before the model reads them (forward, then again for backward), freed after,
//            and the next parallel.prefetch units of the pass are gathered ahead with the
//            asynchronous collectives. Per micro-batch: AG 2eN + RS 4N; no gather after AdamW.
// The global gradient norm is the sum of every shard's squares (fp64, summed over ranks): every
// element counted once, every rank the same clip/overflow decision.
//
// With tensor parallelism (engine/parallel/tensor_parallel.h) the ParamStore holds this TP rank's
// slices and the data-parallel group is the ranks of the same TP rank, so each TP rank's own units
// are sharded over its DP group. The norm then adds the TP group's sums too, counting the
// replicated tensors (norms, wpe, row-parallel biases: the same on every TP rank) on TP rank 0
// only; an inf/NaN anywhere still reaches every rank, so the overflow decision is one.
//
// With pipeline parallelism (engine/parallel/pipeline.h; stage 1 only) the ParamStore holds one
// stage's units: only those are sharded (the others have no shard, no buffer, no checkpoint
// entry), and the norm and the inf/NaN count add the stages' sums over `pp`, counting the tied
// embedding (held by the first and last stage, identical) on the first stage only.
//
// Checkpoints are per rank (engine/checkpoint/checkpoint.h): each rank writes its shards of the
// master weights and moments (checkpoint_partition()); on resume create() reads the rank's shard of
// any checkpoint's partitions in byte ranges (CheckpointReader), so a checkpoint of any
// data-parallel size, ZeRO stage or TP size resumes on any other without a rank holding more
// than its own states.
//
// Memory: the shards and every buffer live in params.runtime()'s memory, and the collectives on
// them go over `dp`, the group that carries that memory (engine/parallel/parallelism.h chooses it
// once: an MPI group on the CPU, an NCCL group on a GPU); the norm's and the overflow count's
// scalars go over `dp_host` (and `tp`), host-memory groups of the same ranks. Nothing here branches
// on the device. Not thread-safe: the training thread owns it.
#pragma once

#include <cstdint>
#include <deque>
#include <memory>
#include <vector>

#include "comm/comm.h"
#include "common/status.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/config/optimizer.h"
#include "engine/config/precision.h"
#include "engine/model/model.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "engine/stability/monitor.h"

namespace kiln::engine {

class ZeroOptimizer final : public UnitHooks {
 public:
  // Builds this rank's model states from `source` (the initialisation, a checkpoint): reads or
  // computes only the rank's shard of what the stage shards - the moments (1+), the gradients
  // (2+), the weights (3; in bf16/fp16 the fp32 master weights at every stage) - and the full
  // buffers the stage keeps (stages 1-2: the working weights, read whole; stage 1: the gradient
  // buffers), so the rank never holds the unsharded states (DeepSpeed's zero.Init). params must
  // have been made without buffers (ParamStore allocate = false). Host staging: at most
  // kStateChunk elements (none on the CPU). params and dp must outlive this object. prefetch:
  // units gathered ahead (stage 3). tp: the tensor-parallel group over host memory (nullptr or
  // one rank: none). dp_host: the data-parallel ranks over host memory (nullptr: dp itself, when
  // dp carries host memory). Both must outlive this object.
  static Result<std::unique_ptr<ZeroOptimizer>> create(
      ParamStore& params, StateSource& source, comm::ProcessGroup& dp,
      const OptimizerConfig& config, int stage, int prefetch, comm::ProcessGroup* tp = nullptr,
      comm::ProcessGroup* dp_host = nullptr, comm::ProcessGroup* pp = nullptr);
  ~ZeroOptimizer() override;

  int stage() const { return stage_; }
  // Reads this rank's states again from `source` into the buffers it holds (as create does;
  // between steps): a rollback to a checkpoint (CheckpointReader). Gradients are zeroed.
  Status reload(StateSource& source) { return load(source); }

  // Before a step's first micro-batch: zeroes the gradient shards.
  void zero_grads();
  // After the last micro-batch. Stage 1: reduce-scatters every unit's gradients into the shards;
  // stages 2-3: the error, if any, of the reductions done during backward.
  Status reduce_scatter_gradients();
  // Global norm (every rank's shards), finiteness and clip factor, as AdamW::inspect.
  Result<StepStats> inspect(double loss_scale);
  // Non-finite gradient values over every rank's shards, the first unit in backward order.
  Result<NonFinite> find_nonfinite();
  // Element 0 of this rank's gradient shard of `unit` (testing hooks inject overflows there).
  float* shard_grad(int unit) { return shards_[unit].grad.data(); }
  // AdamW on the shards (step = the update count after this one); stages 1-2 then all-gather
  // the working weights.
  Status apply(double lr, double loss_scale, const StepStats& stats, int64_t step);

  // This rank's partition of a checkpoint: "<unit>.master", "<unit>.exp_avg",
  // "<unit>.exp_avg_sq" (fp32, [S] each). Views into the shards, or into *scratch (the padded
  // end of a stage 1-2 master buffer), valid until either changes.
  std::vector<TensorView> checkpoint_partition(std::deque<std::vector<float>>* scratch) const;

  // Model-state bytes this rank holds outside the ParamStore (the shards).
  uint64_t shard_bytes() const;
  // The most bytes the full-unit buffers (gathered weights, gradients before their reduction;
  // in use or kept idle for reuse) held at once (stages 2-3), since construction.
  uint64_t peak_buffer_bytes() const { return peak_buffers_; }
  // Milliseconds spent waiting for the collectives started during forward/backward since the
  // last call (the part of their time not hidden behind compute); resets the count.
  double take_wait_ms();

  // UnitHooks (stages 2-3; the model calls them).
  void begin_pass(const std::vector<int>& order) override;
  void acquire(int unit, bool backward) override;
  void release(int unit) override;
  void gradients_ready(int unit) override;
  void end_pass() override;

 private:
  ZeroOptimizer(ParamStore& params, comm::ProcessGroup& dp, const OptimizerConfig& config,
                int stage, int prefetch, comm::ProcessGroup* tp, comm::ProcessGroup* dp_host,
                comm::ProcessGroup* pp);
  // Whether this rank's stage holds unit i (pipeline parallelism; always without).
  bool held(size_t i) const { return params_.holds(static_cast<int>(i)); }
  // Whether the norm and the inf/NaN count take unit i here: held, and the tied embedding once
  // (the first stage's; the last stage's copy is identical).
  bool counted(size_t i) const { return held(i) && !(i == 0 && pp_ && pp_->rank() > 0); }
  // Allocates the shards and the full buffers the stage keeps, then load()s them.
  Status build(StateSource& source);
  Status load(StateSource& source);
  enum class Weights { kAbsent, kInFlight, kResident };
  struct Shard {
    size_t numel = 0;               // the unit's N
    size_t size = 0;                // S
    size_t begin = 0;               // r*S
    DeviceArray<float> grad, m, v;  // params.runtime()'s memory, as every buffer here
    DeviceArray<float> master;      // master_sharded()
    DeviceArray<uint16_t> lp;       // stage 3, bf16/fp16
    Weights weights = Weights::kResident;
    std::unique_ptr<comm::Work> gather;
  };
  struct PendingScatter {
    int unit = -1;
    std::unique_ptr<comm::Work> work;
    DeviceArray<float> recv;
  };
  Status allgather_unit(void* full, size_t elem, size_t numel, size_t shard);
  // A zero-filled scratch buffer of at least `bytes` in the runtime's memory (reused).
  char* scratch(size_t bytes);
  // Only the shard of the fp32 master weights exists: stage 3, or bf16/fp16 (where the working
  // weights are the low-precision copy).
  bool master_sharded() const { return stage_ == 3 || params_.precision() != Precision::kFp32; }
  void start_gather(int unit);
  void finish_gather(int unit);
  void finish_scatter();
  void note(Status st);
  // Calls fn(begin, end, counted) for the runs of shard i (shard-relative, in order) that hold
  // tensor elements: counted is false for replicated tensors on TP ranks other than 0.
  template <typename Fn>
  void for_each_run(size_t i, Fn fn) const;
  void track(int64_t delta);
  template <typename T>
  void take(std::vector<DeviceArray<T>>& spares, DeviceArray<T>& dst, size_t n);
  template <typename T>
  void give(std::vector<DeviceArray<T>>& spares, DeviceArray<T>& src);

  ParamStore& params_;
  Runtime& rt_;                  // params_.runtime()
  comm::ProcessGroup& dp_;       // carries be_'s memory
  comm::ProcessGroup& dp_host_;  // the same ranks over host memory (scalars)
  comm::ProcessGroup* tp_;       // nullptr without tensor parallelism
  comm::ProcessGroup* pp_;       // the pipeline's stages (host memory); nullptr without
  OptimizerConfig config_;
  int stage_;
  int prefetch_;
  std::vector<Shard> shards_;
  DeviceArray<float> scratch_;
  std::vector<int> order_;
  size_t cursor_ = 0;
  PendingScatter pending_;
  std::vector<DeviceArray<float>> spare_f32_;     // idle gradient / fp32 weight buffers
  std::vector<DeviceArray<uint16_t>> spare_u16_;  // idle bf16/fp16 weight buffers
  Status status_ = Status::ok();
  double wait_ms_ = 0;
  int64_t buffers_ = 0;
  uint64_t peak_buffers_ = 0;
};

}  // namespace kiln::engine
