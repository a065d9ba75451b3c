#include "comm/topology.h"

#include <cstdlib>
#include <cstring>

namespace kiln::comm {
namespace {

class HierarchicalGroup final : public ProcessGroup {
 public:
  HierarchicalGroup(std::unique_ptr<ProcessGroup> flat, std::unique_ptr<ProcessGroup> intra,
                    std::unique_ptr<ProcessGroup> inter)
      : flat_(std::move(flat)), intra_(std::move(intra)), inter_(std::move(inter)) {}

  int rank() const override { return flat_->rank(); }
  int size() const override { return flat_->size(); }
  const char* backend() const override { return flat_->backend(); }
  [[noreturn]] void abort(int code) override {
    flat_->abort(code);
    std::_Exit(code);
  }

  const ProcessGroup& intra() const { return *intra_; }
  const ProcessGroup& inter() const { return *inter_; }

 protected:
  Status do_barrier() override { return flat_->barrier(); }
  Status do_bcast(void* data, size_t bytes, int root) override {
    return flat_->bcast(data, bytes, root);
  }
  Status do_allgatherv(const void* send, size_t send_bytes, void* recv,
                       const size_t* recv_bytes) override {
    return flat_->allgatherv(send, send_bytes, recv, recv_bytes);
  }
  Status do_gatherv(const void* send, size_t send_bytes, void* recv, const size_t* recv_bytes,
                    int root) override {
    return flat_->gatherv(send, send_bytes, recv, recv_bytes, root);
  }
  Status do_alltoallv(const void* send, const size_t* send_bytes, void* recv,
                      const size_t* recv_bytes) override {
    return flat_->alltoallv(send, send_bytes, recv, recv_bytes);
  }
  Status do_reduce_scatter(const void* send, void* recv, size_t recv_count, DType dtype,
                           ReduceOp op) override {
    return flat_->reduce_scatter(send, recv, recv_count, dtype, op);
  }
  Result<std::unique_ptr<ProcessGroup>> do_split(int color, int key) override {
    return flat_->split(color, key);
  }
  std::unique_ptr<Work> do_isend(const void* data, size_t bytes, int peer, int tag) override {
    return flat_->isend(data, bytes, peer, tag);
  }
  std::unique_ptr<Work> do_irecv(void* data, size_t bytes, int peer, int tag) override {
    return flat_->irecv(data, bytes, peer, tag);
  }

  // Intra-node reduce-scatter, inter-node all-reduce of this rank's shard, intra-node all-gather.
  Status do_allreduce(void* data, size_t count, DType dtype, ReduceOp op) override {
    const int k = intra_->size();
    const size_t elem = dtype_size(dtype);
    const size_t block = (count + k - 1) / k;
    padded_.assign(block * k * elem, 0);
    if (count) std::memcpy(padded_.data(), data, count * elem);
    shard_.resize(block * elem);
    KILN_RETURN_IF_ERROR(intra_->reduce_scatter(padded_.data(), shard_.data(), block, dtype, op));
    KILN_RETURN_IF_ERROR(inter_->allreduce(shard_.data(), block, dtype, op));
    KILN_RETURN_IF_ERROR(intra_->allgather(shard_.data(), block * elem, padded_.data()));
    if (count) std::memcpy(data, padded_.data(), count * elem);
    return Status::ok();
  }

 private:
  std::unique_ptr<ProcessGroup> flat_, intra_, inter_;
  std::vector<char> padded_, shard_;
};

}  // namespace

std::vector<const ProcessGroup*> Topology::groups() const {
  std::vector<const ProcessGroup*> out{world};
  if (dp) {
    out.push_back(dp.get());
    if (const ProcessGroup* g = intra_node_group(*dp)) out.push_back(g);
    if (const ProcessGroup* g = inter_node_group(*dp)) out.push_back(g);
  }
  if (tp) out.push_back(tp.get());
  if (pp && pp_size > 1) out.push_back(pp.get());
  if (embed) out.push_back(embed.get());
  return out;
}

int node_size_from_env(int fallback) {
  for (const char* var : {"KILN_NODE_SIZE", "OMPI_COMM_WORLD_LOCAL_SIZE", "MPI_LOCALNRANKS"}) {
    if (const char* v = std::getenv(var)) {
      const int n = std::atoi(v);
      if (n > 0) return n;
    }
  }
  return fallback;
}

Result<std::unique_ptr<ProcessGroup>> make_hierarchical_group(std::unique_ptr<ProcessGroup> flat,
                                                              int ranks_per_node) {
  const int n = flat->size();
  if (ranks_per_node <= 0 || n % ranks_per_node != 0) {
    return Status::config("hierarchical all-reduce: " + std::to_string(ranks_per_node) +
                          " ranks per node does not divide the group's " + std::to_string(n) +
                          " ranks");
  }
  const int r = flat->rank();
  const std::string name = flat->name();
  KILN_ASSIGN_OR_RETURN(auto intra, flat->split(r / ranks_per_node, r, name + ".intra_node"));
  KILN_ASSIGN_OR_RETURN(auto inter, flat->split(r % ranks_per_node, r, name + ".inter_node"));
  auto g = std::make_unique<HierarchicalGroup>(std::move(flat), std::move(intra), std::move(inter));
  g->set_name(name);
  return std::unique_ptr<ProcessGroup>(std::move(g));
}

const ProcessGroup* intra_node_group(const ProcessGroup& g) {
  auto* h = dynamic_cast<const HierarchicalGroup*>(&g);
  return h ? &h->intra() : nullptr;
}

const ProcessGroup* inter_node_group(const ProcessGroup& g) {
  auto* h = dynamic_cast<const HierarchicalGroup*>(&g);
  return h ? &h->inter() : nullptr;
}

Result<Topology> make_topology(ProcessGroup& world, const TopologyOptions& o) {
  const int W = world.size();
  if (o.tp < 1 || W % o.tp != 0) {
    return Status::config("parallel.tp " + std::to_string(o.tp) + " does not divide the " +
                          std::to_string(W) + " ranks of this job (data-parallel size is world / tp)")
        .with_key("parallel.tp");
  }
  if (o.pp < 1 || W % (o.tp * o.pp) != 0) {
    return Status::config("parallel.pp " + std::to_string(o.pp) + " times parallel.tp " +
                          std::to_string(o.tp) + " does not divide the " + std::to_string(W) +
                          " ranks of this job (data-parallel size is world / (tp * pp))")
        .with_key("parallel.pp");
  }
  Topology t;
  t.world = &world;
  const int r = world.rank();
  const int tp = o.tp, pp = o.pp;
  t.tp_size = tp;
  t.pp_size = pp;
  t.dp_size = W / (tp * pp);
  t.tp_rank = r % tp;
  t.pp_rank = (r / tp) % pp;
  t.dp_rank = r / (tp * pp);
  // Every rank takes part in every split, in this order. Colors: the coordinates the group's
  // members share, numbered densely; keys: the world rank, so members are ordered by the
  // coordinate that varies (tp_rank, pp_rank or dp_rank: it grows with the world rank).
  KILN_ASSIGN_OR_RETURN(t.tp, world.split(t.dp_rank * pp + t.pp_rank, r, "tp"));
  KILN_ASSIGN_OR_RETURN(t.pp, world.split(t.dp_rank * tp + t.tp_rank, r, "pp"));
  KILN_ASSIGN_OR_RETURN(t.dp, world.split(t.pp_rank * tp + t.tp_rank, r, "dp"));
  if (pp > 1) {
    // First and last stage of one pipeline (same dp_rank and tp_rank): a group of two. Every
    // rank calls split; a middle stage gets a group of its own (a color no pair uses), which is
    // dropped: embed is nullptr there.
    const bool end_stage = t.pp_rank == 0 || t.pp_rank == pp - 1;
    const int pairs = t.dp_size * tp;
    const int color = end_stage ? t.dp_rank * tp + t.tp_rank : pairs + r;
    KILN_ASSIGN_OR_RETURN(std::unique_ptr<ProcessGroup> embed, world.split(color, r, "embed"));
    if (end_stage) t.embed = std::move(embed);
  }
  if (o.hierarchical) {
    // DP ranks per node. Nodes hold `node` consecutive world ranks, a DP group's members are
    // tp * pp apart: a node holds node / (tp * pp) of them when tp * pp divides the node size
    // (pipelines inside a machine), exactly one when the node size divides tp * pp (pipeline
    // stages on different machines, the usual 3D layout: the intra-node part is then a group of
    // one and the all-reduce crosses the network as the flat one does).
    const int node = o.node_size > 0 ? o.node_size : node_size_from_env(W);
    if (node % tp != 0) {
      return Status::config("parallel.tp " + std::to_string(tp) +
                            " does not divide the node size " + std::to_string(node) +
                            ": a tensor-parallel group must stay inside one machine")
          .with_key("parallel.tp");
    }
    const int span = tp * pp;
    if (node % span != 0 && span % node != 0) {
      return Status::config("parallel.pp " + std::to_string(pp) + ": tp * pp = " +
                            std::to_string(span) + " and the node size " + std::to_string(node) +
                            " do not divide one another, so the data-parallel groups are spread "
                            "unevenly over machines (hierarchical all-reduce needs the same "
                            "number of DP ranks on each)")
          .with_key("parallel.pp");
    }
    const int per_node = std::min(node % span == 0 ? node / span : 1, t.dp_size);
    KILN_ASSIGN_OR_RETURN(t.dp, make_hierarchical_group(std::move(t.dp), per_node));
  }
  return t;
}

}  // namespace kiln::comm
