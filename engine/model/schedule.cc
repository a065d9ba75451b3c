#include "engine/model/schedule.h"

#include <algorithm>
#include <cmath>

namespace kiln::engine {

double learning_rate(const ScheduleConfig& s, double base_lr, int64_t step) {
  if (step < s.warmup_steps) {
    return base_lr * static_cast<double>(step + 1) / static_cast<double>(s.warmup_steps);
  }
  const double floor_lr = base_lr * s.min_lr_ratio;
  const double kPi = 3.14159265358979323846;
  switch (s.kind) {
    case ScheduleKind::kConstant:
      return base_lr;
    case ScheduleKind::kCosine: {
      const int64_t span = s.total_steps - s.warmup_steps;
      if (span <= 0) return floor_lr;
      const double p = std::clamp(static_cast<double>(step - s.warmup_steps) / span, 0.0, 1.0);
      return floor_lr + (base_lr - floor_lr) * 0.5 * (1.0 + std::cos(kPi * p));
    }
    case ScheduleKind::kWsd: {
      const int64_t decay_steps =
          std::max<int64_t>(0, std::llround(s.decay_fraction * static_cast<double>(s.total_steps)));
      const int64_t decay_start = std::max(s.warmup_steps, s.total_steps - decay_steps);
      if (step < decay_start) return base_lr;
      const int64_t span = s.total_steps - decay_start;
      if (span <= 0) return floor_lr;
      const double p = std::clamp(static_cast<double>(step - decay_start) / span, 0.0, 1.0);
      double f = 0.0;
      switch (s.decay_shape) {
        case DecayShape::kLinear:
          f = 1.0 - p;
          break;
        case DecayShape::kCosine:
          f = 0.5 * (1.0 + std::cos(kPi * p));
          break;
        case DecayShape::kOneMinusSqrt:
          f = 1.0 - std::sqrt(p);
          break;
      }
      return floor_lr + (base_lr - floor_lr) * f;
    }
  }
  return base_lr;
}

}  // namespace kiln::engine
