// Memory, communication and time model of a training layout: what `kiln plan` prints.
//
// For a config and a world size, every layout (tp dividing the world and the head count, pp
// pipeline stages dividing world / tp and at most n_layers, dp = world / (tp pp), ZeRO stage 0-3
// (0-1 with pp > 1: the pipeline refuses 2 and 3), activation checkpointing none / selective /
// full, and with pp > 1 the schedule 1F1B or GPipe) gets, per pipeline stage, its bytes per rank
// and its bytes moved per optimizer step, from the engine's own storage rules:
//   params      the working weights forward/backward read: fp32 master weights in fp32, the
//               bf16/fp16 copy otherwise; sharded over dp by ZeRO-3
//   grads       fp32 gradients (every precision); sharded over dp from ZeRO-2; ZeRO-1 holds the
//               full accumulation buffers and its reduced shard
//   optimizer   AdamW moments (fp32) and, in bf16/fp16, the fp32 master weights; sharded from
//               ZeRO-1
//   activations engine/model/model.h's plan for the stage (its blocks, embedding, head) with the
//               micro-batches it keeps in flight: 1 without pipelining, under 1F1B min(m, pp - s)
//               on stage s (the first stage the most), under GPipe all m = data.grad_accum;
//               tensor-parallel parts divided by tp; with pp > 1 the plan includes the buffers
//               the stages send and receive
//   buffers     communication scratch: ZeRO-0/1 reduce one unit (embeddings, a block, the final
//               norm) at a time; ZeRO-2 also holds full gradients of at most three units during
//               backward (the embeddings', the unit being written, the one being reduced);
//               ZeRO-3 in addition 2 + parallel.prefetch gathered units of weights
//   startup     the peak while the model states are built or loaded (RankMemory::startup)
// Model states count only the stage's parameter units (engine/model/params.h PpStage): its
// blocks, the embeddings on the first stage and, when the LM head is tied to them, a second copy
// on the last, the final unit on the last. The layout's figure is its worst rank's (the stage
// with the largest peak; usually the first, which keeps the most micro-batches in flight).
// Tensor parallelism (Megatron): QKV, MLP-up (column), attention-out and MLP-down (row) and the
// vocabulary-parallel embedding are split over tp; norms, row-parallel biases and position
// embeddings are replicated. A "unit" is sharded over dp in equal, 16-element-aligned pieces.
//
// Bytes per step are logical volumes per rank as comm/comm.h counts them (group.op, the names of
// metrics.jsonl's comm_bytes): a data-parallel all-reduce of G bytes of gradients is 2G; ZeRO-1
// reduce-scatters the gradients (G) once per step, ZeRO-2 once per micro-batch, and both
// all-gather the updated weights once per step; ZeRO-3 all-gathers the weights in forward and
// again in backward and reduce-scatters the gradients, per micro-batch - each over the stage's
// units only. Tensor parallelism (engine/parallel/tensor_parallel.h) all-reduces fp32
// activations twice per block in forward and twice in backward (once more per block with full
// recomputation), the embedding output once (first stage), the head's input gradient once and
// three fp32 per-row statistics of the vocabulary-parallel cross-entropy (last stage), and the
// gradient norm. Pipeline stages (pp.send / pp.recv) exchange per micro-batch one (micro_batch,
// seq_len, d_model) tensor of the work dtype forward and its gradient backward across each
// boundary: 2 m B T C e bytes per boundary per step. The tied embedding's gradients are
// all-reduced between the first and last stage (embed.all_reduce, 2x the unit's fp32 bytes).
//
// Time (seconds per step, estimate_step): compute at `efficiency` x `peak_flops` per rank, the
// model FLOPs of the costliest stage (forward 2 x the matrix sizes + the causal attention scores
// per token, backward twice forward, full recomputation one more forward of the blocks, selective
// the attention scores again), and the links of Hardware: the TP group's inside a machine, a
// pipeline boundary and the data-parallel group over the network when they leave one. A micro-
// batch's slot is its compute + its TP all-reduces + receiving its input and output gradient;
// the pipeline runs m + pp - 1 slots (the bubble: (pp - 1) / (m + pp - 1) of them idle), then
// the data-parallel and tied-embedding reductions; nothing overlaps.
// Pure functions; thread-safe.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "common/status.h"
#include "engine/config/train_config.h"
#include "engine/model/params.h"

namespace kiln::engine {

struct Layout {
  int64_t tp = 1, dp = 1, zero_stage = 0;
  Recompute recompute = Recompute::kNone;
  int64_t pp = 1;
  PpSchedule schedule = PpSchedule::k1F1B;  // with pp > 1
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
  uint64_t peak() const { return total() > startup ? total() : startup; }
};

// Whether this version's `kiln train` runs the layout (engine/parallel/parallelism.h,
// engine/parallel/pipeline.h: ZeRO-2/3 with pp > 1 are refused); the others are estimates on
// paper.
bool layout_trainable(const Layout& layout);
// Whether every tensor-parallel group (tp adjacent ranks, comm/topology.h) stays inside one
// machine of ranks_per_node ranks (consecutive ranks per machine, mpirun --map-by slot): world
// fits one machine, or tp divides ranks_per_node. ranks_per_node 0: unknown (always true).
bool tp_within_node(int64_t tp, int64_t world, int64_t ranks_per_node);

// One pipeline stage's ranks (all of them alike: every tp and dp rank of the stage).
struct StagePlan {
  PpStage stage;  // rank, size, blocks [first_block, end_block)
  int slots = 1;  // micro-batches whose activations it keeps at once
  RankMemory memory;
  // Bytes per rank of this stage per step by group.op: "dp.all_reduce", "dp.reduce_scatter",
  // "dp.all_gather", "tp.all_reduce", "pp.send", "pp.recv", "embed.all_reduce".
  std::map<std::string, uint64_t> comm_bytes;
  // Forward FLOPs per token of the stage's units on one tensor-parallel rank (training: x3, and
  // the recomputation).
  double forward_flops_per_token = 0;
};

struct LayoutPlan {
  Layout layout;
  bool trainable = false;         // layout_trainable()
  std::vector<StagePlan> stages;  // pp entries
  int worst_stage = 0;            // the stage with the largest peak (memory below)
  RankMemory memory;              // stages[worst_stage].memory
  // Per group.op: the largest bytes per rank per step over the stages.
  std::map<std::string, uint64_t> comm_bytes;
  int64_t micro_batches = 1;  // m: data.grad_accum
  double bubble = 0;          // (pp - 1) / (m + pp - 1)
  std::optional<bool> fits;   // set when a memory budget is known: every stage's peak within it
  bool within_node = true;    // tp_within_node(): the TP all-reduces stay on a machine's links
  bool suggested = false;
  // Estimates (estimate_step; plan_layouts fills them): seconds per step in the collectives of
  // the busiest rank with nothing overlapped (comm_seconds()), in compute with the bubble, the
  // step, and tokens per second of the whole world.
  double comm_seconds = 0;
  double compute_seconds = 0;
  double step_seconds = 0;
  double tokens_per_second = 0;
  uint64_t comm_total() const;
};

// The links the collectives run over, bytes per second per rank in each direction: between the
// ranks of one machine (NVLink, or shared memory for CPU ranks) and between machines (the
// network). Defaults: 300 GB/s inside a machine (NVLink 4 achieves ~360 GB/s of all-reduce bus
// bandwidth on 8 H100s), 50 GB/s between machines (InfiniBand, ~50 GB/s per link: one 400 Gb/s
// NIC per GPU; /work/shared/DOMAIN-NOTES.md).
struct Links {
  double intra_node = 300e9;
  double inter_node = 50e9;
};
// What a step's time is estimated on: the machines, their links and each rank's arithmetic.
// peak_flops: dense bf16 of an H100 SXM (989 TFLOP/s); efficiency: the share of it the model's
// kernels reach (0.5: Megatron-Core reports 41-48% MFU on H100 with its communication and
// bubble included; a large bf16 GEMM alone reaches ~80%).
struct Hardware {
  int64_t ranks_per_node = 8;  // 0: unknown (one machine)
  Links links;
  double peak_flops = 989e12;
  double efficiency = 0.5;
};

// The seconds a step's collectives take on `links` on the busiest rank when nothing overlaps:
// per stage, each group's bytes (comm_bytes) x (n - 1) / n, a ring's share per rank, over its
// slowest link - the TP group's inside a machine unless it straddles machines (tp_within_node),
// the data-parallel group's across machines once the world spans more than one (ranks_per_node;
// 0: one machine), a pipeline boundary's (sends, n = 2: the bytes themselves) and the tied
// embedding's pair across machines when their ranks are on different ones.
double comm_seconds(const LayoutPlan& plan, int64_t ranks_per_node, const Links& links);
// Fills plan's comm_seconds, compute_seconds, step_seconds and tokens_per_second (the header's
// time model) for `config` (its model, micro_batch, seq_len).
void estimate_step(const TrainConfig& config, const Hardware& hw, LayoutPlan* plan);

// Element counts of the parameter units (embed, blocks.0 .. blocks.L-1, final) as ParamStore
// lays them out (padded), for one tensor-parallel rank of tp.
std::vector<uint64_t> unit_numels(const ModelConfig& model, int64_t tp = 1);
// Elements of one dp shard of a unit of `numel` elements (16-element aligned).
uint64_t shard_numel(uint64_t numel, int64_t dp);
// The micro-batches stage `stage` of `pp` keeps in flight under `schedule` with m micro-batches
// per step: 1F1B min(m, pp - stage), GPipe m; 1 without pipelining.
int pp_slots(PpSchedule schedule, int64_t pp, int64_t stage, int64_t m);
// The bubble fraction (pp - 1) / (m + pp - 1): the share of a step's pipeline slots a stage idles.
double pp_bubble(int64_t pp, int64_t m);

// The plan of one layout for `config` (its model, precision, data: micro_batch, grad_accum = m;
// parallel.prefetch; parallel.pp_layers when layout.pp is parallel.pp, else the cost-balanced
// split). No time estimate (estimate_step).
LayoutPlan plan_layout(const TrainConfig& config, const Layout& layout);

// The byte counts plan_layout computes for `config`, bounded before any is computed: a config
// whose model states, activations, logits or bytes moved per step would pass 2^60 bytes (1 EiB)
// on a rank - past any machine, and close to where 64-bit counts wrap (a huge but legal config
// once printed wrapped figures) - is a kConfig error naming the key that makes it so (upper
// bounds in long double: tp = pp = dp = 1, every micro-batch in flight). plan_layouts and the
// trainer's memory preflight (engine/train/preflight.h) call it.
Status check_plan_sizes(const TrainConfig& config);

// Which layouts plan_layouts lists (unset: all).
struct PlanFilter {
  std::optional<int64_t> tp, pp;
  std::optional<PpSchedule> schedule;
  // Sequences per step (the global batch): each layout runs m = global_batch / (dp micro_batch)
  // micro-batches (layouts whose dp x micro_batch does not divide it, or whose m is past
  // data.grad_accum's limit of 2^20, are left out); unset: every
  // layout runs data.grad_accum (so the global batch grows with dp).
  std::optional<int64_t> global_batch;
};

// Every layout for `world` ranks on `hw`; marks fits (when budget is set: every stage's training
// total and start-up peak within it), within_node, the time estimate, and the suggestion: among
// the trainable layouts that fit (all, without a budget) and whose TP groups stay inside a
// machine (a TP all-reduce per layer over the network is what no one wants), the most tokens per
// second (estimate_step), then the least memory.
Result<std::vector<LayoutPlan>> plan_layouts(const TrainConfig& config, int64_t world,
                                             std::optional<uint64_t> budget, const Hardware& hw,
                                             const PlanFilter& filter = {});
// The same on default hardware with ranks_per_node and links.
Result<std::vector<LayoutPlan>> plan_layouts(const TrainConfig& config, int64_t world,
                                             std::optional<uint64_t> budget,
                                             int64_t ranks_per_node = 8, Links links = {});

// The suggestion's reason in words: "TP 8 inside the machine, PP 8 across machines, DP 8 with
// ZeRO-1: fits in 80.00 GiB (worst rank, stage 0: 61.2 GiB); bubble 9.9% at 64 micro-batches; ...".
std::string describe_layout(const LayoutPlan& plan, int64_t ranks_per_node,
                            std::optional<uint64_t> budget);

}  // namespace kiln::engine
