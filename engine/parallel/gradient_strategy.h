// Internal to engine/ (used by the trainer): what a step does with its gradients under the run's
// parallelism, chosen once when the trainer opens (make_gradient_strategy) - the step asks no
// layout question again. One strategy per kind of layout:
//   plain     one rank, data parallelism or tensor parallelism over whole units (ZeRO-0, pp 1):
//             all-reduced gradients, AdamW over every tensor (TP: the norm over every rank's
//             slices, TensorParallel::inspect)
//   zero      ZeRO-1/2/3 (with or without a pipeline): the sharded gradients, norm and update of
//             engine/parallel/zero.h
//   pipeline  pipeline stages without ZeRO: the norm summed over the stages' units, AdamW over
//             this stage's units, inf/NaN counts over the stages
// Every strategy sums the tied embedding's two stage copies first (a no-op without a pipeline).
// Not thread-safe: the training thread owns it; it refers to the trainer's parallelism, params,
// optimizer and tensor parallelism, which outlive it.
#pragma once

#include <memory>

#include "common/status.h"
#include "engine/config/optimizer.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "engine/stability/monitor.h"

namespace kiln::engine {

class Parallelism;
class TensorParallel;

class GradientStrategy {
 public:
  virtual ~GradientStrategy() = default;
  virtual const char* name() const = 0;  // "plain" | "zero" | "pipeline"
  // Before backward: clears the gradients this strategy keeps beside params' (ZeRO's shards).
  virtual void zero_grads() {}
  // After backward: the gradients summed over the data-parallel ranks (the tied embedding's
  // stage copies first).
  virtual Status reduce() = 0;
  // Milliseconds spent waiting for collectives during backward (ZeRO-2/3), since the last call.
  virtual double take_wait_ms() { return 0; }
  // Whether every rank holds whole units' gradients (per-layer statistics and clipping need it).
  virtual bool whole_units() const { return false; }
  // The global gradient norm and the overflow check: the same decision on every rank.
  virtual Result<StepStats> inspect(double loss_scale) = 0;
  // The AdamW update of the weights this rank keeps (the optimizer's update count advances).
  virtual Status apply(double lr, double loss_scale, const StepStats& stats) = 0;
  // After an overflow: how many inf/NaN values, and the first unit in backward order.
  virtual Result<NonFinite> find_nonfinite() = 0;
  // The gradient value the overflow test hook sets to +inf (stability.inject_overflow_at).
  virtual float* overflow_target() = 0;
};

// The strategy of `par`'s layout (ZeRO stage, pipeline stages), over params and optimizer; tp:
// the run's tensor parallelism (nullptr without).
std::unique_ptr<GradientStrategy> make_gradient_strategy(Parallelism& par, ParamStore& params,
                                                         AdamW& optimizer,
                                                         const OptimizerConfig& config,
                                                         TensorParallel* tp);

}  // namespace kiln::engine
