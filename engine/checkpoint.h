// Training checkpoints: RUN/checkpoints/step-NNNNNNNN/ with RUN/checkpoints/latest naming the
// newest complete one.
//
// A checkpoint directory holds
//   model.safetensors       fp32 master weights, one tensor per parameter (names as ParamStore)
//   optimizer.safetensors   AdamW moments "<name>.exp_avg", "<name>.exp_avg_sq" (fp32)
//   state.json              step, AdamW update count, tokens, skipped steps, loss-scaler state,
//                           data (loader) state, applied mixture-file hash, seed, precision,
//                           model shape, and the XXH3-64 of both tensor files
//   config.yaml             the resolved config of the run
// It is written under a temporary name, fsynced and renamed, so it appears complete or not at
// all; `latest` is then replaced atomically and directories beyond keep_last are removed
// (oldest first). Loading checks the model shape, the precision and the checksums, naming the
// file on any mismatch; the precision may differ (the stored tensors are fp32 either way). The
// low-precision working copy is not stored: it is re-derived from the
// master weights by the same rounding, so resumed training is bit-identical.
#pragma once

#include <cstdint>
#include <map>
#include <string>

#include "common/status.h"
#include "engine/loss_scaler.h"
#include "engine/params.h"

namespace kiln::engine {

struct TrainerState {
  int64_t step = 0;           // optimizer steps completed
  int64_t adam_updates = 0;   // steps that updated the weights (AdamW bias correction)
  int64_t tokens = 0;         // tokens trained on (cumulative, skipped steps included)
  int64_t skipped_steps = 0;
  LossScaler::State scaler;
  std::string data_state;     // DataSource::state()
  uint64_t mixture_hash = 0;  // MixtureWatcher::applied_hash()
  uint64_t seed = 0;
  std::string precision;      // of the run that wrote the checkpoint ("fp32", "bf16", "fp16")
  // Further components' states by name (JSON text each): "mixing" (the mixing policy),
  // "stability" (spike statistics, rollbacks, quarantined data).
  std::map<std::string, std::string> extra;
};

std::string checkpoint_dir_name(int64_t step);  // "step-00000012"

// Writes RUN/checkpoints/step-NNNNNNNN, updates latest, prunes to keep_last (0: keep all).
Status save_checkpoint(const std::string& run_dir, const ParamStore& params,
                       const TrainerState& state, const std::string& config_yaml,
                       int64_t keep_last);
// The directory `latest` names; kNotFound when the run has no checkpoint.
Result<std::string> latest_checkpoint(const std::string& run_dir);
// Loads master weights and moments into params (then refreshes the low-precision copy).
Status load_checkpoint(const std::string& dir, ParamStore* params, TrainerState* state);

}  // namespace kiln::engine
