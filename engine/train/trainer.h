// The training loop behind `kiln train`: one process, or one rank of many under mpirun (data
// parallelism and ZeRO: engine/parallel/parallelism.h, zero.h; tensor parallelism:
// tensor_parallel.h) - every rank runs the same Trainer, in step.
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
#include "engine/checkpoint/checkpoint.h"
#include "engine/config/train_config.h"
#include "engine/data/data_source.h"
#include "engine/data/step_batches.h"
#include "engine/mixing/control_file.h"
#include "engine/mixing/controller.h"
#include "engine/model/loss_scaler.h"
#include "engine/model/model.h"
#include "engine/model/optimizer.h"
#include "engine/model/params.h"
#include "engine/stability/monitor.h"
#include "engine/train/eval.h"
#include "engine/train/fault_injection.h"
#include "engine/train/metrics.h"

namespace kiln::engine {

struct TrainOptions {
  bool resume = false;     // continue from RUN/checkpoints/latest (fresh start when none)
  bool overwrite = false;  // allow a fresh start in a RUN that already holds metrics/checkpoints
  bool console = true;     // print progress lines on stdout
  // eval.tasks tokenized (the CLI reads and tokenizes the files): scored every eval.every_steps.
  TokenizedTasks eval_tasks;
};

class Parallelism;
class TensorParallel;
class PipelineExecutor;
class GradientStrategy;

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

  // ---- the phases of step(), in order ----
  // What draw_checked_batches() found and the later phases use.
  struct StepInput {
    int64_t valid = 0;          // valid targets over all ranks
    BatchCheck check;           // this rank's batch statistics
    bool bad_anywhere = false;  // some rank's batch is bad: every rank skips the step
    std::map<std::string, int64_t> domain_sequences;  // over all ranks
    double scale = 1;                                 // the loss scale of this step
  };
  // RUN/control/mixture.json and `kiln mix policy` requests (rank 0 reads, every rank applies).
  Status apply_controls(StepRecord* rec);
  Result<StepInput> draw_checked_batches(StepRecord* rec);
  Status forward_backward(const StepInput& in, StepRecord* rec);
  Result<StepStats> inspect_gradients(const StepInput& in, StepRecord* rec);
  // true when the step rolled back (it ends there).
  Result<bool> decide_and_update(const StepInput& in, const StepStats& stats, StepRecord* rec);
  Status update(const StepInput& in, const StepStats& stats, StepRecord* rec);
  Status skip_overflow(const StepInput& in, StepRecord* rec);
  Status observe(const StepInput& in, StepRecord* rec);
  // With pipeline stages: values[0, size - own) exist on the last stage only, the last `own` on
  // every stage; summed over the stages, every rank then holds the last stage's values and the
  // stages' sums of the rest.
  Status from_last_stage(std::vector<double>* values, size_t own, const char* what);
  Result<StepRecord> record(StepRecord rec, const StepInput& in,
                            std::chrono::steady_clock::time_point t0);
  bool layer_stats_due(int64_t step) const;
  // Reloads the latest checkpoint after a spike at rec->step, keeping the data position (the
  // batches since the checkpoint are quarantined). false when there is no checkpoint.
  Result<bool> rollback(StepRecord* rec);
  // Records a step whose batch was rejected by inspect_batch() (no forward, no update).
  Result<StepRecord> skip_bad_batch(StepRecord rec, const BatchCheck& check,
                                    std::chrono::steady_clock::time_point t0);
  // The metrics lines (and history) up to `step` only (reopens the MetricsLog).
  Status truncate_metrics(int64_t step);
  // params_ on `runtime` and the model states from the checkpoint (--resume), model.init_from or
  // the initialisation, each rank building only what it keeps (Parallelism::attach); reads the
  // checkpoint's trainer state into resumed_state_. Logs the time, bytes and peaks.
  Status build_model_states(Runtime* runtime);
  // open()'s log of the run: CPU path, device, model, model states and activation sizes, data,
  // layout, MFU reference.
  void log_run_summary(Runtime& runtime);
  Status restore_resumed_state();
  void print_progress(const StepRecord& r);

  TrainConfig config_;
  std::string config_yaml_;
  TrainOptions options_;
  std::unique_ptr<Parallelism> par_;
  std::unique_ptr<TensorParallel> tp_;          // parallel.tp > 1 only
  std::unique_ptr<PipelineExecutor> pipeline_;  // parallel.pp > 1 only
  std::map<std::string, uint64_t> comm_seen_;
  std::unique_ptr<ParamStore> params_;
  std::unique_ptr<Model> model_;
  std::unique_ptr<AdamW> optimizer_;
  std::unique_ptr<GradientStrategy> grads_;  // the layout's reduce / norm / update, chosen at open
  LossScaler scaler_;
  std::unique_ptr<DataSource> data_;  // moved only through batches_ (engine/data/step_batches.h)
  std::unique_ptr<MixtureWatcher> mixture_;
  std::unique_ptr<MixController> mix_;
  std::unique_ptr<Evaluator> eval_;
  std::unique_ptr<TaskEvaluator> task_eval_;
  std::unique_ptr<SpikeDetector> spikes_;
  StabilityState stab_;
  std::map<std::string, RollingStats> layer_norms_;  // per-layer clipping's moving averages
  std::unique_ptr<FaultInjection> faults_;           // stability.inject_* (tests)
  TrainerState state_;
  std::vector<StepRecord> history_;
  // The step's micro-batches (and the next step's, drawn ahead) from data_, and on the device.
  std::unique_ptr<StepBatches> batches_;
  std::unique_ptr<MetricsLog> metrics_;  // rank 0 only
  double flops_per_token_ = 0;           // engine/train/mfu.h
  std::optional<double> peak_flops_;     // the GPU's dense bf16 peak, when known
  size_t device_memory_peak_ = 0;
  int64_t last_saved_step_ = -1;
  bool resumed_ = false;        // build_model_states read a checkpoint
  std::string resumed_from_;    // its directory
  TrainerState resumed_state_;  // and the trainer state it records
  int64_t last_printed_step_ = 0;
  int64_t run_first_step_ = 0;
  std::chrono::steady_clock::time_point run_start_;
};

}  // namespace kiln::engine
