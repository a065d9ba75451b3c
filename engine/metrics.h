// RUN/metrics.jsonl: one JSON line per optimizer step (see docs/TRAINING.md for the fields).
//
// MetricsLog owns the file for a run: open() keeps the lines of the steps a (resumed) run has
// already done and drops the rest (the lines after the checkpoint's step, and a torn last line
// of a killed run), rewriting the file atomically; append() adds one line and flushes it, so a
// reader (`kiln mix show`, a plotting script) always sees whole lines. Not thread-safe.
#pragma once

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
  double grad_norm = 0;                   // NaN/inf when the gradients overflowed
  std::optional<double> loss_scale;       // fp16 only
  int64_t tokens = 0;                     // cumulative
  double tokens_per_s = 0;
  double step_ms = 0;
  bool skipped = false;
  std::string skip_reason;                // "overflow" (inf/NaN gradients) when skipped
  double clip_coef = 1;
  std::map<std::string, double> domain_loss;
  DomainWeights domain_weights;
  double loader_wait_ms = 0;
  // Bytes moved this step by each collective of each group ("dp.all_reduce": ...), multi-rank only.
  std::map<std::string, uint64_t> comm_bytes;
  double comm_ms = 0;  // wall time of the step's loss/gradient reductions (multi-rank only)
  // On a GPU (engine/mfu.h): model FLOPs utilisation against the device's dense bf16 peak (unset
  // when the device is not in the table) and the device memory in use at its highest so far.
  std::optional<double> mfu;
  std::optional<double> device_memory_peak_mib;
};
// One line, no newline. JSON has no inf/NaN: those are written as null.
std::string step_record_json(const StepRecord& r);

// RUN/metrics.jsonl
std::string metrics_path(const std::string& run_dir);

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
