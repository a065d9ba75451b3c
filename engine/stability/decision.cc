#include "engine/stability/decision.h"

#include <fmt/format.h>

namespace kiln::engine {

StepDecision decide_finite(const StabilityConfig& config, const SpikeCheck& check,
                           int64_t rollbacks_used) {
  StepDecision d;
  if (!check.spike) return d;
  d.spike = true;
  d.why = check.why;
  SpikeAction action = config.spike.action;
  if (action == SpikeAction::kRollback && rollbacks_used >= config.spike.max_rollbacks) {
    d.rollbacks_spent = true;
    action = SpikeAction::kSkip;
  }
  d.spike_name = spike_action_name(action);
  switch (action) {
    case SpikeAction::kWarn:
      d.action = StepAction::kUpdate;
      break;
    case SpikeAction::kSkip:
      d.action = StepAction::kSkipSpike;
      break;
    case SpikeAction::kRollback:
      d.action = StepAction::kRollback;
      break;
  }
  return d;
}

StepDecision decide_nonfinite(const StabilityConfig& config, bool loss_scaling,
                              int64_t nonfinite_in_row) {
  StepDecision d;
  d.action = StepAction::kSkipOverflow;
  if (!loss_scaling && !config.skip_nonfinite) {
    d.action = StepAction::kStop;
    d.why = "stability.skip_nonfinite is false";
  } else if (config.max_nonfinite_in_row > 0 && nonfinite_in_row >= config.max_nonfinite_in_row) {
    d.action = StepAction::kStop;
    d.why = fmt::format("{} steps in a row had inf/NaN gradients (stability.max_nonfinite_in_row)",
                        nonfinite_in_row);
  }
  return d;
}

}  // namespace kiln::engine
