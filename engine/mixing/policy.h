// Mixing policies: domain weights that follow the training (config section `mixing`).
//
// A policy is a pure function of its configuration, its state and what training observed:
// mix_update(config, state, observation) -> new state (whose `weights` the trainer hands to the
// loader). Nothing here reads clocks, files or random numbers, so the same observations give the
// same weights bit for bit, and a state saved in a checkpoint (to_json / from_json, numbers
// printed so they read back exactly) continues exactly.
//
//   static    the configured weights (data.mixture, or the dataset's token shares), never changed.
//   schedule  weights per step range: mixing.schedule is a list of {step, weights}; between two
//             points the weights are stepped (the last point at or before the step) or, with
//             mixing.interpolate, linear in the step.
//   doremi    DoReMi's exponentiated-gradient update (Xie et al. 2023) on per-domain excess loss
//             over a reference: s_i = max(l_i - ref_i, 0); a <- softmax(log a + eta * s);
//             a <- (1 - smoothing) * a + smoothing / k. The run's average of a is the result
//             meant for reuse (MixState::average()).
//   odm       ODM's EXP3 bandit (Albalak et al. 2023), no reference: the reward of a domain is its
//             training loss, importance-weighted by its sampling probability and smoothed. ODM
//             draws one domain per batch and adds l_i / p_i; over an interval of N sequences, n_i
//             of domain i, that sums to r_i = l_i * n_i / (N p_i) per sequence (about l_i):
//             R_i <- g * R_i + (1 - g) * r_i for the domains observed (g = reward_smoothing);
//             eps_t = min(1/k, sqrt(ln k / (k t))) (or odm.exploration when set);
//             p_i = (1 - k eps_t) * softmax(eps_{t-1} * R)_i + eps_t.
// Every policy's weights are then floored at min_weight (w <- min_weight + (1 - k min_weight) w)
// and normalised. Thread safety: plain values; no shared state.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/mixing.h"

namespace kiln::engine {

// What training saw since the previous update: per domain, the mean training loss over the
// interval (domains not sampled are absent) and the latest validation loss (may be empty).
struct MixObservation {
  int64_t step = 0;  // the step the new weights apply after
  WeightMap train_loss;
  WeightMap val_loss;
  // Sequences of each domain trained on in the interval (odm's importance weight); empty: the
  // weight is taken as 1 (each domain drawn as often as its probability says).
  std::map<std::string, int64_t> sequences;
};

struct MixState {
  std::string policy = "static";  // the active policy's name
  bool paused = false;            // pinned by `kiln mix set`: no updates until `kiln mix policy`
  int64_t updates = 0;            // updates made by doremi / odm
  WeightMap weights;              // the current weights (normalised, every domain named)
  WeightMap weight_sum;           // doremi: sum of the weights over its updates
  WeightMap reward;               // odm: the smoothed importance-weighted reward per domain
  double prev_exploration = 0;    // odm: eps_{t-1}
  WeightMap last_loss;            // doremi: the last per-domain loss seen (domains not observed)

  WeightMap average() const;  // doremi: weight_sum / updates (the weights when no update)
  std::string to_json() const;
  static Result<MixState> from_json(const std::string& text, const std::string& origin);
};

// The starting state: `base` weights (normalised, floored) for every domain in `domains`.
MixState mix_initial_state(const MixingConfig& config, const std::vector<std::string>& domains,
                           const WeightMap& base);
// Whether the policy updates after `step` (1-based): every update_every steps, and for a
// stepped schedule at its points.
bool mix_due(const MixingConfig& config, const MixState& state, int64_t step);
// The next state. The weights of a paused state never change. kInternal when doremi has no
// reference losses for a domain.
Result<MixState> mix_update(const MixingConfig& config, const MixState& state,
                            const MixObservation& obs);
// The schedule's weights at `step` (stepped or interpolated), every domain of the points named.
WeightMap schedule_weights(const MixingConfig& config, int64_t step);

// DoReMi reference losses: from a JSON file {"domain": loss, ...} (or {"loss": {...}}), or from a
// finished run's directory: its last metrics line with a val_loss, else the mean domain_loss of
// its last 20 steps. kConfig naming mixing.doremi.reference when missing or unusable.
Result<WeightMap> load_reference_loss(const std::string& path);

}  // namespace kiln::engine
