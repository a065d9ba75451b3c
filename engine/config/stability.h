// Config section `stability`: non-finite steps, spikes, bad batches, per-layer clipping and the
// testing hooks that provoke them (engine/stability/).
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

enum class SpikeAction { kWarn, kSkip, kRollback };
const char* spike_action_name(SpikeAction a);  // "warn" | "skip" | "rollback"

struct StabilityConfig {
  bool skip_nonfinite = true;  // skip a step whose gradients hold inf/NaN (all precisions)
  // Loss / gradient-norm spikes (engine/stability/monitor.h): z-scores against the last `window`
  // clean steps, after `warmup_steps`; a z above z_loss or z_grad triggers `action`.
  struct Spike {
    int64_t window = 200;
    double z_loss = 5.0;
    double z_grad = 5.0;
    int64_t warmup_steps = 100;
    SpikeAction action = SpikeAction::kWarn;
    int64_t max_rollbacks = 3;  // rollbacks per run before a spike only warns
  } spike;
  int64_t max_nonfinite_in_row = 10;  // stop with a diagnosis after this many skipped in a row
  // A batch where one token id makes up more than this fraction of the targets is skipped
  // before the step (0: off).
  double bad_batch_token_fraction = 0.9;
  int64_t layer_stats_every = 0;  // grad_norm_layers and update_ratio every N steps (0: off)
  // Per-layer clipping before the global clip (off when both are 0): a layer whose gradient
  // norm exceeds max_norm, or factor x its own moving average, is scaled down to that limit.
  double layer_clip_max_norm = 0;
  double layer_clip_factor = 0;
  // Testing hooks: multiply the learning rate by lr_burst_factor at these steps, or replace the
  // step's batches with one repeated token (a corrupted batch).
  std::vector<int64_t> inject_lr_burst_at;
  double lr_burst_factor = 100;
  std::vector<int64_t> inject_bad_batch_at;
  // Testing hook: after backward at these steps, one gradient value is set to +inf so the real
  // overflow path runs (skip, count, loss-scale backoff).
  std::vector<int64_t> inject_overflow_at;
};

// The section's keys read and checked (kConfig naming the key).
Result<StabilityConfig> parse_stability_config(const Config& cfg);

}  // namespace kiln::engine
