// Config section `eval`: per-domain validation loss and multiple-choice tasks during training
// (engine/train/eval.h).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

struct EvalConfig {
  int64_t every_steps = 100;  // 0: off
  int64_t sequences_per_domain = 16;
  // Multiple-choice task files (engine/infer/eval_tasks.h) scored every every_steps too; the CLI
  // tokenizes them with the dataset's tokenizer (TrainOptions::eval_tasks).
  std::vector<std::string> tasks;
};

// The section's keys read and checked (kConfig naming the key).
Result<EvalConfig> parse_eval_config(const Config& cfg);

}  // namespace kiln::engine
