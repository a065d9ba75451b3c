// Config section `data`: where the batches come from and how they are drawn (engine/data/).
#pragma once

#include <cstdint>
#include <string>

#include "common/config.h"
#include "common/status.h"
#include "loader/domain_weights.h"

namespace kiln::engine {

struct DataConfig {
  std::string manifest;  // "" : synthetic data
  int64_t micro_batch = 8;
  int64_t grad_accum = 1;
  loader::DomainWeights mixture;  // empty: the manifest's token shares
  int64_t prefetch_depth = 4;     // batches the loader prepares ahead
  int64_t workers = 1;            // loader worker threads
  // Draw (and upload) the next step's micro-batches while a step computes
  // (engine/data/step_batches.h; the data and results are the same either way).
  bool prefetch_next_step = true;
  // Canonical loader partitions (loader/loader.h): the data order is the same on every
  // data-parallel size dividing them. 0: the global batch (micro_batch x grad_accum x dp).
  int64_t partitions = 0;
  // Resuming on a data-parallel size that does not divide the checkpoint's partitions (or with
  // another global batch): continue in another order (warning) instead of refusing.
  bool repartition = false;
};

// The section's keys read and checked (kConfig naming the key).
Result<DataConfig> parse_data_config(const Config& cfg);

}  // namespace kiln::engine
