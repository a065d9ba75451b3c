// Config keys `precision` and section `loss_scale`: the number formats of a run and fp16's
// dynamic loss scale.
#pragma once

#include <cstdint>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

enum class Precision { kFp32, kBf16, kFp16 };
const char* precision_name(Precision p);  // "fp32" | "bf16" | "fp16"

// Dynamic loss scaling (fp16 only), DeepSpeed/Megatron semantics: an overflow skips the step and
// spends one unit of hysteresis; when hysteresis is spent the scale is multiplied by
// backoff_factor (not below min_scale). After growth_interval consecutive clean steps the scale is
// multiplied by growth_factor and hysteresis is refilled.
struct LossScaleConfig {
  double initial = 65536.0;
  double growth_factor = 2.0;
  double backoff_factor = 0.5;
  int64_t growth_interval = 2000;
  int64_t hysteresis = 2;
  double min_scale = 1.0;
};

// The keys read and checked (kConfig naming the key).
Result<Precision> parse_precision(const Config& cfg);
Result<LossScaleConfig> parse_loss_scale_config(const Config& cfg);

}  // namespace kiln::engine
