// The training configuration: the `kiln train` schema, parsed and validated, one section each.
//
// Sections follow docs/TRAINING.md "Config reference": model, parallel, precision, loss_scale,
// optimizer, schedule, activation_checkpointing, data, memory, checkpoint, stability, mixing,
// eval, run, device. Each section is its own header in engine/config/ (struct, defaults, parser)
// and a component includes only the section it takes; this header is for the commands and the
// trainer, which hold them all. parse_train_config() checks every value and names the key on
// error (a config error, exit 2).
#pragma once

#include <string>
#include <vector>

#include "common/config.h"
#include "common/status.h"
#include "engine/config/checkpoint.h"
#include "engine/config/data.h"
#include "engine/config/eval.h"
#include "engine/config/memory.h"
#include "engine/config/mixing.h"
#include "engine/config/model.h"
#include "engine/config/optimizer.h"
#include "engine/config/parallel.h"
#include "engine/config/precision.h"
#include "engine/config/run.h"
#include "engine/config/schedule.h"
#include "engine/config/stability.h"

namespace kiln::engine {

struct TrainConfig {
  ModelConfig model;
  ParallelConfig parallel;
  Precision precision = Precision::kFp32;
  LossScaleConfig loss_scale;
  OptimizerConfig optimizer;
  ScheduleConfig schedule;
  Recompute activation_checkpointing = Recompute::kNone;
  DataConfig data;
  MemoryConfig memory;
  CheckpointConfig checkpoint;
  StabilityConfig stability;
  MixingConfig mixing;
  EvalConfig eval;
  RunConfig run;
  Device device = Device::kCpu;  // the device the engine runs on (engine/device/runtime.h)
};

// The YAML defaults, printed from the section tables: the schema of `kiln train` configs.
const std::string& train_config_defaults();
// Config paths whose children are free-form (domain names).
std::vector<std::string> train_config_open_paths();

// Loads file + sets over the defaults (see common/config.h).
Result<Config> load_train_config(const std::string& file, const std::vector<std::string>& sets);
// Typed, validated view. Errors are kConfig with the key.
Result<TrainConfig> parse_train_config(const Config& cfg);

}  // namespace kiln::engine
