#include "engine/train/fault_injection.h"

#include <algorithm>

#include "common/log.h"

namespace kiln::engine {

bool FaultInjection::once(char hook, const std::vector<int64_t>& steps, int64_t step) {
  if (std::find(steps.begin(), steps.end(), step) == steps.end()) return false;
  return fired_.insert({hook, step}).second;  // a step replayed after a rollback is clean
}

bool FaultInjection::corrupt_batch(int64_t step, std::vector<MicroBatch>* batches) {
  if (!once('b', config_.inject_bad_batch_at, step)) return false;
  KILN_LOG_WARN("step {}: injecting a corrupted batch (stability.inject_bad_batch_at)", step);
  for (MicroBatch& b : *batches) {
    for (auto& t : b.inputs) t = 1;
    for (auto& t : b.targets) t = t >= 0 ? 1 : t;
  }
  return true;
}

double FaultInjection::learning_rate(int64_t step, double lr) {
  if (!once('l', config_.inject_lr_burst_at, step)) return lr;
  KILN_LOG_WARN("step {}: injecting a learning-rate burst x{} (stability.inject_lr_burst_at)", step,
                config_.lr_burst_factor);
  return lr * config_.lr_burst_factor;
}

bool FaultInjection::overflow(int64_t step, int world_rank, int world_size) const {
  const auto& at = config_.inject_overflow_at;
  if (std::find(at.begin(), at.end(), step) == at.end() || world_rank != world_size - 1) {
    return false;
  }
  KILN_LOG_WARN("step {}: injecting an overflow (stability.inject_overflow_at)", step);
  return true;
}

}  // namespace kiln::engine
