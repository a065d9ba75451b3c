// AdamW over a ParamStore, with global-norm clipping, the inf/NaN check and loss-scale unscaling.
//
// step(): the gradients in the store are those of loss * loss_scale, summed over the step's
// micro-batches with dloss = loss_scale / tokens. One fused pass computes the global L2 norm
// (fp64 sum of squares over all units, fixed order: independent of threads) and detects inf/NaN;
// the true norm is that / loss_scale. With a finite norm the update uses
// grad_scale = (1 / loss_scale) * min(1, clip / (norm + 1e-6)) (torch.nn.utils.clip_grad_norm_),
// per tensor with its own weight decay (0 for biases and norm gains unless configured), and
// refreshes the low-precision working copy. A non-finite norm leaves parameters and moments
// untouched (the caller skips the step). Not thread-safe.
#pragma once

#include <cstdint>

#include "engine/config/optimizer.h"
#include "engine/model/params.h"
#include "kernels/ops.h"

namespace kiln::engine {

struct StepStats {
  double grad_norm = 0;  // global L2 norm of the unscaled gradients (inf/NaN on overflow)
  double clip_coef = 1;  // factor applied by clipping (1 when not clipped)
  bool finite = true;    // false: inf/NaN found, no update was made
};

// The AdamW hyper-parameters of one update: the config's betas and eps, learning rate lr, bias
// correction for update number `step`, and grad_scale = clip_coef / loss_scale (weight decay is per
// tensor: the caller sets it).
AdamWParams adamw_params(const OptimizerConfig& config, double lr, double loss_scale,
                         const StepStats& stats, int64_t step);

class AdamW {
 public:
  explicit AdamW(const OptimizerConfig& config) : config_(config) {}

  // Inspects the gradients and, when finite, updates with learning rate lr.
  StepStats step(ParamStore& params, double lr, double loss_scale);
  // The two halves of step(): global norm, finiteness and clip factor ...
  StepStats inspect(const ParamStore& params, double loss_scale) const;
  // The same from the sum of squares of every (scaled) gradient, summed elsewhere (sharded
  // parameters: engine/parallel/tensor_parallel.h).
  StepStats stats_from_sum_squares(double sum_squares, double loss_scale) const;
  // ... and the update itself (stats.finite must be true).
  void apply(ParamStore& params, double lr, double loss_scale, const StepStats& stats);

  // Number of updates applied (AdamW's t, for bias correction); checkpointed.
  int64_t updates() const { return updates_; }
  void set_updates(int64_t t) { updates_ = t; }

 private:
  OptimizerConfig config_;
  int64_t updates_ = 0;
};

}  // namespace kiln::engine
