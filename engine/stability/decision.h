// Internal to engine/ (used by engine/train/trainer.cc): what a training step does with its
// gradients once they are known (config section `stability`): update, warn and update, skip, roll
// back, or stop the run. Pure functions of the config, the step's signals and the counters so far -
// the trainer carries the decision out (engine/train/trainer.cc), these say which it is and why.
// Thread-safe (no state).
//
// Finite gradients: a spike (SpikeDetector::check) takes stability.spike.action - warn (update
// anyway), skip, or rollback while fewer than stability.spike.max_rollbacks have been used
// (then skip). No spike: update.
// Non-finite gradients: the step is skipped (the fp16 loss scaler backs off) unless neither loss
// scaling nor stability.skip_nonfinite allows it (stop), and stability.max_nonfinite_in_row
// such steps in a row stop the run.
#pragma once

#include <cstdint>
#include <string>

#include "engine/config/stability.h"
#include "engine/stability/monitor.h"

namespace kiln::engine {

enum class StepAction {
  kUpdate,        // apply the optimizer (also after a spike whose action is warn)
  kSkipSpike,     // a spike: no update
  kRollback,      // a spike: back to the last checkpoint, the data since then quarantined
  kSkipOverflow,  // inf/NaN gradients: no update
  kStop,          // inf/NaN gradients and nothing allows skipping them: end the run
};

struct StepDecision {
  StepAction action = StepAction::kUpdate;
  bool spike = false;  // the step was a spike (whatever is done about it)
  // For a spike: the metrics' "spike" value ("warn" | "skip" | "rollback"); "" otherwise.
  std::string spike_name;
  // Why: the spike rule that fired ("loss z 7.3 > 5"), or the stop's reason.
  std::string why;
  bool rollbacks_spent = false;  // a rollback was due, but max_rollbacks are used: skipped instead
};

// A step with finite gradients, given the detector's check and the rollbacks used so far.
StepDecision decide_finite(const StabilityConfig& config, const SpikeCheck& check,
                           int64_t rollbacks_used);
// A step with inf/NaN gradients; nonfinite_in_row counts this one.
StepDecision decide_nonfinite(const StabilityConfig& config, bool loss_scaling,
                              int64_t nonfinite_in_row);

}  // namespace kiln::engine
