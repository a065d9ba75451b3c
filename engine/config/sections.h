// Internal to engine/config/: every section's schema table, for train_config.cc to print the
// defaults from and parse with, in the documented order. A top-level key (precision,
// activation_checkpointing, device) is a one-field section over a one-member struct.
#pragma once

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
#include "engine/config/schema.h"
#include "engine/config/stability.h"

namespace kiln::engine {

struct PrecisionKey {
  Precision value = Precision::kFp32;
};
struct RecomputeKey {
  Recompute value = Recompute::kNone;
};
struct DeviceKey {
  Device value = Device::kCpu;
};

const config_schema::Schema<ModelConfig>& model_schema();
const config_schema::Schema<ParallelConfig>& parallel_schema();
const config_schema::Schema<PrecisionKey>& precision_schema();
const config_schema::Schema<LossScaleConfig>& loss_scale_schema();
const config_schema::Schema<OptimizerConfig>& optimizer_schema();
const config_schema::Schema<ScheduleConfig>& schedule_schema();
const config_schema::Schema<RecomputeKey>& recompute_schema();
const config_schema::Schema<DataConfig>& data_schema();
const config_schema::Schema<MemoryConfig>& memory_schema();
const config_schema::Schema<CheckpointConfig>& checkpoint_schema();
const config_schema::Schema<StabilityConfig>& stability_schema();
const config_schema::Schema<MixingConfig>& mixing_schema();
const config_schema::Schema<EvalConfig>& eval_schema();
const config_schema::Schema<RunConfig>& run_schema();
const config_schema::Schema<DeviceKey>& device_schema();

}  // namespace kiln::engine
