#include "engine/parallel/layout_plan.h"

#include <fmt/format.h>

#include <algorithm>
#include <cctype>
#include <cmath>
#include <cstdio>

#include "common/text.h"
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

// Activations on one tensor-parallel rank of a stage keeping `slots` micro-batches:
// engine/model/model.cc's own plan (the whole model, one micro-batch, without pipelining).
uint64_t activation_bytes(const TrainConfig& c, int64_t tp, Recompute mode, const PpStage& stage,
                          int slots) {
  if (stage.size == 1) {
    return plan_activation_memory(c.model, c.data.micro_batch, c.precision, mode, tp, c.device)
        .total();
  }
  return plan_activation_memory(c.model, c.data.micro_batch, c.precision, mode, tp, c.device, stage,
                                slots)
      .total();
}

// Forward FLOPs per token of one block and of the LM head (pp_stage_split's cost model): a
// block's four matrix products and its causal attention (half of the T x T scores, for QK^T and
// AV); the embedding lookup costs next to nothing.
struct FlopModel {
  double block = 0, attention = 0, head = 0;
  explicit FlopModel(const ModelConfig& m) {
    const double C = static_cast<double>(m.d_model), T = static_cast<double>(m.seq_len);
    const double CA = static_cast<double>(m.n_heads * m.head_dim());
    const double F = static_cast<double>(m.ffn()), FC = m.llama() ? 2 * F : F;
    attention = 2 * T * CA;
    block = 2 * (C * static_cast<double>(m.qkv_width()) + CA * C + C * FC + F * C) + attention;
    head = 2 * C * static_cast<double>(m.vocab_size);
  }
};

// Whether ranks a and a + k (k >= 0) are on different machines for some a in [a0, a0 + len):
// with consecutive ranks per machine that depends only on a's remainder by ranks_per_node n (a
// crossing is a remainder >= n - k), so it is found without visiting the ranks.
bool any_crosses(int64_t a0, int64_t len, int64_t k, int64_t n) {
  if (n <= 0 || k <= 0 || len <= 0) return false;
  if (k >= n || len >= n) return true;
  const int64_t b = a0 % n;  // the remainders b .. b + len - 1 (mod n)
  return b + len - 1 >= n - k;
}

// The data-parallel indices d to look at: the remainders of d x (a multiple of tp pp) by
// ranks_per_node repeat every ranks_per_node values of d (a world of 10^12 ranks once meant
// 10^12 iterations per stage).
int64_t dp_period(const Layout& l, int64_t ranks_per_node) {
  return std::min(l.dp, std::max<int64_t>(ranks_per_node, 1));
}

// Whether the boundary between stages s and s + 1 of some pipeline crosses machines (rank
// tp_rank + tp (pp_rank + pp dp_rank), comm/topology.h).
bool boundary_crosses(const Layout& l, int64_t s, int64_t ranks_per_node) {
  if (ranks_per_node <= 0 || l.tp * l.pp * l.dp <= ranks_per_node) return false;
  for (int64_t d = 0; d < dp_period(l, ranks_per_node); ++d) {
    if (any_crosses(l.tp * (s + l.pp * d), l.tp, l.tp, ranks_per_node)) return true;
  }
  return false;
}

// Whether some first and last stage of a pipeline (the tied embedding's pair) are on different
// machines.
bool ends_cross(const Layout& l, int64_t ranks_per_node) {
  if (ranks_per_node <= 0 || l.tp * l.pp * l.dp <= ranks_per_node) return false;
  for (int64_t d = 0; d < dp_period(l, ranks_per_node); ++d) {
    if (any_crosses(l.tp * l.pp * d, l.tp, l.tp * (l.pp - 1), ranks_per_node)) return true;
  }
  return false;
}

bool dp_crosses(const Layout& l, int64_t ranks_per_node) {
  // A data-parallel group (ranks tp pp apart) crosses machines once the world does.
  return ranks_per_node > 0 && l.tp * l.pp * l.dp > ranks_per_node;
}

// Seconds per step of one stage's collectives by kind, nothing overlapped.
struct StageSeconds {
  double tp = 0, dp = 0, pp = 0, embed = 0;
  double total() const { return tp + dp + pp + embed; }
};

StageSeconds stage_seconds(const LayoutPlan& p, const StagePlan& st, int64_t ranks_per_node,
                           const Links& links) {
  const Layout& l = p.layout;
  const int64_t world = l.tp * l.pp * l.dp;
  const double tp_link =
      tp_within_node(l.tp, world, ranks_per_node) ? links.intra_node : links.inter_node;
  const double dp_link = dp_crosses(l, ranks_per_node) ? links.inter_node : links.intra_node;
  auto link_of = [&](bool across) { return across ? links.inter_node : links.intra_node; };
  StageSeconds s;
  for (const auto& [name, bytes] : st.comm_bytes) {
    const double b = static_cast<double>(bytes);
    if (name.rfind("tp.", 0) == 0) {
      s.tp += b * static_cast<double>(l.tp - 1) / static_cast<double>(l.tp) / tp_link;
    } else if (name.rfind("dp.", 0) == 0) {
      s.dp += b * static_cast<double>(l.dp - 1) / static_cast<double>(l.dp) / dp_link;
    } else if (name == "embed.all_reduce") {
      s.embed += b / 2 / link_of(ends_cross(l, ranks_per_node));
    }
  }
  // Sends: the activations forward over boundary s, the gradients backward over boundary s - 1.
  if (l.pp > 1) {
    const int64_t k = st.stage.rank;
    const double half =
        static_cast<double>(st.comm_bytes.count("pp.send") ? st.comm_bytes.at("pp.send") : 0) /
        ((st.stage.first() || st.stage.last()) ? 1.0 : 2.0);
    if (!st.stage.last()) s.pp += half / link_of(boundary_crosses(l, k, ranks_per_node));
    if (!st.stage.first()) s.pp += half / link_of(boundary_crosses(l, k - 1, ranks_per_node));
  }
  return s;
}

std::string pct(double f) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f%%", 100 * f);
  return b;
}

}  // namespace

bool layout_trainable(const Layout& l) {
  // Every ZeRO stage, alone or with tensor parallelism (engine/parallel/zero.h,
  // engine/parallel/tensor_parallel.h).
  // With pipeline stages ZeRO-0/1 (engine/parallel/pipeline.h refuses 2 and 3: their gathers
  // and per-micro-batch reductions would repeat for every in-flight micro-batch of a stage).
  return l.tp >= 1 && l.dp >= 1 && l.pp >= 1 && l.zero_stage >= 0 &&
         l.zero_stage <= (l.pp > 1 ? 1 : 3);
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

int pp_slots(PpSchedule schedule, int64_t pp, int64_t stage, int64_t m) {
  if (pp <= 1) return 1;
  if (schedule == PpSchedule::kGPipe) return static_cast<int>(m);
  return static_cast<int>(std::min<int64_t>(m, pp - stage));
}

double pp_bubble(int64_t pp, int64_t m) {
  return static_cast<double>(pp - 1) / static_cast<double>(m + pp - 1);
}

LayoutPlan plan_layout(const TrainConfig& c, const Layout& lay) {
  LayoutPlan p;
  p.layout = lay;
  p.trainable = layout_trainable(lay);
  const ModelConfig& m = c.model;
  const std::vector<uint64_t> units = unit_numels(m, lay.tp);
  const uint64_t e = elem_bytes(c.precision);
  const bool low = c.precision != Precision::kFp32;
  const int64_t z = lay.zero_stage;
  const uint64_t A = static_cast<uint64_t>(c.data.grad_accum);
  p.micro_batches = c.data.grad_accum;
  p.bubble = lay.pp > 1 ? pp_bubble(lay.pp, c.data.grad_accum) : 0.0;
  const std::vector<int64_t> bounds = pp_stage_split(
      m, lay.pp, lay.pp == c.parallel.pp ? c.parallel.pp_layers : std::vector<int64_t>{});
  const FlopModel flops(m);
  auto padded_of = [&](uint64_t n) { return lay.dp > 1 ? shard_numel(n, lay.dp) * lay.dp : n; };
  const uint64_t bt = static_cast<uint64_t>(c.data.micro_batch * m.seq_len);
  const uint64_t btc = bt * static_cast<uint64_t>(m.d_model);

  for (int64_t s = 0; s < lay.pp; ++s) {
    StagePlan sp;
    sp.stage = PpStage{static_cast<int>(s), static_cast<int>(lay.pp), bounds[s], bounds[s + 1]};
    sp.slots = pp_slots(lay.schedule, lay.pp, s, c.data.grad_accum);
    const PpStage& st = sp.stage;
    // The stage's units (ParamStore's held units).
    std::vector<uint64_t> held;
    if (st.first() || (st.last() && m.tie_embeddings)) held.push_back(units.front());
    for (int64_t l = st.first_block; l < st.end_block; ++l) held.push_back(units[1 + l]);
    if (st.last()) held.push_back(units.back());
    const bool has_embed = st.first() || (st.last() && m.tie_embeddings);

    uint64_t full = 0, shard = 0, largest = 0, padded = 0;
    for (uint64_t n : held) {
      full += n;
      shard += lay.dp > 1 ? shard_numel(n, lay.dp) : n;
      largest = std::max(largest, n);
      padded += padded_of(n);
    }
    const uint64_t largest_padded = padded_of(largest);
    RankMemory& mem = sp.memory;
    mem.params = (z >= 3 ? shard : full) * e;
    mem.grads = (z >= 2 ? shard : full) * 4;
    if (z == 1 && lay.dp > 1)
      mem.grads += shard * 4;  // + the reduced gradient shards (engine/parallel/zero.h)
    const uint64_t opt_elems = z >= 1 ? shard : full;
    mem.optimizer = opt_elems * 8 + (low ? opt_elems * 4 : 0);
    // fp32 below ZeRO-3 keeps its full master weights as the working weights; with ZeRO-1/2 they
    // are not part of the sharded optimizer state (already counted in params).
    mem.activations = activation_bytes(c, lay.tp, lay.recompute, st, sp.slots);
    // Built in place from ranges (ParamStore::fill, ZeroOptimizer::create): nothing but the
    // states, and a chunk of fp32 values rounded into the bf16/fp16 working weights (ZeRO-1/2).
    mem.startup = mem.model_states() + (low && lay.dp > 1 && (z == 1 || z == 2)
                                            ? std::min<uint64_t>(kStateChunk, largest) * 4
                                            : 0);
    if (lay.dp > 1) {
      // One unit reduced at a time: the reduction's receive scratch (fp32).
      mem.buffers = largest_padded * 4;
      // ZeRO-2/3 (engine/parallel/zero.h): full gradient buffers exist only during backward:
      // the embeddings' (written by the LM head and at the end), the unit being written and the
      // one being reduce-scattered. ZeRO-3 also holds gathered weights: the head's two units
      // (tied embedding and final norm) or the unit in use, plus parallel.prefetch gathered
      // ahead. (Only without pipelining: pp > 1 takes ZeRO-0/1.)
      if (z >= 2) mem.buffers += (padded_of(units.front()) + 2 * largest_padded) * 4;
      if (z >= 3)
        mem.buffers += (2 + static_cast<uint64_t>(c.parallel.prefetch)) * largest_padded * e;
    }

    // Communication per optimizer step.
    auto& cb = sp.comm_bytes;
    if (lay.dp > 1) {
      if (z == 0) {
        cb["dp.all_reduce"] = 2 * padded * 4;
      } else if (z == 1) {
        cb["dp.reduce_scatter"] = padded * 4;
        cb["dp.all_gather"] = padded * e;
      } else if (z == 2) {  // the gradients are reduced as each micro-batch's backward ends
        cb["dp.reduce_scatter"] = padded * 4 * A;
        cb["dp.all_gather"] = padded * e;
      } else {
        cb["dp.all_gather"] = 2 * padded * e * A;
        cb["dp.reduce_scatter"] = padded * 4 * A;
      }
    }
    const uint64_t nb = static_cast<uint64_t>(st.end_block - st.first_block);
    if (lay.tp > 1) {
      // engine/parallel/tensor_parallel.h, per micro-batch: 2 all-reduces per block in forward
      // (attention out, MLP down) and 2 in backward (the inputs of QKV and MLP up), the embedding
      // output (first stage) and the head's input gradient (last), fp32 on the wire, 2x as
      // all-reduces; nb more with full recomputation (attention out is rerun), and the
      // cross-entropy's row maxima and sums (3 fp32 per row, last stage); per step: the gradient
      // norm (one fp64).
      const uint64_t per_act = 2 * btc * 4;
      const uint64_t n = 4 * nb + (st.first() ? 1 : 0) + (st.last() ? 1 : 0) +
                         (lay.recompute == Recompute::kFull ? nb : 0);
      const uint64_t act = n * per_act + (st.last() ? 3 * 2 * bt * 4 : 0);
      cb["tp.all_reduce"] = act * A + 2 * 8;
    }
    if (lay.pp > 1) {
      // Per micro-batch: the stage's output forward (not the last), its input's gradient
      // backward (not the first); received likewise.
      const uint64_t one = btc * e * A;
      const uint64_t n = (st.last() ? 0 : 1) + (st.first() ? 0 : 1);
      cb["pp.send"] = n * one;
      cb["pp.recv"] = n * one;
      if (m.tie_embeddings && has_embed) cb["embed.all_reduce"] = 2 * units.front() * 4;
    }
    // Training FLOPs per token on one rank: forward, backward (twice forward) and recomputation.
    const double tp = static_cast<double>(lay.tp);
    const double fwd = (static_cast<double>(nb) * flops.block + (st.last() ? flops.head : 0)) / tp;
    double redo = 0;
    if (lay.recompute == Recompute::kFull) redo = static_cast<double>(nb) * flops.block / tp;
    if (lay.recompute == Recompute::kSelective) {
      redo = static_cast<double>(nb) * flops.attention / tp;
    }
    sp.forward_flops_per_token = 3 * fwd + redo;
    p.stages.push_back(std::move(sp));
  }
  for (size_t s = 0; s < p.stages.size(); ++s) {
    if (p.stages[s].memory.peak() > p.stages[p.worst_stage].memory.peak())
      p.worst_stage = static_cast<int>(s);
    for (const auto& [k, v] : p.stages[s].comm_bytes)
      p.comm_bytes[k] = std::max(p.comm_bytes[k], v);
  }
  p.memory = p.stages[p.worst_stage].memory;
  return p;
}

double comm_seconds(const LayoutPlan& p, int64_t ranks_per_node, const Links& links) {
  double worst = 0;
  for (const StagePlan& st : p.stages)
    worst = std::max(worst, stage_seconds(p, st, ranks_per_node, links).total());
  return worst;
}

void estimate_step(const TrainConfig& c, const Hardware& hw, LayoutPlan* p) {
  const double tokens_mb = static_cast<double>(c.data.micro_batch * c.model.seq_len);
  const double m = static_cast<double>(p->micro_batches);
  const double slots = m + static_cast<double>(p->layout.pp - 1);
  const double rate = hw.peak_flops * hw.efficiency;
  double slot = 0, compute = 0, after = 0;
  for (const StagePlan& st : p->stages) {
    const StageSeconds s = stage_seconds(*p, st, hw.ranks_per_node, hw.links);
    const double mb = st.forward_flops_per_token * tokens_mb / rate;
    compute = std::max(compute, mb);
    slot = std::max(slot, mb + (s.tp + s.pp) / m);
    after = std::max(after, s.dp + s.embed);
  }
  p->comm_seconds = comm_seconds(*p, hw.ranks_per_node, hw.links);
  p->compute_seconds = slots * compute;
  p->step_seconds = slots * slot + after;
  p->tokens_per_second =
      p->step_seconds > 0 ? static_cast<double>(p->layout.dp) * m * tokens_mb / p->step_seconds : 0;
}

namespace {
constexpr int64_t kMaxGradAccum = int64_t{1} << 20;  // data.grad_accum's bound (train_config.cc)
constexpr int64_t kMaxRanksPerNode = 4096;
}  // namespace

Status check_plan_sizes(const TrainConfig& c) {
  using LD = long double;
  const ModelConfig& m = c.model;
  const LD B = static_cast<LD>(c.data.micro_batch), T = static_cast<LD>(m.seq_len);
  const LD C = static_cast<LD>(m.d_model), V = static_cast<LD>(m.vocab_size);
  const LD L = static_cast<LD>(m.n_layers), NH = static_cast<LD>(m.n_heads);
  const LD QKV = static_cast<LD>(m.qkv_width()), F = static_cast<LD>(m.ffn());
  const LD FC = m.llama() ? 2 * F : F, A = static_cast<LD>(std::max<int64_t>(1, c.data.grad_accum));
  const LD limit = std::ldexp(LD{1}, 60);
  auto refuse = [&](const std::string& key, const std::string& what, LD bytes) {
    return Status::config(
               fmt::format("{} come to about {:.3g} bytes per rank, past the 2^60 bytes (1 EiB) "
                           "Kiln's memory model counts (no machine has them): a smaller value",
                           what, static_cast<double>(bytes)))
        .with_key(key);
  };
  // Model states: every weight with its gradient, moments, master copy and reduction scratch.
  const LD embed = 2 * V * C + T * C;
  const LD blocks = L * (C * QKV + C * C + C * FC + F * C + 8 * C + QKV + FC);
  const LD states = (embed + blocks) * 24;
  if (states > limit) {
    return refuse(embed > blocks ? "model.vocab_size" : "model.n_layers",
                  fmt::format("the model states of model.vocab_size {} x model.d_model {} and "
                              "model.n_layers {} blocks",
                              m.vocab_size, m.d_model, m.n_layers),
                  states);
  }
  // Activations: every block's tensors per token, every micro-batch in flight (GPipe), and the
  // head's logits.
  const LD tokens = B * T;
  const LD acts = tokens * (L + 3) * (8 * C + 2 * QKV + 2 * FC + 2 * F + NH + 8) * 4 * A;
  if (acts > limit) {
    return refuse(
        "data.micro_batch",
        fmt::format("the activations of data.micro_batch {} x model.seq_len {} tokens "
                    "(x data.grad_accum {} micro-batches in flight) through {} blocks "
                    "of model.d_model {}",
                    c.data.micro_batch, m.seq_len, c.data.grad_accum, m.n_layers, m.d_model),
        acts);
  }
  const LD logits = tokens * V * 4;
  if (logits > limit) {
    return refuse("model.vocab_size",
                  fmt::format("the logits of data.micro_batch {} x model.seq_len {} tokens over "
                              "model.vocab_size {}",
                              c.data.micro_batch, m.seq_len, m.vocab_size),
                  logits);
  }
  // Bytes moved per step: weights and gradients per micro-batch (ZeRO-2/3), activations per
  // block (tensor and pipeline parallelism).
  const LD comm = (embed + blocks) * 12 * A + tokens * C * 8 * (6 * L + 4) * A;
  if (comm > limit) {
    return refuse("data.grad_accum",
                  fmt::format("the bytes moved per step of data.grad_accum {} micro-batches",
                              c.data.grad_accum),
                  comm);
  }
  return Status::ok();
}

Result<std::vector<LayoutPlan>> plan_layouts(const TrainConfig& c, int64_t world,
                                             std::optional<uint64_t> budget, const Hardware& hw,
                                             const PlanFilter& filter) {
  if (world < 1) return Status::usage("--world must be at least 1");
  if (hw.ranks_per_node < 0) return Status::usage("--gpus-per-node must be at least 1");
  if (hw.ranks_per_node > kMaxRanksPerNode) {  // (the crossing checks visit up to that many)
    return Status::usage("--gpus-per-node " + std::to_string(hw.ranks_per_node) + ": at most " +
                         std::to_string(kMaxRanksPerNode) + " ranks per machine")
        .with_key("--gpus-per-node");
  }
  if (!(hw.links.intra_node > 0) || !(hw.links.inter_node > 0)) {
    return Status::usage("link bandwidths must be positive");
  }
  if (!(hw.peak_flops > 0)) return Status::usage("--peak-tflops must be positive");
  if (!(hw.efficiency > 0) || hw.efficiency > 1) {
    return Status::usage("--compute-efficiency must be in (0, 1]");
  }
  if (filter.global_batch && *filter.global_batch < 1) {
    return Status::usage("--global-batch must be at least 1 sequence");
  }
  if (filter.pp && (*filter.pp < 1 || *filter.pp > c.model.n_layers)) {
    return Status::usage("--pp " + std::to_string(*filter.pp) + ": between 1 and model.n_layers (" +
                         std::to_string(c.model.n_layers) + ")");
  }
  KILN_RETURN_IF_ERROR(check_plan_sizes(c));
  std::vector<LayoutPlan> out;
  // tp divides the head count (at most 2^16) and pp is at most n_layers (2^16): the search is
  // over those, never over every number up to the world (--world 1000000000000 once looped
  // 10^12 times).
  for (int64_t tp = 1; tp <= std::min(world, c.model.n_heads); ++tp) {
    if (world % tp != 0 || c.model.n_heads % tp != 0 || c.model.kv_heads() % tp != 0 ||
        c.model.ffn() % tp != 0 || (filter.tp && *filter.tp != tp)) {
      continue;
    }
    for (int64_t pp = 1; pp <= std::min(world / tp, c.model.n_layers); ++pp) {
      if ((world / tp) % pp != 0 || (filter.pp && *filter.pp != pp)) continue;
      const int64_t dp = world / (tp * pp);
      TrainConfig cc = c;
      if (filter.global_batch) {
        // (dp x micro_batch may pass 2^63 on a huge world: then it cannot divide the batch)
        int64_t per_step = 0;
        if (__builtin_mul_overflow(dp, c.data.micro_batch, &per_step) ||
            *filter.global_batch % per_step != 0) {
          continue;
        }
        // More micro-batches than data.grad_accum may hold: not a layout a run can take.
        if (*filter.global_batch / per_step > kMaxGradAccum) continue;
        cc.data.grad_accum = *filter.global_batch / per_step;
        KILN_RETURN_IF_ERROR(check_plan_sizes(cc).prefixed("--global-batch " +
                                                           std::to_string(*filter.global_batch) +
                                                           " on DP " + std::to_string(dp)));
      }
      std::vector<PpSchedule> schedules{PpSchedule::k1F1B};
      if (pp > 1) {
        schedules.push_back(PpSchedule::kGPipe);
        if (filter.schedule) schedules = {*filter.schedule};
      }
      for (int64_t z = 0; z <= 3; ++z) {
        if (dp == 1 && z > 0) continue;  // nothing to shard over
        if (pp > 1 && z > 1) continue;   // the pipeline takes ZeRO-0/1 (engine/parallel/pipeline.h)
        for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
          for (PpSchedule sched : schedules) {
            LayoutPlan p = plan_layout(cc, Layout{tp, dp, z, r, pp, sched});
            if (budget) p.fits = p.memory.peak() <= *budget;
            p.within_node = tp_within_node(tp, world, hw.ranks_per_node);
            estimate_step(cc, hw, &p);
            out.push_back(std::move(p));
          }
        }
      }
    }
  }
  LayoutPlan* best = nullptr;
  auto better = [](const LayoutPlan& a, const LayoutPlan& b) {
    if (a.tokens_per_second != b.tokens_per_second)
      return a.tokens_per_second > b.tokens_per_second;
    return a.memory.peak() < b.memory.peak();
  };
  for (auto& p : out) {
    if ((p.fits.has_value() && !*p.fits) || !p.trainable || !p.within_node) continue;
    if (!best || better(p, *best)) best = &p;
  }
  if (best) best->suggested = true;
  return out;
}

Result<std::vector<LayoutPlan>> plan_layouts(const TrainConfig& c, int64_t world,
                                             std::optional<uint64_t> budget, int64_t ranks_per_node,
                                             Links links) {
  Hardware hw;
  hw.ranks_per_node = ranks_per_node;
  hw.links = links;
  return plan_layouts(c, world, budget, hw);
}

std::string describe_layout(const LayoutPlan& p, int64_t ranks_per_node,
                            std::optional<uint64_t> budget) {
  const Layout& l = p.layout;
  const int64_t world = l.tp * l.pp * l.dp;
  auto where = [](bool across) { return across ? "across machines" : "inside the machine"; };
  bool pp_across = false;
  for (int64_t s = 0; s + 1 < l.pp; ++s)
    pp_across = pp_across || boundary_crosses(l, s, ranks_per_node);
  std::string out;
  auto add = [&](const std::string& s) { out += (out.empty() ? "" : ", ") + s; };
  if (l.tp > 1)
    add("TP " + std::to_string(l.tp) + " " + where(!tp_within_node(l.tp, world, ranks_per_node)));
  if (l.pp > 1) {
    add("PP " + std::to_string(l.pp) + " " + where(pp_across) + " (" +
        pp_schedule_name(l.schedule) + ")");
  }
  if (l.dp > 1) {
    add("DP " + std::to_string(l.dp) +
        (l.zero_stage ? " with ZeRO-" + std::to_string(l.zero_stage)
                      : std::string(" without ZeRO")) +
        (dp_crosses(l, ranks_per_node) ? " across machines" : " inside the machine"));
  }
  if (out.empty()) out = "one rank";
  if (l.recompute != Recompute::kNone)
    out += std::string(", ") + recompute_name(l.recompute) + " activation checkpointing";
  const StagePlan& w = p.stages[p.worst_stage];
  out += ": ";
  out += budget ? "fits in " + human_bytes(*budget) : std::string("needs");
  out += " (" + human_bytes(p.memory.peak()) + " on the worst rank";
  if (l.pp > 1) {
    out += ", stage " + std::to_string(w.stage.rank) + " with blocks " +
           std::to_string(w.stage.first_block) + "-" + std::to_string(w.stage.end_block - 1) +
           " and " + std::to_string(w.slots) + " micro-batch" + (w.slots == 1 ? "" : "es") +
           " in flight";
  }
  out += ")";
  if (l.pp > 1) {
    out +=
        "; bubble " + pct(p.bubble) + " at " + std::to_string(p.micro_batches) + " micro-batches";
  }
  std::string bytes;
  auto sum_of = [&](const char* prefix) {
    uint64_t b = 0;
    for (const auto& [k, v] : p.comm_bytes)
      if (k.rfind(prefix, 0) == 0 && k != "pp.recv") b += v;
    return b;
  };
  auto addb = [&](const char* label, const char* prefix) {
    const uint64_t b = sum_of(prefix);
    if (b) bytes += std::string(bytes.empty() ? "" : ", ") + label + " " + human_bytes(b);
  };
  addb("TP", "tp.");
  addb("PP sends", "pp.");
  addb("DP", "dp.");
  addb("tied embedding", "embed.");
  if (!bytes.empty()) out += "; per rank and step: " + bytes;
  char tail[160];
  std::snprintf(tail, sizeof tail, "; about %.3g s per step (%.3g s in collectives), %.4g tokens/s",
                p.step_seconds, p.comm_seconds, p.tokens_per_second);
  out += tail;
  return out;
}

}  // namespace kiln::engine
