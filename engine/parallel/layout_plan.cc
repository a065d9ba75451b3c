#include "engine/parallel/layout_plan.h"

#include <algorithm>
#include <cctype>
#include <cmath>

#include "engine/model/model.h"
#include "engine/model/params.h"

namespace kiln::engine {
namespace {

uint64_t round_up(uint64_t n, uint64_t a) { return (n + a - 1) / a * a; }

// ParamStore's layout: tensors at 16-element offsets inside a unit, the unit padded to 64.
struct UnitBuilder {
  uint64_t numel = 0;
  void add(uint64_t n) { numel = round_up(numel, 16) + n; }
  uint64_t done() const { return round_up(numel, 64); }
};

uint64_t elem_bytes(Precision p) { return p == Precision::kFp32 ? 4 : 2; }

int recompute_rank(Recompute r) {
  switch (r) {
    case Recompute::kNone:
      return 0;
    case Recompute::kSelective:
      return 1;
    case Recompute::kFull:
      return 2;
  }
  return 0;
}

// Activations of one micro-batch on one tensor-parallel rank: engine/model/model.cc's own plan.
uint64_t activation_bytes(const TrainConfig& c, int64_t tp, Recompute mode) {
  return plan_activation_memory(c.model, c.data.micro_batch, c.precision, mode, tp, c.device)
      .total();
}

}  // namespace

bool layout_trainable(const Layout& l) {
  // Every ZeRO stage, alone or with tensor parallelism (engine/parallel/zero.h,
  // engine/parallel/tensor_parallel.h).
  return l.tp >= 1 && l.dp >= 1 && l.zero_stage >= 0 && l.zero_stage <= 3;
}

bool tp_within_node(int64_t tp, int64_t world, int64_t ranks_per_node) {
  // comm/topology.h: a TP group is tp adjacent ranks; mpirun --map-by slot fills a machine with
  // consecutive ranks, so the group stays inside one when tp divides the machine's rank count.
  return ranks_per_node <= 0 || world <= ranks_per_node || ranks_per_node % tp == 0;
}

uint64_t LayoutPlan::comm_total() const {
  uint64_t s = 0;
  for (const auto& [k, v] : comm_bytes) s += v;
  return s;
}

std::vector<uint64_t> unit_numels(const ModelConfig& m, int64_t tp) {
  const uint64_t V = static_cast<uint64_t>(m.vocab_size), C = static_cast<uint64_t>(m.d_model),
                 T = static_cast<uint64_t>(m.seq_len), t = static_cast<uint64_t>(tp);
  std::vector<uint64_t> units;
  // engine/model/params.cc's layout: llama has no position table and no norm biases, its MLP's
  // first layer is SwiGLU's gate and up (2 ffn rows); model.bias and model.tie_embeddings drop
  // the biases and add an LM head.
  const bool llama = m.llama(), bias = m.bias;
  const uint64_t QKV = static_cast<uint64_t>(m.qkv_width()), F = static_cast<uint64_t>(m.ffn());
  const uint64_t FC = llama ? 2 * F : F, A = static_cast<uint64_t>(m.n_heads * m.head_dim());
  UnitBuilder embed;
  embed.add((V + t - 1) / t * C);  // vocabulary-parallel rows
  if (!llama) embed.add(T * C);    // wpe
  units.push_back(embed.done());
  for (int64_t l = 0; l < m.n_layers; ++l) {
    UnitBuilder b;
    b.add(C);                  // ln1.weight
    if (!llama) b.add(C);      // ln1.bias
    b.add(QKV * C / t);        // attn.qkv.weight (column)
    if (bias) b.add(QKV / t);  // attn.qkv.bias
    b.add(C * A / t);          // attn.proj.weight (row)
    if (bias) b.add(C);        // attn.proj.bias (replicated)
    b.add(C);                  // ln2.weight
    if (!llama) b.add(C);      // ln2.bias
    b.add(FC * C / t);         // mlp.fc.weight (column)
    if (bias) b.add(FC / t);   // mlp.fc.bias
    b.add(F * C / t);          // mlp.proj.weight (row)
    if (bias) b.add(C);        // mlp.proj.bias (replicated)
    units.push_back(b.done());
  }
  UnitBuilder f;
  f.add(C);
  if (!llama) f.add(C);
  if (!m.tie_embeddings) f.add((V + t - 1) / t * C);  // lm_head.weight (vocabulary-parallel)
  units.push_back(f.done());
  return units;
}

uint64_t shard_numel(uint64_t numel, int64_t dp) {
  return round_up((numel + dp - 1) / static_cast<uint64_t>(dp), 16);
}

LayoutPlan plan_layout(const TrainConfig& c, const Layout& lay) {
  LayoutPlan p;
  p.layout = lay;
  p.trainable = layout_trainable(lay);
  const std::vector<uint64_t> units = unit_numels(c.model, lay.tp);
  const uint64_t e = elem_bytes(c.precision);
  const bool low = c.precision != Precision::kFp32;
  uint64_t full = 0, shard = 0, largest = 0;
  for (uint64_t n : units) {
    full += n;
    shard += lay.dp > 1 ? shard_numel(n, lay.dp) : n;
    largest = std::max(largest, n);
  }
  auto padded_of = [&](uint64_t n) { return lay.dp > 1 ? shard_numel(n, lay.dp) * lay.dp : n; };
  const uint64_t largest_padded = padded_of(largest);
  const uint64_t embed_padded = padded_of(units.front());
  const int64_t z = lay.zero_stage;
  RankMemory& mem = p.memory;
  mem.params = (z >= 3 ? shard : full) * e;
  mem.grads = (z >= 2 ? shard : full) * 4;
  if (z == 1 && lay.dp > 1)
    mem.grads += shard * 4;  // + the reduced gradient shards (engine/parallel/zero.h)
  const uint64_t opt_elems = z >= 1 ? shard : full;
  mem.optimizer = opt_elems * 8 + (low ? opt_elems * 4 : 0);
  // fp32 below ZeRO-3 keeps its full master weights as the working weights; with ZeRO-1/2 they
  // are not part of the sharded optimizer state (already counted in params).
  mem.activations = activation_bytes(c, lay.tp, lay.recompute);
  // Built in place from ranges (ParamStore::fill, ZeroOptimizer::create): nothing but the
  // states, and a chunk of fp32 values rounded into the bf16/fp16 working weights (ZeRO-1/2).
  mem.startup =
      mem.model_states() +
      (low && lay.dp > 1 && (z == 1 || z == 2) ? std::min<uint64_t>(kStateChunk, largest) * 4 : 0);
  if (lay.dp > 1) {
    // One unit reduced at a time: the reduction's receive scratch (fp32).
    mem.buffers = largest_padded * 4;

    // ZeRO-2/3 (engine/parallel/zero.h): full gradient buffers exist only during backward: the
    // embeddings' (written by the LM head and at the end), the unit being written and the one
    // being reduce-scattered. ZeRO-3 also holds gathered weights: the head's two units (tied
    // embedding and final norm) or the unit in use, plus parallel.prefetch gathered ahead.
    if (z >= 2) mem.buffers += (embed_padded + 2 * largest_padded) * 4;
    if (z >= 3)
      mem.buffers += (2 + static_cast<uint64_t>(c.parallel.prefetch)) * largest_padded * e;
  }

  // Communication per optimizer step.
  const uint64_t A = static_cast<uint64_t>(c.data.grad_accum);
  const uint64_t padded = [&] {
    uint64_t s = 0;
    for (uint64_t n : units) s += lay.dp > 1 ? shard_numel(n, lay.dp) * lay.dp : n;
    return s;
  }();
  if (lay.dp > 1) {
    if (z == 0) {
      p.comm_bytes["dp.all_reduce"] = 2 * padded * 4;
    } else if (z == 1) {
      p.comm_bytes["dp.reduce_scatter"] = padded * 4;
      p.comm_bytes["dp.all_gather"] = padded * e;
    } else if (z == 2) {  // the gradients are reduced as each micro-batch's backward finishes them
      p.comm_bytes["dp.reduce_scatter"] = padded * 4 * A;
      p.comm_bytes["dp.all_gather"] = padded * e;
    } else {
      p.comm_bytes["dp.all_gather"] = 2 * padded * e * A;
      p.comm_bytes["dp.reduce_scatter"] = padded * 4 * A;
    }
  }
  if (lay.tp > 1) {
    const ModelConfig& m = c.model;
    const uint64_t bt = static_cast<uint64_t>(c.data.micro_batch * m.seq_len);
    const uint64_t btc = bt * static_cast<uint64_t>(m.d_model);
    const uint64_t L = static_cast<uint64_t>(m.n_layers);
    // engine/parallel/tensor_parallel.h, per micro-batch: 2 all-reduces per block in forward
    // (attention out, MLP down) and 2 in backward (the inputs of QKV and MLP up), the embedding
    // output and the head's input gradient (fp32 on the wire, 2x as all-reduces), L more with full
    // recomputation (attention out is rerun), and the cross-entropy's row maxima and sums (3
    // fp32 per row); per step: the gradient norm (one fp64).
    const uint64_t per_act = 2 * btc * 4;
    const uint64_t blocks = 4 * L + 2 + (lay.recompute == Recompute::kFull ? L : 0);
    const uint64_t act = blocks * per_act + 3 * 2 * bt * 4;
    p.comm_bytes["tp.all_reduce"] = act * A + 2 * 8;
  }
  return p;
}

double comm_seconds(const LayoutPlan& p, int64_t ranks_per_node, const Links& links) {
  const int64_t tp = p.layout.tp, dp = p.layout.dp, world = tp * dp;
  const bool one_machine = ranks_per_node <= 0 || world <= ranks_per_node;
  const double tp_link =
      tp_within_node(tp, world, ranks_per_node) ? links.intra_node : links.inter_node;
  // A data-parallel group (ranks t, t + tp, ...) crosses machines once the world does.
  const double dp_link = one_machine ? links.intra_node : links.inter_node;
  double s = 0;
  for (const auto& [name, bytes] : p.comm_bytes) {
    const bool is_tp = name.rfind("tp.", 0) == 0;
    const double n = static_cast<double>(is_tp ? tp : dp);
    s += static_cast<double>(bytes) * (n - 1) / n / (is_tp ? tp_link : dp_link);
  }
  return s;
}

Result<std::vector<LayoutPlan>> plan_layouts(const TrainConfig& c, int64_t world,
                                             std::optional<uint64_t> budget, int64_t ranks_per_node,
                                             Links links) {
  if (world < 1) return Status::usage("--world must be at least 1");
  if (ranks_per_node < 0) return Status::usage("--gpus-per-node must be at least 1");
  if (!(links.intra_node > 0) || !(links.inter_node > 0)) {
    return Status::usage("link bandwidths must be positive");
  }
  std::vector<LayoutPlan> out;
  for (int64_t tp = 1; tp <= world; ++tp) {
    if (world % tp != 0 || c.model.n_heads % tp != 0 || c.model.kv_heads() % tp != 0 ||
        c.model.ffn() % tp != 0) {
      continue;
    }
    const int64_t dp = world / tp;
    for (int64_t z = 0; z <= 3; ++z) {
      if (dp == 1 && z > 0) continue;  // nothing to shard over
      for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
        LayoutPlan p = plan_layout(c, Layout{tp, dp, z, r});
        if (budget) p.fits = std::max(p.memory.total(), p.memory.startup) <= *budget;
        p.within_node = tp_within_node(tp, world, ranks_per_node);
        p.comm_seconds = comm_seconds(p, ranks_per_node, links);
        out.push_back(std::move(p));
      }
    }
  }
  LayoutPlan* best = nullptr;
  auto key = [](const LayoutPlan& p) {
    return std::make_tuple(recompute_rank(p.layout.recompute), p.comm_seconds, p.memory.total());
  };
  for (auto& p : out) {
    if ((p.fits.has_value() && !*p.fits) || !p.trainable || !p.within_node) continue;
    if (!best || key(p) < key(*best)) best = &p;
  }
  if (best) best->suggested = true;
  return out;
}

}  // namespace kiln::engine
