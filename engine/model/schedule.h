// Learning-rate schedules: constant, warmup + cosine to a floor, and WSD (warmup, stable, decay).
//
// `step` is the 0-based index of the optimizer step (metrics "step" minus one). Warmup is linear:
// lr * (step + 1) / warmup_steps for step < warmup_steps (so the last warmup step reaches lr).
// cosine: after warmup, floor + (lr - floor) * (1 + cos(pi * p)) / 2 with
//   p = (step - warmup) / (total - warmup), clamped to [0, 1]; floor = lr * min_lr_ratio.
// wsd: after warmup, lr until the last decay_fraction * total steps, then lr decays to the floor
//   with shape linear (1 - p), cosine ((1 + cos(pi p)) / 2) or 1-sqrt (1 - sqrt(p)), where p runs
//   from 0 at the decay start to 1 at total_steps. Beyond total_steps: the floor.
// constant: warmup, then lr. Pure function; thread-safe.
#pragma once

#include <cstdint>

#include "engine/config/schedule.h"

namespace kiln::engine {

double learning_rate(const ScheduleConfig& schedule, double base_lr, int64_t step);

}  // namespace kiln::engine
