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
  Topology t;
  t.world = &world;
  const int r = world.rank();
  t.tp_size = o.tp;
  t.dp_size = W / o.tp;
  t.tp_rank = r % o.tp;
  t.dp_rank = r / o.tp;
  KILN_ASSIGN_OR_RETURN(t.tp, world.split(r / o.tp, r, "tp"));
  KILN_ASSIGN_OR_RETURN(t.dp, world.split(r % o.tp, r, "dp"));
  if (o.hierarchical) {
    // DP ranks per node: the node's ranks divided among its TP groups.
    const int node = o.node_size > 0 ? o.node_size : node_size_from_env(W);
    if (node % o.tp != 0) {
      return Status::config("parallel.tp " + std::to_string(o.tp) +
                            " does not divide the node size " + std::to_string(node) +
                            ": a tensor-parallel group must stay inside one machine")
          .with_key("parallel.tp");
    }
    const int per_node = std::min(node / o.tp, t.dp_size);
    KILN_ASSIGN_OR_RETURN(t.dp, make_hierarchical_group(std::move(t.dp), per_node));
  }
  return t;
}

}  // namespace kiln::comm
