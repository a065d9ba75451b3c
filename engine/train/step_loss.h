// Internal to engine/ (used by engine/train/trainer.cc): a step's loss from its micro-batches'
// per-token losses - the sum over every valid target (the target is not -1) and, per domain, the
// sum and the count of targets, plus the sequences each domain contributed. These are the local
// parts; the trainer sums them over the data-parallel ranks before dividing (the loss is the
// mean over all ranks' valid targets). Pure functions; thread-safe.
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "engine/data/data_source.h"

namespace kiln::engine {

struct StepLoss {
  double sum = 0;                  // over every valid target of the step
  std::vector<double> domain_sum;  // per domain (DataSource::domains() order)
  std::vector<int64_t> domain_targets;
};

// losses: the step's micro-batches' per-token losses, micro-batch i's at losses + i * stride
// (stride >= rows * seq_len). A row whose domain is out of [0, n_domains) counts in `sum` only.
StepLoss sum_step_loss(const std::vector<MicroBatch>& batches, const float* losses, size_t stride,
                       size_t n_domains);

// Sequences per domain in the step's batches (rows with a domain out of range are not counted).
std::vector<int64_t> count_domain_sequences(const std::vector<MicroBatch>& batches,
                                            size_t n_domains);

}  // namespace kiln::engine
