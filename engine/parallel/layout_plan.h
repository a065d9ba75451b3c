// Memory and communication model of a training layout: what `kiln plan` prints.
//
// For a config and a world size, every layout (tp dividing the world and the head count,
// dp = world / tp, ZeRO stage 0-3, activation checkpointing none / selective / full) gets its
// bytes per rank and its bytes moved per optimizer step, from the engine's own storage rules:
//   params      the working weights forward/backward read: fp32 master weights in fp32, the
//               bf16/fp16 copy otherwise; sharded over dp by ZeRO-3
//   grads       fp32 gradients (every precision); sharded over dp from ZeRO-2; ZeRO-1 holds the
//               full accumulation buffers and its reduced shard
//   optimizer   AdamW moments (fp32) and, in bf16/fp16, the fp32 master weights; sharded from
//   ZeRO-1 activations engine/model/model.h's plan for one micro-batch; tensor-parallel parts
//   divided by tp buffers     communication scratch: ZeRO-0/1 reduce one unit (embeddings, a block,
//   the final
//               norm) at a time; ZeRO-2 also holds full gradients of at most three units during
//               backward (the embeddings', the unit being written, the one being reduced);
//               ZeRO-3 in addition 2 + parallel.prefetch gathered units of weights
//   startup     the peak while the model states are built or loaded (RankMemory::startup)
// Tensor parallelism (Megatron): QKV, MLP-up (column), attention-out and MLP-down (row) and the
// vocabulary-parallel embedding are split over tp; norms, row-parallel biases and position
// embeddings are replicated. A "unit" is sharded over dp in equal, 16-element-aligned pieces.
//
// Bytes per step are logical volumes per rank as comm/comm.h counts them: a data-parallel
// all-reduce of G bytes of gradients is 2G; ZeRO-1 reduce-scatters the gradients (G) once per
// step, ZeRO-2 once per micro-batch, and both all-gather the updated weights once per step;
// ZeRO-3 all-gathers the weights in forward and again in backward and reduce-scatters the
// gradients, per micro-batch. Tensor parallelism (engine/parallel/tensor_parallel.h) all-reduces
// fp32 activations twice per block in forward and twice in backward (once more per block with full
// recomputation), the embedding output once, the head's input gradient once and three fp32
// per-row statistics of the vocabulary-parallel cross-entropy, and the gradient norm.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/train/train_config.h"

namespace kiln::engine {

struct Layout {
  int64_t tp = 1, dp = 1, zero_stage = 0;
  Recompute recompute = Recompute::kNone;
};

struct RankMemory {
  uint64_t params = 0, grads = 0, optimizer = 0, activations = 0, buffers = 0;
  // The peak while the model states are built (start-up, resume; engine/parallel/zero.h create):
  // the rank's own model states - its shards and the full buffers its ZeRO stage keeps, never the
  // unsharded states - plus, in bf16/fp16 under ZeRO-1/2, one fp32 chunk the working weights
  // are rounded from (kStateChunk elements, or the largest unit's when smaller).
  uint64_t startup = 0;
  uint64_t model_states() const { return params + grads + optimizer; }
  uint64_t total() const { return params + grads + optimizer + activations + buffers; }
};

// Whether this version's `kiln train` runs the layout (engine/parallel/data_parallel.h); the others
// are estimates on paper.
bool layout_trainable(const Layout& layout);
// Whether every tensor-parallel group (tp adjacent ranks, comm/topology.h) stays inside one
// machine of ranks_per_node ranks (consecutive ranks per machine, mpirun --map-by slot): world
// fits one machine, or tp divides ranks_per_node. ranks_per_node 0: unknown (always true).
bool tp_within_node(int64_t tp, int64_t world, int64_t ranks_per_node);

struct LayoutPlan {
  Layout layout;
  bool trainable = false;  // layout_trainable()
  RankMemory memory;
  // "dp.all_reduce", "dp.reduce_scatter", "dp.all_gather", "tp.all_reduce": bytes per rank per
  // step.
  std::map<std::string, uint64_t> comm_bytes;
  std::optional<bool> fits;  // set when a memory budget is known
  bool within_node = true;   // tp_within_node(): the TP all-reduces stay on a machine's links
  bool suggested = false;
  // Estimated seconds per step in the collectives (plan_layouts: comm_seconds()).
  double comm_seconds = 0;
  uint64_t comm_total() const;
};

// The links the collectives run over, bytes per second per rank in each direction: between the
// ranks of one machine (NVLink, or shared memory for CPU ranks) and between machines (the
// network). Defaults: 300 GB/s inside a machine (NVLink 4 achieves ~360 GB/s of all-reduce bus
// bandwidth on 8 H100s), 25 GB/s between machines (one 200 Gb/s NIC per GPU).
struct Links {
  double intra_node = 300e9;
  double inter_node = 25e9;
};
// The seconds a step's collectives take on `links` when nothing overlaps: each group's bytes
// (comm_bytes) x (n - 1) / n, a ring's share per rank, over its slowest link - the TP group's
// inside a machine unless it straddles machines (tp_within_node), the data-parallel group's
// across machines once the world spans more than one (ranks_per_node; 0: one machine).
double comm_seconds(const LayoutPlan& plan, int64_t ranks_per_node, const Links& links);

// Element counts of the parameter units (embed, blocks.0 .. blocks.L-1, final) as ParamStore
// lays them out (padded), for one tensor-parallel rank of tp.
std::vector<uint64_t> unit_numels(const ModelConfig& model, int64_t tp = 1);
// Elements of one dp shard of a unit of `numel` elements (16-element aligned).
uint64_t shard_numel(uint64_t numel, int64_t dp);

// The plan of one layout for `config` (its model, precision, data and parallel.prefetch).
LayoutPlan plan_layout(const TrainConfig& config, const Layout& layout);
// Every layout for `world` ranks on machines of ranks_per_node ranks; marks fits (when budget is
// set: the training total and the start-up peak both within it), within_node, comm_seconds, and
// the suggestion: among the trainable layouts that fit (all, without a budget) and whose TP
// groups stay inside a machine (a TP all-reduce per layer over the network is what no one
// wants), the least recomputation, then the least time in collectives (bytes weighted by the
// link they cross: a TP byte inside a machine costs less than a data-parallel byte between
// machines), then the least memory.
Result<std::vector<LayoutPlan>> plan_layouts(const TrainConfig& config, int64_t world,
                                             std::optional<uint64_t> budget,
                                             int64_t ranks_per_node = 8, Links links = {});

}  // namespace kiln::engine
