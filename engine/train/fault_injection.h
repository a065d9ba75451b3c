// Internal to engine/ (used by engine/train/trainer.cc): the trainer's fault injection for tests
// (config keys stability.inject_*): the one place where a training step is deliberately broken, so
// that the stability machinery (bad-batch skipping, overflow skipping, spike rollback) can be
// exercised through `kiln train` on real data.
//
//   inject_bad_batch_at  the step's batches become one token everywhere (skipped as a bad batch)
//   inject_lr_burst_at   the step's learning rate is multiplied by lr_burst_factor (a spike)
//   inject_overflow_at   one gradient value becomes +inf on the last rank (an overflow)
// A bad batch and an lr burst fire once per process and step, so a step replayed after a
// rollback is clean; an overflow fires every time the step is reached. All lists are empty in
// real runs, and then nothing here does anything. Not thread-safe; owned by the trainer.
#pragma once

#include <cstdint>
#include <set>
#include <utility>
#include <vector>

#include "engine/config/stability.h"
#include "engine/data/data_source.h"

namespace kiln::engine {

class FaultInjection {
 public:
  explicit FaultInjection(const StabilityConfig& config) : config_(config) {}

  // Whether to corrupt this step's batches; if so corrupt_batch() has made them one token.
  bool corrupt_batch(int64_t step, std::vector<MicroBatch>* batches);
  // The step's learning rate, multiplied when a burst is due.
  double learning_rate(int64_t step, double lr);
  // Whether this rank plants an overflow at this step (the last of world_size ranks: every rank
  // must still skip, the all-reduces carry the inf).
  bool overflow(int64_t step, int world_rank, int world_size) const;

 private:
  bool once(char hook, const std::vector<int64_t>& steps, int64_t step);

  StabilityConfig config_;
  std::set<std::pair<char, int64_t>> fired_;
};

}  // namespace kiln::engine
