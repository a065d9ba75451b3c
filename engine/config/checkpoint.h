// Config section `checkpoint`: when a run saves and how many saves it keeps.
#pragma once

#include <cstdint>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

struct CheckpointConfig {
  int64_t every_steps = 0;  // 0: only at the end of the run
  int64_t keep_last = 3;    // 0: keep all
  bool at_end = true;       // also write one when run.steps is reached (false: speed tests)
};

// The section's keys read and checked (kConfig naming the key).
Result<CheckpointConfig> parse_checkpoint_config(const Config& cfg);

}  // namespace kiln::engine
