#include "engine/model/loss_scaler.h"

#include <algorithm>

namespace kiln::engine {

LossScaler::LossScaler(const LossScaleConfig& config, bool enabled)
    : config_(config), enabled_(enabled) {
  state_.scale = enabled ? config.initial : 1.0;
  state_.hysteresis_left = config.hysteresis;
}

bool LossScaler::update(bool found_overflow) {
  if (found_overflow) ++state_.overflows;
  if (!enabled_) return false;
  const double before = state_.scale;
  if (found_overflow) {
    state_.clean_steps = 0;
    state_.hysteresis_left = std::max<int64_t>(0, state_.hysteresis_left - 1);
    if (state_.hysteresis_left == 0) {
      state_.scale = std::max(config_.min_scale, state_.scale * config_.backoff_factor);
    }
  } else {
    ++state_.clean_steps;
    if (state_.clean_steps >= config_.growth_interval) {
      state_.clean_steps = 0;
      state_.hysteresis_left = config_.hysteresis;
      state_.scale *= config_.growth_factor;
    }
  }
  return state_.scale != before;
}

}  // namespace kiln::engine
