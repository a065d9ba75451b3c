// RUN/metrics.jsonl: one JSON line per optimizer step (see docs/TRAINING.md for the fields).
//
// MetricsLog owns the file for a run: open() keeps the lines of the steps a (resumed) run has
// already done and drops the rest (the lines after the checkpoint's step, and a torn last line
// of a killed run), rewriting the file atomically; append() adds one line and flushes it, so a
// reader (`kiln mix show`, a plotting script) always sees whole lines. Not thread-safe.
#pragma once

#include <cmath>
#include <cstdint>
#include <cstdio>
#include <map>
#include <memory>
#include <optional>
#include <string>

#include "common/status.h"
#include "loader/domain_weights.h"

namespace kiln::engine {

// One optimizer step as written to metrics.jsonl.
struct StepRecord {
  int64_t step = 0;  // 1-based
  double loss = 0;
  double lr = 0;
  double grad_norm = 0;              // NaN/inf when the gradients overflowed
  std::optional<double> loss_scale;  // fp16 only
  int64_t tokens = 0;                // cumulative
  double tokens_per_s = 0;
  double step_ms = 0;
  bool skipped = false;
  // When skipped: "overflow" (inf/NaN gradients), "spike" (stability.spike.action skip, or a
  // rollback that could not roll back) or "bad_batch" (abnormal token statistics).
  std::string skip_reason;
  double clip_coef = 1;
  std::map<std::string, double> domain_loss;
  loader::DomainWeights domain_weights;
  double loader_wait_ms = 0;
  // Bytes moved this step by each collective of each group ("dp.all_reduce": ...), multi-rank only.
  std::map<std::string, uint64_t> comm_bytes;
  double comm_ms = 0;  // wall time of the step's loss/gradient reductions (multi-rank only;
                       // ZeRO-2/3: + waits for collectives started in forward/backward)
  // Pipeline parallelism (parallel.pp > 1): the measured bubble, the time the stages of rank 0's
  // pipeline waited for their neighbours' messages over the time they spent in the pipeline
  // (summed over the stages; engine/parallel/pipeline.h PpTiming).
  std::optional<double> pp_bubble;
  // On a GPU (engine/train/mfu.h): model FLOPs utilisation against the device's dense bf16 peak
  // (unset when the device is not in the table) and the device memory in use at its highest so far.
  std::optional<double> mfu;
  std::optional<double> device_memory_peak_mib;
  std::map<std::string, double> val_loss;  // on evaluation steps (eval.every_steps)
  // eval.tasks on evaluation steps: task -> {"acc", "acc_norm"}
  std::map<std::string, std::map<std::string, double>> tasks;
  std::string mixing_policy;   // the policy in effect ("static", "odm", ...)
  bool mixing_paused = false;  // weights pinned by `kiln mix set`
  // Stability signals (engine/stability/monitor.h).
  double loss_z = 0, grad_z = 0;           // against the window of clean steps (0 before it fills)
  double loss_mean = NAN, loss_var = NAN;  // of that window
  std::string spike;                       // "", "warn", "skip" or "rollback"
  int64_t nonfinite = 0;                   // inf/NaN gradient values (overflowed steps)
  std::string nonfinite_layer;             // the first unit in backward order holding them
  std::map<std::string, double> grad_norm_layers;  // every stability.layer_stats_every steps
  std::map<std::string, double> update_ratio;      // idem: |update| / |weights| per unit
  std::map<std::string, double> layers_clipped;    // unit -> norm before per-layer clipping
};
// One line, no newline. JSON has no inf/NaN: those are written as null.
std::string step_record_json(const StepRecord& r);

// RUN/metrics.jsonl
std::string metrics_path(const std::string& run_dir);

// The domain weights in effect at the last step a run has logged (from the last whole line of
// RUN/metrics.jsonl that carries them; a line still being written is skipped). nullopt when the
// run has logged none: `kiln mix` shows these and checks domain names against them.
struct LoggedWeights {
  int64_t step = 0;
  loader::DomainWeights weights;
};
std::optional<LoggedWeights> last_logged_weights(const std::string& run_dir);

class MetricsLog {
 public:
  // Keeps the lines of steps <= keep_through_step (0: none), then opens the file for appending.
  static Result<std::unique_ptr<MetricsLog>> open(const std::string& run_dir,
                                                  int64_t keep_through_step);
  ~MetricsLog();
  MetricsLog(const MetricsLog&) = delete;
  MetricsLog& operator=(const MetricsLog&) = delete;

  Status append(const StepRecord& r);

 private:
  MetricsLog(std::string path, std::FILE* file) : path_(std::move(path)), file_(file) {}
  std::string path_;
  std::FILE* file_;
};

}  // namespace kiln::engine
