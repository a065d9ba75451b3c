// The single-process training loop behind `kiln train`.
//
// Trainer::open() prepares RUN (config.yaml, metrics.jsonl, checkpoints/, control/), builds the
// parameters, model, optimizer, loss scaler and data source, and - with resume - continues from
// RUN/checkpoints/latest exactly (weights, moments, scaler, data position, step and token counts;
// metrics lines after the checkpoint's step are dropped). run() trains until run.steps:
// each optimizer step polls RUN/control/mixture.json, runs grad_accum micro-batches, checks the
// gradients for inf/NaN (skipping and counting the step, and backing off the fp16 loss scale),
// clips, updates, appends one line to metrics.jsonl, prints a progress line every run.log_every
// steps and checkpoints every checkpoint.every_steps steps and at the end. SIGTERM, SIGUSR1 or
// SIGINT (common/stop_signal.h) finish the current step, checkpoint and make run() return OK
// (every rank after the same step); a second signal ends the process at once. Not thread-safe.
#pragma once

#include <chrono>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <set>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/checkpoint.h"
#include "engine/data_source.h"
#include "engine/eval.h"
#include "engine/loss_scaler.h"
#include "engine/metrics.h"
#include "engine/mix_controller.h"
#include "engine/mixture_control.h"
#include "engine/model.h"
#include "engine/optimizer.h"
#include "engine/params.h"
#include "engine/stability.h"
#include "engine/step_batches.h"
#include "engine/train_config.h"

namespace kiln::engine {

struct TrainOptions {
  bool resume = false;     // continue from RUN/checkpoints/latest (fresh start when none)
  bool overwrite = false;  // allow a fresh start in a RUN that already holds metrics/checkpoints
  bool console = true;     // print progress lines on stdout
};

class DataParallel;
class TensorParallel;

class Trainer {
 public:
  static Result<std::unique_ptr<Trainer>> open(const TrainConfig& config,
                                               const std::string& config_yaml,
                                               const TrainOptions& options);
  ~Trainer();

  // Trains until run.steps (or a stop signal). Returns ok at the end of the run.
  Status run();
  // One optimizer step (metrics line included, no checkpoint).
  Result<StepRecord> step();
  Status save();

  const TrainerState& state() const { return state_; }
  const std::vector<StepRecord>& history() const { return history_; }
  ParamStore& params() { return *params_; }
  const StepBatches& step_batches() const { return *batches_; }

 private:
  Trainer() = default;
  Status prepare_run_dir();
  Status log_event(const std::string& json_line);  // RUN/stability.jsonl
  // Testing hooks (stability.inject_*): true the first time this process reaches `step`.
  bool inject_once(char hook, const std::vector<int64_t>& steps, int64_t step);
  // Reloads the latest checkpoint after a spike at rec->step, keeping the data position (the
  // batches since the checkpoint are quarantined). false when there is no checkpoint.
  Result<bool> rollback(StepRecord* rec);
  // Records a step whose batch was rejected by inspect_batch() (no forward, no update).
  Result<StepRecord> skip_bad_batch(StepRecord rec, const BatchCheck& check,
                                    std::chrono::steady_clock::time_point t0);
  // The metrics lines (and history) up to `step` only (reopens the MetricsLog).
  Status truncate_metrics(int64_t step);
  // params_ on `backend` and the model states from the checkpoint (--resume), model.init_from or
  // the initialisation, each rank building only what it keeps (DataParallel::attach); reads the
  // checkpoint's trainer state into resumed_state_. Logs the time, bytes and peaks.
  Status build_model_states(Backend* backend);
  void print_progress(const StepRecord& r);

  TrainConfig config_;
  std::string config_yaml_;
  TrainOptions options_;
  std::unique_ptr<DataParallel> dp_;
  std::unique_ptr<TensorParallel> tp_;  // parallel.tp > 1 only
  std::map<std::string, uint64_t> comm_seen_;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  LossScaler scaler_;
  std::unique_ptr<DataSource> data_;  // moved only through batches_ (engine/step_batches.h)
  std::unique_ptr<MixtureWatcher> mixture_;
  std::unique_ptr<MixController> mix_;
  std::unique_ptr<Evaluator> eval_;
  std::unique_ptr<SpikeDetector> spikes_;
  StabilityState stab_;
  std::map<std::string, RollingStats> layer_norms_;  // per-layer clipping's moving averages
  std::set<std::pair<char, int64_t>> injected_;
  TrainerState state_;
  std::vector<StepRecord> history_;
  // The step's micro-batches (and the next step's, drawn ahead) from data_, and on the device.
  std::unique_ptr<StepBatches> batches_;
  std::unique_ptr<MetricsLog> metrics_;  // rank 0 only
  double flops_per_token_ = 0;           // engine/mfu.h
  std::optional<double> peak_flops_;     // the GPU's dense bf16 peak, when known
  size_t device_memory_peak_ = 0;
  int64_t last_saved_step_ = -1;
  bool resumed_ = false;          // build_model_states read a checkpoint
  std::string resumed_from_;      // its directory
  TrainerState resumed_state_;    // and the trainer state it records
  int64_t last_printed_step_ = 0;
  int64_t run_first_step_ = 0;
  std::chrono::steady_clock::time_point run_start_;
};

}  // namespace kiln::engine
