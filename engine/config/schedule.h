// Config section `schedule`: the learning-rate schedule (engine/model/schedule.h).
#pragma once

#include <cstdint>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

enum class ScheduleKind { kConstant, kCosine, kWsd };
enum class DecayShape { kLinear, kCosine, kOneMinusSqrt };

struct ScheduleConfig {
  ScheduleKind kind = ScheduleKind::kCosine;
  int64_t warmup_steps = 0;
  int64_t total_steps = 0;      // 0: run.steps (parse_train_config fills it in)
  double min_lr_ratio = 0.1;    // floor = lr * min_lr_ratio
  double decay_fraction = 0.2;  // wsd: the final fraction of total_steps that decays
  DecayShape decay_shape = DecayShape::kOneMinusSqrt;  // wsd decay shape
};

// The section's keys read and checked (kConfig naming the key).
Result<ScheduleConfig> parse_schedule_config(const Config& cfg);

}  // namespace kiln::engine
