// Internal to engine/ (used by the trainer): per-domain validation loss (config section `eval`).
//
// An Evaluator holds a fixed set of validation sequences per domain, taken once from the data
// source (DataSource::validation_set: the dataset's validation split, or held-out synthetic
// slots) when the run opens. The set depends only on the dataset, the seed and
// eval.sequences_per_domain, never on the training position, so every evaluation - and every
// evaluation after a resume - scores the same tokens. evaluate() runs the model forward only and
// returns each domain's mean loss per target token (nats). The sequences are uploaded to the
// runtime once, at open (engine/data/device_batches.h); each evaluation downloads only the losses.
// Not thread-safe; owned by the trainer.
#pragma once

#include <cstdint>
#include <memory>
#include <vector>

#include "common/status.h"
#include "engine/config/eval.h"
#include "engine/config/mixing.h"
#include "engine/data/data_source.h"
#include "engine/data/device_batches.h"
#include "engine/device/runtime.h"
#include "engine/infer/eval_tasks.h"
#include "engine/model/model.h"

namespace kiln::engine {

// How an evaluator runs the model forward on its micro-batches: nullptr-empty for the whole model
// (Model::forward on each in turn); with pipeline parallelism, the stages' forward pass
// (PipelineExecutor::forward), after which only the last stage's losses are meaningful and the
// caller shares its results with the other stages.
using ForwardPass = std::function<Status(const std::vector<DeviceBatches::Tokens>& batches,
                                         const std::vector<float*>& losses)>;

class Evaluator {
 public:
  // Takes the validation set from `data`. An empty set (no validation split) gives an evaluator
  // whose empty() is true. A token id outside [0, vocab) is kData (check_token_ids).
  static Result<std::unique_ptr<Evaluator>> open(DataSource& data, const EvalConfig& config,
                                                 int64_t micro_batch, int64_t seq_len,
                                                 int64_t vocab, Runtime* runtime);
  bool empty() const { return batches_.empty(); }
  int64_t sequences() const { return sequences_; }
  // Mean loss per target token of each domain that has validation sequences.
  Result<WeightMap> evaluate(Model& model, const ForwardPass& pass = {});

 private:
  std::vector<std::string> names_;
  std::vector<MicroBatch> batches_;        // rows padded with ignored targets to the micro-batch
  std::unique_ptr<DeviceBatches> staged_;  // batches_ on the device, and their losses
  std::vector<float> losses_;
  int64_t sequences_ = 0;
};

// Multiple-choice tasks in the training loop (eval.tasks; engine/infer/eval_tasks.h scoring):
// every choice of every example is one row (context + choice, targets at the choice's tokens),
// packed into micro-batches and uploaded once; evaluate() runs the model forward on them (every
// rank, as the training step: TP and ZeRO-3 collectives included) and returns each task's acc and
// acc_norm, the same numbers `kiln eval --tasks` gives for the same weights.
using TokenizedTasks = std::vector<std::pair<std::string, std::vector<McTokens>>>;
class TaskEvaluator {
 public:
  TaskEvaluator(const TokenizedTasks& tasks, int64_t micro_batch, int64_t seq_len,
                Runtime* runtime);
  Result<std::map<std::string, McResult>> evaluate(Model& model, const ForwardPass& pass = {});

 private:
  TokenizedTasks tasks_;
  int64_t rows_ = 0, seq_len_ = 0, count_ = 0;  // count_: rows in use
  std::unique_ptr<DeviceBatches> staged_;
  size_t batches_ = 0;
  std::vector<float> losses_;
};

}  // namespace kiln::engine
