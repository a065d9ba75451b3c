// Internal to engine/ (used by engine/train/trainer.cc): the data side of a rollback
// (stability.spike.action: rollback): which sequences to quarantine and the stability state to
// continue with. The trainer reloads the model states from the last checkpoint
// (engine/train/trainer.cc); the data does not go back - the batches drawn since the checkpoint,
// the spike's included, are never trained on, and this says which they were, per domain, as ranges
// of the sequence counts StabilityState::sequences keeps. Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "engine/stability/monitor.h"

namespace kiln::engine {

// The window of steps (checkpoint_step, spike_step] and, per domain, the sequences [at the
// checkpoint, now) handed out in them (domains with none are left out).
Quarantine quarantine_window(const StabilityState& now, const StabilityState& at_checkpoint,
                             int64_t checkpoint_step, int64_t spike_step, std::string reason);

// The stability state after rolling back: the counters go on from `now` (the spike's step is not
// forgotten), one more rollback, the non-finite streak reset, the window quarantined.
StabilityState after_rollback(const StabilityState& now, const Quarantine& window);

// {"<domain>": [begin, end], ...} of a quarantine, for the log and RUN/stability.jsonl.
std::string quarantine_ranges_json(const Quarantine& window);

}  // namespace kiln::engine
