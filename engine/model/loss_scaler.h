// Dynamic loss scaling for fp16 training (DeepSpeed / Megatron semantics).
//
// The loss is multiplied by scale() before backward; gradients are divided by it before clipping
// and the update. update(found_overflow) is called once per optimizer step:
//  - overflow: the step is skipped by the caller; the clean-step counter restarts; one unit of
//    hysteresis is spent, and once none is left the scale is multiplied by backoff_factor (never
//    below min_scale). With hysteresis 1 every overflow backs off at once.
//  - clean: after growth_interval consecutive clean steps the scale is multiplied by
//    growth_factor and the hysteresis is refilled.
// A disabled scaler (fp32, bf16) has scale 1 and never changes. Not thread-safe.
#pragma once

#include <cstdint>

#include "engine/config/precision.h"

namespace kiln::engine {

class LossScaler {
 public:
  struct State {
    double scale = 1.0;
    int64_t clean_steps = 0;  // consecutive clean steps since the last growth/overflow
    int64_t hysteresis_left = 0;
    int64_t overflows = 0;  // total overflows seen (skipped steps)
  };

  LossScaler() = default;
  LossScaler(const LossScaleConfig& config, bool enabled);

  bool enabled() const { return enabled_; }
  double scale() const { return state_.scale; }
  // Applies one step's outcome. Returns true when the scale changed.
  bool update(bool found_overflow);

  const State& state() const { return state_; }
  void set_state(const State& s) { state_ = s; }

 private:
  LossScaleConfig config_;
  bool enabled_ = false;
  State state_;
};

}  // namespace kiln::engine
