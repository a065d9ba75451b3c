// Internal to engine/ (used by engine/train/trainer.cc): the memory preflight of `kiln train`.
// Before a rank allocates its model states, its estimated peak - the model of `kiln plan`
// (engine/parallel/layout_plan.h: parameters, gradients, optimizer states, activations and
// communication buffers of this run's layout, and the start-up peak) - is held against what the
// rank can have: on the CPU the host memory the process may still use (common/host_memory.h:
// MemAvailable or the cgroup's limit, shared by the ranks on the machine), on a GPU the device's
// free memory. Over budget, the run stops before anything large is allocated, with the figures,
// the budget and where it came from, and the layouts that would fit (a ZeRO stage, activation
// checkpointing, tensor parallelism, pipeline stages, more ranks). Under pipeline parallelism each
// rank checks its own stage's estimate. Config section `memory`: check (off: no
// refusal), margin (the share held back for what the estimate leaves out: the loader's buffers,
// the kernels' scratch, the allocator), budget (a figure instead of the measured one).
// Pure but for what budget_for() reads; thread-safe.
#pragma once

#include <cstdint>
#include <string>

#include "common/status.h"
#include "engine/config/train_config.h"
#include "engine/device/runtime.h"

namespace kiln::engine {

struct MemoryBudget {
  uint64_t bytes = 0;  // what this rank may use (before the margin)
  std::string source;  // "MemAvailable 23.1 GiB on this machine / 2 ranks", "free device memory"
  bool known = true;   // false: nothing could be measured (then nothing is refused)
};

// What this rank can have: memory.budget when set; on the CPU the process's available host
// memory divided by ranks_on_machine; on a device its free memory.
MemoryBudget budget_for(const TrainConfig& config, Runtime& runtime, int ranks_on_machine);

// ok when the estimated peak of config's layout over world ranks fits budget less the margin,
// or memory.check is off. Otherwise kConfig naming the key `memory`: the estimate by part, the
// budget and its source, and what would fit. With parallel.pp > 1 the estimate is pipeline stage
// pp_rank's (this rank's: (world rank / tp) % pp, comm/topology.h; its blocks, its embedding or
// head, the micro-batches its schedule keeps in flight); pp_rank -1: the stage with the largest
// peak.
Status check_memory(const TrainConfig& config, int64_t world, const MemoryBudget& budget,
                    int pp_rank = -1);

}  // namespace kiln::engine
