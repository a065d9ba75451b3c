// Config section `parallel`: how the ranks split the model and the data (engine/parallel/).
#pragma once

#include <cstdint>
#include <vector>

#include "common/config.h"
#include "common/status.h"

namespace kiln::engine {

struct ModelConfig;

enum class PpSchedule { k1F1B, kGPipe };
const char* pp_schedule_name(PpSchedule s);  // "1f1b", "gpipe"

struct ParallelConfig {
  int64_t tp = 1;
  int64_t zero_stage = 0;
  int64_t prefetch = 1;       // ZeRO-3: layers gathered ahead (distributed engine)
  bool hierarchical = false;  // DP all-reduce: intra-node, inter-node, intra-node (comm/topology.h)
  // Pipeline parallelism (engine/parallel/pipeline.h): pp stages of contiguous blocks, the
  // step's grad_accum micro-batches run through them by `pp_schedule`. pp_layers: blocks per
  // stage (pp entries summing to model.n_layers); empty: balanced by cost (pp_stage_split).
  int64_t pp = 1;
  PpSchedule pp_schedule = PpSchedule::k1F1B;
  std::vector<int64_t> pp_layers;
  // A collective outstanding longer than this stops every rank (comm/watchdog.h); 0: off.
  double collective_timeout_s = 600;
};

// The section's keys read and checked (kConfig naming the key).
Result<ParallelConfig> parse_parallel_config(const Config& cfg);
// What the layout needs of the model: pp_layers summing to model.n_layers, a block per stage.
Status check_parallel_fits(const ParallelConfig& p, const ModelConfig& m);

}  // namespace kiln::engine
