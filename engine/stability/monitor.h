// Training stability signals and decisions (config section `stability`), kept apart from the
// training loop so each rule is a small, testable function.
//
// - RollingStats: mean / variance of the last `window` values (loss, gradient norm).
// - SpikeDetector: z = (x - mean) / std of this step's loss and global gradient norm against the
//   window of earlier clean steps; after warmup_steps (and once the window holds 8 values), a z
//   above z_loss or z_grad is a spike. Spikes and skipped steps never enter the window, so one
//   spike cannot hide the next. The action (warn | skip | rollback) comes from the config;
//   rollback falls back to skip when max_rollbacks are spent or there is no checkpoint.
// - inspect_batch(): the token statistics of a step's batch: one target token id making up more
//   than bad_batch_token_fraction of the targets marks a bad batch (skipped before the step).
// - Layer statistics over ParamStore units ("embed", "blocks.N", "final"): gradient norm per
//   unit, the first unit in backward order holding inf/NaN (where a non-finite gradient most
//   likely started), per-unit clipping (absolute limit, or factor x the unit's moving average),
//   and the update / parameter norm ratio per unit. They reach the buffers through the
//   ParamStore's runtime (engine/device/runtime.h): in place on the CPU, through host copies on a
//   GPU.
// State (the windows, counters, the non-finite streak, rollbacks used, quarantined data) is
// serialised into checkpoints (to_json / from_json). Not thread-safe; owned by the trainer.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/stability.h"
#include "engine/data/data_source.h"
#include "engine/model/params.h"

namespace kiln::engine {

class RollingStats {
 public:
  explicit RollingStats(int64_t window = 100) : window_(window) {}
  void push(double x);
  int64_t size() const { return static_cast<int64_t>(values_.size()); }
  double mean() const;
  double variance() const;  // population variance of the window (0 when empty)
  // (x - mean) / std; 0 when the window is empty; a tiny std floor keeps it finite.
  double z(double x) const;
  const std::deque<double>& values() const { return values_; }
  void set_values(std::deque<double> v) { values_ = std::move(v); }

 private:
  int64_t window_;
  std::deque<double> values_;
};

struct SpikeCheck {
  double loss_z = 0, grad_z = 0;
  bool spike = false;
  std::string why;  // "loss z 7.3 > 5" / "grad z ..." when spike
};

class SpikeDetector {
 public:
  explicit SpikeDetector(const StabilityConfig::Spike& config)
      : config_(config), loss_(config.window), grad_(config.window) {}
  // This step's z-scores against the window (before deciding anything).
  SpikeCheck check(int64_t step, double loss, double grad_norm) const;
  // A clean step (trained, no spike) joins the window.
  void record_clean(double loss, double grad_norm);
  const RollingStats& loss() const { return loss_; }
  const RollingStats& grad() const { return grad_; }
  RollingStats& loss() { return loss_; }
  RollingStats& grad() { return grad_; }

 private:
  StabilityConfig::Spike config_;
  RollingStats loss_, grad_;
};

struct BatchCheck {
  bool bad = false;
  int32_t token = -1;   // the most frequent target token
  double fraction = 0;  // its share of the valid targets
  int64_t targets = 0;
};
// Over all micro-batches of a step. max_fraction 0: never bad.
BatchCheck inspect_batch(const std::vector<MicroBatch>& batches, double max_fraction);

// Per-unit gradient L2 norms (unscaled by loss_scale), in unit order; inf/NaN kept.
std::map<std::string, double> unit_grad_norms(const ParamStore& params, double loss_scale);
// Where the gradients hold inf/NaN: the first unit in backward order (final, blocks.L-1 ..
// blocks.0, embed) that has any ("" when none) and the count of non-finite values overall.
struct NonFinite {
  std::string first_unit;
  int64_t count = 0;
};
NonFinite find_nonfinite(const ParamStore& params);
// Per-unit clipping before the global clip. Scales a unit's gradients down to its limit:
// max_norm (when > 0) and factor x the mean of its last 50 unclipped norms (when factor > 0,
// once 8 are known; `averages` keeps them). Returns the units clipped with their norm before.
std::map<std::string, double> clip_units(ParamStore& params, double loss_scale, double max_norm,
                                         double factor,
                                         std::map<std::string, RollingStats>* averages);
// ||after - before|| / ||before|| per unit (master weights; before: copies taken by
// snapshot_masters()).
std::vector<std::vector<float>> snapshot_masters(const ParamStore& params);
std::map<std::string, double> update_ratios(const ParamStore& params,
                                            const std::vector<std::vector<float>>& before);

// A window of data skipped by a rollback: the steps whose batches were dropped and, per domain,
// the sequences of that domain the loader emitted in them ([begin, end) of its sequence count).
struct Quarantine {
  int64_t from_step = 0, to_step = 0;  // steps (from_step, to_step] were rolled back
  int64_t spike_step = 0;
  std::string reason;
  std::map<std::string, std::pair<uint64_t, uint64_t>> sequences;
};

// The stability state that a checkpoint carries.
struct StabilityState {
  int64_t spikes = 0, spike_skips = 0, rollbacks = 0, bad_batches = 0, layer_clips = 0;
  int64_t nonfinite_in_row = 0;
  // Sequences of each domain the data source has handed out (trained on, skipped or
  // quarantined): the position the quarantine ranges refer to.
  std::map<std::string, uint64_t> sequences;
  std::vector<Quarantine> quarantined;
  std::string to_json(const SpikeDetector& detector) const;
  // detector may be null (a report that needs no spike windows).
  static Status from_json(const std::string& text, StabilityState* state, SpikeDetector* detector);
};

}  // namespace kiln::engine
