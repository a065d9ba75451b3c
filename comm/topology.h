// How a training job's ranks are arranged: world = dp x pp x tp, tensor-parallel ranks adjacent,
// then pipeline stages, then data-parallel replicas (Megatron-LM's order).
//
// With world size W, tensor-parallel size tp and pipeline size pp (tp * pp divides W):
//   tp_rank = r % tp,  pp_rank = (r / tp) % pp,  dp_rank = r / (tp * pp).
// - tp group: the ranks with r's dp_rank and pp_rank (r - r % tp ... + tp - 1, adjacent, so under
//   mpirun's default by-slot placement a TP group stays inside one machine), by tp_rank.
// - pp group ("pp"): the ranks with r's dp_rank and tp_rank, by pp_rank (stage s is group rank
//   s; consecutive stages are tp world ranks apart). Always created (one rank when pp == 1).
// - dp group: the ranks with r's tp_rank and pp_rank, by dp_rank (tp * pp world ranks apart).
//   TP peers share a dp_rank, so they read the same batch; so do the stages of one pipeline.
// - embed group ("embed", pp > 1 only): the first and last stage of r's pipeline (pp_rank 0 and
//   pp - 1, same dp_rank and tp_rank), group ranks 0 and 1, for the tied embedding's gradients.
//   Only those ranks hold it: on middle stages and when pp == 1 it is nullptr.
// With pp == 1 this is the two-dimensional layout (tp_rank r % tp, dp_rank r / tp) as before.
//
// Hierarchical all-reduce (an option for the data-parallel group): with `ranks_per_node` DP ranks
// on each machine (node_size / (tp * pp) of each DP group when tp * pp divides the node size;
// one when the node size divides tp * pp, i.e. pipeline stages on different machines, where the
// hierarchical all-reduce is the flat one; otherwise kConfig naming parallel.pp), an all-reduce
// becomes an intra-node reduce-scatter, an inter-node all-reduce of each rank's shard among the
// ranks with the same local index, and an intra-node all-gather, so only 1/ranks_per_node of the
// buffer crosses the network from each rank. The node size comes from the launcher
// (OMPI_COMM_WORLD_LOCAL_SIZE) or is declared (KILN_NODE_SIZE, for testing the path on one
// machine). Its floating-point sums are deterministic too (fixed order: within the node in
// local-rank order, then across nodes in node order), but differ in rounding from the flat group's.
//
// Groups are created collectively (every rank calls make_topology with the same arguments) and
// live as long as the Topology. Not thread-safe (as ProcessGroup).
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "comm/comm.h"
#include "common/status.h"

namespace kiln::comm {

struct TopologyOptions {
  int tp = 1;
  bool hierarchical = false;  // the dp group's all-reduce goes through the node first
  int node_size = 0;  // ranks per machine (world ranks); 0: from the launcher / KILN_NODE_SIZE
  int pp = 1;         // pipeline stages
};

struct Topology {
  ProcessGroup* world = nullptr;      // not owned
  std::unique_ptr<ProcessGroup> tp;   // this rank's tensor-parallel group
  std::unique_ptr<ProcessGroup> dp;   // this rank's data-parallel group (hierarchical or flat)
  std::unique_ptr<ProcessGroup> pp;   // this rank's pipeline (its stages by pp_rank)
  std::unique_ptr<ProcessGroup> embed;  // first + last stage; nullptr on middle stages, pp == 1
  int tp_size = 1, dp_size = 1, tp_rank = 0, dp_rank = 0;
  int pp_size = 1, pp_rank = 0;

  // Every group with its counters, world first (for metrics and logs): world, dp (and its
  // hierarchical parts), tp, then pp when pp_size > 1 and embed where this rank holds it.
  std::vector<const ProcessGroup*> groups() const;
};

// kConfig (key parallel.tp) when tp does not divide the world size, (key parallel.pp) when
// pp < 1 or tp * pp does not divide it.
Result<Topology> make_topology(ProcessGroup& world, const TopologyOptions& options);

// Ranks per machine: KILN_NODE_SIZE when set, else the launcher's local size, else `fallback`.
int node_size_from_env(int fallback);

// A group over `flat`'s ranks whose all-reduce (blocking and asynchronous) is hierarchical with
// `ranks_per_node` consecutive ranks per node (it must divide flat->size()); every other
// collective is flat's. Its own counters hold the logical collectives (as any group's); the split
// between node and network is in the counters of intra_node_group() / inter_node_group().
// Its asynchronous all-reduce completes before returning the handle.
Result<std::unique_ptr<ProcessGroup>> make_hierarchical_group(std::unique_ptr<ProcessGroup> flat,
                                                              int ranks_per_node);
// The node-local and cross-node parts of a hierarchical group (nullptr for other groups).
const ProcessGroup* intra_node_group(const ProcessGroup& g);
const ProcessGroup* inter_node_group(const ProcessGroup& g);

}  // namespace kiln::comm
