// Config section `mixing`: the policy that moves the domain weights during training
// (engine/mixing/policy.h describes each policy).
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

// Domain -> weight or loss. A plain map (not the loader's checked weights type): policies do
// arithmetic on it; the trainer hands the result to DataSource::set_weights, which checks it.
using WeightMap = std::map<std::string, double>;

enum class MixPolicy { kStatic, kSchedule, kDoremi, kOdm };
const char* mix_policy_name(MixPolicy p);
// "static" | "schedule" | "doremi" | "odm"; kConfig naming `key` otherwise.
Result<MixPolicy> parse_mix_policy(const std::string& name, const std::string& key);

struct MixingConfig {
  MixPolicy policy = MixPolicy::kStatic;
  int64_t update_every = 10;  // steps between weight updates (doremi, odm, schedule)
  double min_weight = 0.01;   // floor of every domain's weight (k * min_weight <= 1)
  struct Point {
    int64_t step = 0;
    WeightMap weights;
  };
  std::vector<Point> schedule;  // ascending steps, the first at 0
  bool interpolate = false;     // schedule: linear between points instead of stepped
  double doremi_eta = 1.0;
  double doremi_smoothing = 1e-3;
  std::string doremi_reference;     // a finished run's directory or a JSON file {"domain": loss}
  WeightMap doremi_reference_loss;  // resolved from doremi_reference (load_reference_loss)
  double odm_reward_smoothing = 0.9;
  double odm_exploration = 0;  // 0: eps_t = min(1/k, sqrt(ln k / (k t)))
};

// The section's keys read and checked (kConfig naming the key).
Result<MixingConfig> parse_mixing_config(const Config& cfg);

}  // namespace kiln::engine
