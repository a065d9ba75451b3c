// Config section `optimizer`: AdamW's hyper-parameters and the gradient clip.
#pragma once

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

struct OptimizerConfig {
  double lr = 6e-4;
  float beta1 = 0.9f;
  float beta2 = 0.95f;
  float eps = 1e-8f;
  float weight_decay = 0.1f;
  float clip_grad = 1.0f;               // global-norm clip; 0 disables
  bool decay_norms_and_biases = false;  // by default only matrices and embeddings decay
};

// The section's keys read and checked (kConfig naming the key).
Result<OptimizerConfig> parse_optimizer_config(const Config& cfg);

}  // namespace kiln::engine
