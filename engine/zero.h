// ZeRO stage 1: AdamW's state sharded over the data-parallel ranks.
//
// Every parameter unit (ParamStore) of N elements is split into dp shards of S =
// shard_numel(N, dp) elements (engine/plan.h); rank r owns elements [r*S, r*S + S) ∩ [0, N).
// After backward, each unit's fp32 gradients are reduce-scattered (a rank-order sum, as
// comm/comm.h) so a rank holds the summed gradients of its shard only; the global gradient norm
// is the sum of every shard's squares (fp64, summed over ranks) - every element counted once,
// every rank the same decision; AdamW updates the shard's master weights and moments (the
// moments exist only for the shard: the ParamStore's full moment buffers are released), and the
// updated working weights (fp32 master, or the bf16/fp16 copy) are all-gathered. Bytes per step:
// a reduce-scatter of 4N and an all-gather of eN per unit - 2x the gradient bytes in fp32.
//
// Checkpoints keep ZeRO-0's consolidated format: consolidate() gathers the moments (and, in
// bf16/fp16, the master weights) onto rank 0's ParamStore for the write, release() frees them
// after; load into the full ParamStore first, then attach(), so a checkpoint of any data-parallel
// size and ZeRO stage resumes on any other.
// Not thread-safe: the training thread owns it.
#pragma once

#include <cstdint>
#include <vector>

#include "comm/comm.h"
#include "common/status.h"
#include "engine/optimizer.h"
#include "engine/params.h"
#include "engine/train_config.h"

namespace kiln::engine {

class ZeroOptimizer {
 public:
  // Takes this rank's shard of the moments from params (full, e.g. just loaded) and releases the
  // full moment buffers. dp must outlive this object.
  ZeroOptimizer(ParamStore& params, comm::ProcessGroup& dp, const OptimizerConfig& config);

  // Reduce-scatters every unit's gradients into this rank's shards.
  Status reduce_scatter_gradients(ParamStore& params);
  // Global norm (every rank's shards), finiteness and clip factor, as AdamW::inspect.
  Result<StepStats> inspect(double loss_scale);
  // AdamW on the shards (step = the update count after this one), then all-gathers the weights.
  Status apply(ParamStore& params, double lr, double loss_scale, const StepStats& stats,
               int64_t step);

  // Rank 0's ParamStore gets the full moments (and master weights); every rank must call it.
  Status consolidate(ParamStore& params);
  // Frees what consolidate() allocated.
  void release(ParamStore& params);

  // fp32 bytes this rank holds for the optimizer (shard gradients, moments).
  uint64_t shard_bytes() const;

 private:
  struct Shard {
    size_t numel = 0;   // the unit's N
    size_t size = 0;    // S
    size_t begin = 0;   // r*S
    DeviceArray<float> grad, m, v;  // host memory (cpu_backend): ZeRO runs on the CPU
  };
  Status allgather_unit(void* full, size_t elem, size_t numel, size_t shard);

  comm::ProcessGroup& dp_;
  OptimizerConfig config_;
  std::vector<Shard> shards_;
  std::vector<char> scratch_;
};

}  // namespace kiln::engine
