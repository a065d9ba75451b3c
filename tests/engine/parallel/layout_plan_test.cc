// engine/parallel/layout_plan.h: the memory and communication model behind `kiln plan`, checked
// against the engine's own allocations (ParamStore, the model's activation plan) and the ZeRO
// formulas.
#include "engine/parallel/layout_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/config/train_config.h"
#include "engine/device/runtime.h"
#include "engine/model/model.h"
#include "engine/model/params.h"

namespace kiln::engine {
namespace {

TrainConfig config(std::vector<std::string> sets) {
  auto cfg = load_train_config("", sets);
  EXPECT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto tc = parse_train_config(*cfg);
  EXPECT_TRUE(tc.is_ok()) << tc.status().to_string();
  return *tc;
}

const std::vector<std::string> kSmall = {"model.vocab_size=1000", "model.d_model=48",
                                         "model.n_layers=3",      "model.n_heads=4",
                                         "model.seq_len=24",      "data.micro_batch=3"};

TEST(Plan, UnitSizesAreTheParamStoreLayout) {
  for (auto sets : {kSmall, std::vector<std::string>{}}) {
    TrainConfig c = config(sets);
    ParamStore store(c.model, Precision::kFp32);
    const auto units = unit_numels(c.model, 1);
    ASSERT_EQ(units.size(), store.units().size());
    for (size_t u = 0; u < units.size(); ++u) EXPECT_EQ(units[u], store.units()[u].numel) << u;
  }
}

// The llama layout (no wpe or norm biases, fused GQA qkv, SwiGLU gate+up, lm_head; and the
// variants with biases / tied embeddings), whole and on each of 2 tensor-parallel ranks.
TEST(Plan, LlamaUnitSizesAreTheParamStoreLayout) {
  std::vector<std::string> llama = kSmall;
  for (const char* s :
       {"model.arch=llama", "model.n_kv_heads=2", "model.ffn_hidden=136", "model.doc_mask=false"}) {
    llama.push_back(s);
  }
  for (const char* variant : {"model.bias=false", "model.bias=true", "model.tie_embeddings=true"}) {
    auto sets = llama;
    sets.push_back(variant);
    TrainConfig c = config(sets);
    for (int tp : {1, 2}) {
      ParamStore store(c.model, Precision::kFp32, false, nullptr, TpShard{0, tp}, false);
      const auto units = unit_numels(c.model, tp);
      ASSERT_EQ(units.size(), store.units().size());
      for (size_t u = 0; u < units.size(); ++u) {
        EXPECT_EQ(units[u], store.units()[u].numel) << variant << " tp " << tp << " unit " << u;
      }
    }
  }
}

TEST(Plan, OneRankModelStatesAndActivationsAreWhatTheEngineAllocates) {
  for (const char* prec : {"fp32", "bf16"}) {
    auto sets = kSmall;
    sets.push_back(std::string("precision=") + prec);
    TrainConfig c = config(sets);
    ParamStore store(c.model, c.precision);
    for (Recompute r : {Recompute::kNone, Recompute::kSelective, Recompute::kFull}) {
      LayoutPlan p = plan_layout(c, Layout{1, 1, 0, r});
      EXPECT_EQ(p.memory.model_states(), store.state_bytes()) << prec;
      // Built in place (ParamStore::fill): the start-up peak is the states themselves.
      EXPECT_EQ(p.memory.startup, store.state_bytes()) << prec;
      EXPECT_EQ(p.memory.activations,
                plan_activation_memory(c.model, c.data.micro_batch, c.precision, r).total());
      EXPECT_EQ(p.memory.buffers, 0u);
      EXPECT_TRUE(p.comm_bytes.empty());
    }
  }
}

TEST(Plan, ZeroStagesShardModelStatesAndMoveTheZeroPaperBytes) {
  TrainConfig c = config(kSmall);
  const int64_t dp = 4;
  const LayoutPlan z0 = plan_layout(c, Layout{1, dp, 0, Recompute::kNone});
  const LayoutPlan z1 = plan_layout(c, Layout{1, dp, 1, Recompute::kNone});
  const LayoutPlan z2 = plan_layout(c, Layout{1, dp, 2, Recompute::kNone});
  const LayoutPlan z3 = plan_layout(c, Layout{1, dp, 3, Recompute::kNone});
  // fp32: params 4 + grads 4 + moments 8 bytes per element.
  uint64_t padded = 0;
  for (uint64_t n : unit_numels(c.model, 1)) padded += shard_numel(n, dp) * dp;
  EXPECT_EQ(z0.memory.model_states(), 16 * padded);  // padded to the dp shards: within 1%
  EXPECT_EQ(z1.memory.optimizer * dp, 8 * padded);
  EXPECT_EQ(z2.memory.grads * dp, 4 * padded);
  // ZeRO-3: 1/dp of stage 0's model states, at start-up too (each rank builds only its shards;
  // measured against the engine by tests/train_mpi.sh startup).
  EXPECT_EQ(z3.memory.model_states() * dp, z0.memory.model_states());
  EXPECT_EQ(z3.memory.startup * dp, z0.memory.startup);
  for (const LayoutPlan* z : {&z0, &z1, &z2, &z3})
    EXPECT_EQ(z->memory.startup, z->memory.model_states());
  // bf16 ZeRO-1/2 round their full working weights from one fp32 chunk on the device.
  auto bf = kSmall;
  bf.push_back("precision=bf16");
  const TrainConfig cb = config(bf);
  const std::vector<uint64_t> units = unit_numels(cb.model);
  const uint64_t largest = *std::max_element(units.begin(), units.end());
  for (int64_t z = 0; z <= 3; ++z) {
    const LayoutPlan p = plan_layout(cb, Layout{1, dp, z, Recompute::kNone});
    EXPECT_EQ(p.memory.startup,
              p.memory.model_states() +
                  (z == 1 || z == 2 ? std::min<uint64_t>(kStateChunk, largest) * 4 : 0))
        << z;
  }
  EXPECT_LT(z1.memory.model_states(), z0.memory.model_states());
  EXPECT_LT(z2.memory.model_states(), z1.memory.model_states());
  // Bytes per step: 2x the gradient bytes for stages 0-2, 3x for ZeRO-3 (fp32).
  EXPECT_EQ(z0.comm_total(), 2 * 4 * padded);
  EXPECT_EQ(z1.comm_total(), 2 * 4 * padded);
  EXPECT_EQ(z2.comm_total(), 2 * 4 * padded);
  EXPECT_EQ(z3.comm_total(), 3 * 4 * padded);
  EXPECT_EQ(z0.comm_bytes.at("dp.all_reduce"), 2 * 4 * padded);
  EXPECT_EQ(z3.comm_bytes.at("dp.all_gather"), 2 * 4 * padded);
}

TEST(Plan, TensorParallelSplitsMatricesAndAddsActivationAllReduces) {
  TrainConfig c = config(kSmall);
  const LayoutPlan t1 = plan_layout(c, Layout{1, 1, 0, Recompute::kNone});
  const LayoutPlan t2 = plan_layout(c, Layout{2, 1, 0, Recompute::kNone});
  EXPECT_LT(t2.memory.params, t1.memory.params);
  EXPECT_GT(t2.memory.params * 2, t1.memory.params);  // norms, biases, wpe are replicated
  EXPECT_LT(t2.memory.activations, t1.memory.activations);
  ASSERT_TRUE(t2.comm_bytes.count("tp.all_reduce"));
  const uint64_t btc = 3 * 24 * 48;
  // At least the 4 all-reduces per block and 2 more, 2x each, of fp32 activations.
  EXPECT_GE(t2.comm_bytes.at("tp.all_reduce"), (4 * 3 + 2) * 2 * btc * 4);
}

TEST(Plan, LayoutsFitsAndTheSuggestion) {
  TrainConfig c = config(kSmall);
  auto all = plan_layouts(c, 4, std::nullopt);
  ASSERT_TRUE(all.is_ok());
  // tp in {1, 2, 4} (divides 4 and the 4 heads), pp in {1, 2} (divides 4 / tp, at most the 3
  // blocks), three checkpointing modes each: tp 1 pp 1 dp 4 ZeRO 0-3; tp 1 pp 2 dp 2 ZeRO 0-1
  // (the pipeline takes no more) under 2 schedules; tp 2 pp 1 dp 2 ZeRO 0-3; tp 2 pp 2 dp 1
  // ZeRO-0 under 2 schedules; tp 4 dp 1 ZeRO-0.
  EXPECT_EQ(all->size(), (4 + 2 * 2 + 4 + 2 + 1) * 3u);
  PlanFilter flat;
  flat.pp = 1;
  auto two_d = plan_layouts(c, 4, std::nullopt, Hardware{}, flat);
  ASSERT_TRUE(two_d.is_ok());
  EXPECT_EQ(two_d->size(), (4 + 4 + 1) * 3u);  // the layouts without pipelining
  int suggested = 0;
  for (const auto& p : *all) suggested += p.suggested;
  EXPECT_EQ(suggested, 1);
  auto none = plan_layouts(c, 4, uint64_t{1000});
  ASSERT_TRUE(none.is_ok());
  for (const auto& p : *none) {
    ASSERT_TRUE(p.fits.has_value());
    EXPECT_FALSE(*p.fits);
    EXPECT_FALSE(p.suggested);
  }
  // A budget between ZeRO-3's and ZeRO-0's totals: the suggestion fits, ZeRO-0 does not.
  const uint64_t z0 = plan_layout(c, Layout{1, 4, 0, Recompute::kFull}).memory.total();
  const uint64_t z3 = plan_layout(c, Layout{1, 4, 3, Recompute::kFull}).memory.total();
  ASSERT_LT(z3, z0);
  auto some = plan_layouts(c, 4, (z0 + z3) / 2);
  ASSERT_TRUE(some.is_ok());
  for (const auto& p : *some) {
    EXPECT_EQ(*p.fits, p.memory.peak() <= (z0 + z3) / 2);
    if (p.suggested) {
      EXPECT_TRUE(*p.fits);
    }
  }
}

TEST(Plan, TensorParallelGroupsStayInsideAMachine) {
  EXPECT_TRUE(tp_within_node(8, 64, 8));
  EXPECT_FALSE(tp_within_node(32, 64, 8));  // a TP group over 4 machines
  EXPECT_FALSE(tp_within_node(3, 24, 8));   // groups straddling machine boundaries
  EXPECT_FALSE(tp_within_node(4, 4, 2));    // 4 ranks on machines of 2
  EXPECT_TRUE(tp_within_node(4, 4, 8));     // the world fits one machine
  // 8 ranks on machines of 2: tp 4 is listed but never suggested, whatever the budget.
  TrainConfig c = config(kSmall);
  auto all = plan_layouts(c, 8, std::nullopt, 2);
  ASSERT_TRUE(all.is_ok());
  uint64_t inside = UINT64_MAX, across = UINT64_MAX;
  int suggested = 0;
  for (const auto& p : *all) {
    EXPECT_EQ(p.within_node, p.layout.tp <= 2) << p.layout.tp;
    if (p.suggested) {
      ++suggested;
      EXPECT_LE(p.layout.tp, 2);
    }
    if (p.layout.pp == 1) {
      (p.within_node ? inside : across) =
          std::min(p.within_node ? inside : across, p.memory.peak());
    }
  }
  EXPECT_EQ(suggested, 1);
  // Without pipelining, a budget only tp 4 meets (its activations and weights are split 4 ways):
  // nothing is suggested on 2-rank machines, tp 4 on 8-rank ones.
  ASSERT_LT(across, inside);
  const uint64_t budget = (across + inside) / 2;
  PlanFilter flat;
  flat.pp = 1;
  Hardware two, eight;
  two.ranks_per_node = 2;
  eight.ranks_per_node = 8;
  auto small = plan_layouts(c, 8, budget, two, flat);
  auto big = plan_layouts(c, 8, budget, eight, flat);
  ASSERT_TRUE(small.is_ok() && big.is_ok());
  for (const auto& p : *small) EXPECT_FALSE(p.suggested);
  int tp4 = 0;
  for (const auto& p : *big) tp4 += p.suggested && p.layout.tp == 4;
  EXPECT_EQ(tp4, 1);
}

// Time in collectives: each group's bytes x (n-1)/n over the link it crosses - the TP group's
// inside a machine, the data-parallel group's between machines once the world spans several -
// and the suggestion follows the links: a slow network favours tensor parallelism (its bytes
// stay inside machines), a slow machine-internal link favours data parallelism.
TEST(Plan, CommTimeWeighsEachGroupByItsLink) {
  TrainConfig c = config(kSmall);
  const Links links{100e9, 10e9};
  const LayoutPlan p = plan_layout(c, Layout{2, 8, 1, Recompute::kNone});
  double want = 0;
  for (const auto& [name, bytes] : p.comm_bytes) {
    want += name.rfind("tp.", 0) == 0 ? bytes * 0.5 / 100e9 : bytes * (7.0 / 8) / 10e9;
  }
  EXPECT_DOUBLE_EQ(comm_seconds(p, 8, links), want);  // 16 ranks on machines of 8
  // The whole world on one machine: every group on the fast link.
  double one = 0;
  for (const auto& [name, bytes] : p.comm_bytes) {
    one += name.rfind("tp.", 0) == 0 ? bytes * 0.5 / 100e9 : bytes * (7.0 / 8) / 100e9;
  }
  EXPECT_DOUBLE_EQ(comm_seconds(p, 16, links), one);
  auto suggested = [&](const Links& l) {
    auto all = plan_layouts(c, 16, std::nullopt, 8, l);
    EXPECT_TRUE(all.is_ok());
    for (const auto& q : *all) {
      EXPECT_DOUBLE_EQ(q.comm_seconds, comm_seconds(q, 8, l));
      if (q.suggested) return q.layout;
    }
    return Layout{};
  };
  EXPECT_EQ(suggested(Links{300e9, 1e6}).tp, 4);  // the network is the bottleneck
  EXPECT_EQ(suggested(Links{1e6, 300e9}).tp, 1);  // the machine's links are
  EXPECT_FALSE(plan_layouts(c, 16, std::nullopt, 8, Links{0, 1}).is_ok());
}

// ---- Pipeline parallelism (issue 32) ----

// Five blocks (so stages of 2 and 3 exist), a tied GPT-2 and an untied llama.
std::vector<std::string> pipeline_model(bool llama) {
  std::vector<std::string> sets = {"model.vocab_size=1000", "model.d_model=48",
                                   "model.n_layers=5",      "model.n_heads=4",
                                   "model.seq_len=24",      "data.micro_batch=3"};
  if (llama) {
    for (const char* x : {"model.arch=llama", "model.n_kv_heads=2", "model.ffn_hidden=136",
                          "model.doc_mask=false", "model.tie_embeddings=false"}) {
      sets.push_back(x);
    }
  }
  return sets;
}

// Each stage's model states are what a ParamStore of that stage allocates (its blocks, the
// embeddings on the first stage - and on the last when the head is tied to them -, the final unit
// on the last), at tp 1 and 2, fp32 and bf16, with the cost-balanced split and with
// parallel.pp_layers.
TEST(PlanPipeline, StageModelStatesAreWhatTheStagesStoreAllocates) {
  for (bool llama : {false, true}) {
    for (const char* prec : {"fp32", "bf16"}) {
      for (int64_t pp : {2, 3}) {
        auto sets = pipeline_model(llama);
        sets.push_back(std::string("precision=") + prec);
        sets.push_back("parallel.pp=" + std::to_string(pp));
        if (pp == 2) sets.push_back("parallel.pp_layers=[1, 4]");
        const TrainConfig c = config(sets);
        for (int64_t tp : {1, 2}) {
          const LayoutPlan p = plan_layout(c, Layout{tp, 1, 0, Recompute::kNone, pp});
          ASSERT_EQ(p.stages.size(), static_cast<size_t>(pp));
          const std::vector<int64_t> bounds = pp_stage_split(c.model, pp, c.parallel.pp_layers);
          for (int64_t s = 0; s < pp; ++s) {
            const StagePlan& st = p.stages[s];
            EXPECT_EQ(st.stage.first_block, bounds[s]);
            EXPECT_EQ(st.stage.end_block, bounds[s + 1]);
            ParamStore store(c.model, c.precision, false, nullptr, TpShard{0, static_cast<int>(tp)},
                             true, st.stage);
            EXPECT_EQ(st.memory.model_states(), store.state_bytes())
                << (llama ? "llama " : "gpt2 ") << prec << " pp " << pp << " tp " << tp << " stage "
                << s;
            EXPECT_EQ(st.memory.startup, store.state_bytes());
          }
          if (pp == 2) EXPECT_EQ(p.stages[0].stage.end_block, 1);  // pp_layers [1, 4]
        }
      }
    }
  }
}

// The tied embedding: its copy on the last stage counts in that stage's states, its gradients
// are all-reduced between the first and last stage; untied, neither. ZeRO-1 shards every stage's
// own units over dp.
TEST(PlanPipeline, TiedEmbeddingCopyAndZeroOneShardsTheStage) {
  const TrainConfig gpt2 = config(pipeline_model(false));
  const TrainConfig llama = config(pipeline_model(true));
  const uint64_t embed = unit_numels(gpt2.model).front();
  const LayoutPlan tied = plan_layout(gpt2, Layout{1, 1, 0, Recompute::kNone, 3});
  EXPECT_EQ(tied.stages[0].comm_bytes.at("embed.all_reduce"), 2 * embed * 4);
  EXPECT_EQ(tied.stages[2].comm_bytes.at("embed.all_reduce"), 2 * embed * 4);
  EXPECT_EQ(tied.stages[1].comm_bytes.count("embed.all_reduce"), 0u);
  // fp32, ZeRO-0: 16 bytes per element of the units a stage holds.
  uint64_t last = embed + unit_numels(gpt2.model).back();
  for (int64_t l = tied.stages[2].stage.first_block; l < 5; ++l)
    last += unit_numels(gpt2.model)[1 + l];
  EXPECT_EQ(tied.stages[2].memory.model_states(), 16 * last);
  const LayoutPlan untied = plan_layout(llama, Layout{1, 1, 0, Recompute::kNone, 3});
  for (const StagePlan& st : untied.stages) EXPECT_EQ(st.comm_bytes.count("embed.all_reduce"), 0u);

  // ZeRO-1 over dp 4: the optimizer states of a stage are a quarter of its padded units'.
  const LayoutPlan z1 = plan_layout(gpt2, Layout{1, 4, 1, Recompute::kNone, 2});
  const std::vector<uint64_t> units = unit_numels(gpt2.model);
  for (const StagePlan& st : z1.stages) {
    uint64_t padded = 0;
    if (st.stage.first() || st.stage.last()) padded += shard_numel(units.front(), 4) * 4;
    for (int64_t l = st.stage.first_block; l < st.stage.end_block; ++l)
      padded += shard_numel(units[1 + l], 4) * 4;
    if (st.stage.last()) padded += shard_numel(units.back(), 4) * 4;
    EXPECT_EQ(st.memory.optimizer * 4, 8 * padded) << st.stage.rank;
    EXPECT_EQ(st.comm_bytes.at("dp.reduce_scatter"), padded * 4) << st.stage.rank;
    EXPECT_EQ(st.comm_bytes.at("dp.all_gather"), padded * 4) << st.stage.rank;
  }
  EXPECT_FALSE(layout_trainable(Layout{1, 4, 2, Recompute::kNone, 2}));  // refused with pp
  EXPECT_TRUE(layout_trainable(Layout{1, 4, 1, Recompute::kNone, 2}));
}

// The bytes of a pipelined step: each boundary carries m micro-batches' (B, T, C) activations
// forward and their gradients backward in the work dtype; the stages' TP all-reduces and
// data-parallel bytes add up to the unpipelined layout's (plus the tied embedding's copy).
TEST(PlanPipeline, StageBytesAddUpToTheWholeModelsAndTheBoundaries) {
  for (const char* prec : {"fp32", "bf16"}) {
    auto sets = pipeline_model(false);
    sets.push_back(std::string("precision=") + prec);
    sets.push_back("data.grad_accum=6");
    const TrainConfig c = config(sets);
    const uint64_t e = std::string(prec) == "fp32" ? 4 : 2;
    const uint64_t btc = 3 * 24 * 48, m = 6;
    for (Recompute r : {Recompute::kNone, Recompute::kFull}) {
      const LayoutPlan flat = plan_layout(c, Layout{2, 2, 0, r, 1});
      const LayoutPlan pipe = plan_layout(c, Layout{2, 2, 0, r, 3});
      EXPECT_EQ(pipe.stages[0].comm_bytes.at("pp.send"), m * btc * e);  // activations forward
      EXPECT_EQ(pipe.stages[1].comm_bytes.at("pp.send"), 2 * m * btc * e);
      EXPECT_EQ(pipe.stages[1].comm_bytes.at("pp.recv"), 2 * m * btc * e);
      EXPECT_EQ(pipe.stages[2].comm_bytes.at("pp.send"), m * btc * e);  // gradients backward
      uint64_t tp = 0, dp = 0;
      for (const StagePlan& st : pipe.stages) {
        tp += st.comm_bytes.at("tp.all_reduce") - 16;  // less each stage's gradient norm
        dp += st.comm_bytes.at("dp.all_reduce");
      }
      EXPECT_EQ(tp, flat.comm_bytes.at("tp.all_reduce") - 16) << prec;
      const uint64_t embed = shard_numel(unit_numels(c.model, 2).front(), 2) * 2;
      EXPECT_EQ(dp, flat.comm_bytes.at("dp.all_reduce") + 2 * embed * 4) << prec;
    }
  }
}

// In-flight micro-batches: 1F1B keeps min(m, pp - s) on stage s, GPipe all m; the bubble is
// (pp - 1) / (m + pp - 1); each stage's activations are the model's plan for its blocks and
// slots.
TEST(PlanPipeline, InFlightMicroBatchesAndTheBubble) {
  EXPECT_EQ(pp_slots(PpSchedule::k1F1B, 4, 0, 8), 4);
  EXPECT_EQ(pp_slots(PpSchedule::k1F1B, 4, 3, 8), 1);
  EXPECT_EQ(pp_slots(PpSchedule::k1F1B, 4, 0, 2), 2);
  EXPECT_EQ(pp_slots(PpSchedule::kGPipe, 4, 3, 8), 8);
  EXPECT_EQ(pp_slots(PpSchedule::kGPipe, 1, 0, 8), 1);
  EXPECT_DOUBLE_EQ(pp_bubble(4, 8), 3.0 / 11);
  EXPECT_DOUBLE_EQ(pp_bubble(1, 8), 0.0);
  for (PpSchedule sched : {PpSchedule::k1F1B, PpSchedule::kGPipe}) {
    auto sets = pipeline_model(true);
    sets.push_back("data.grad_accum=8");
    const TrainConfig c = config(sets);
    const LayoutPlan p = plan_layout(c, Layout{1, 1, 0, Recompute::kSelective, 4, sched});
    EXPECT_DOUBLE_EQ(p.bubble, 3.0 / 11);
    EXPECT_EQ(p.micro_batches, 8);
    for (const StagePlan& st : p.stages) {
      EXPECT_EQ(st.slots, sched == PpSchedule::kGPipe ? 8 : 4 - st.stage.rank);
      EXPECT_EQ(st.memory.activations,
                plan_activation_memory(c.model, 3, c.precision, Recompute::kSelective, 1, c.device,
                                       st.stage, st.slots)
                    .total());
    }
    uint64_t worst = 0;
    for (const StagePlan& st : p.stages) worst = std::max(worst, st.memory.peak());
    EXPECT_EQ(p.memory.peak(), worst);
    EXPECT_EQ(p.stages[p.worst_stage].memory.peak(), worst);
  }
}

// Issue 32's property on paper: under 1F1B a rank's activations are bounded by the stage count
// (the first stage keeps pp micro-batches, however many the step has), under GPipe they grow
// with the micro-batches.
TEST(PlanPipeline, OneFOneBActivationsAreBoundedByTheStageCount) {
  auto at = [](int64_t pp, int64_t m, PpSchedule sched) {
    auto sets = pipeline_model(false);
    sets.push_back("model.n_layers=8");
    sets.push_back("data.grad_accum=" + std::to_string(m));
    const LayoutPlan p = plan_layout(config(sets), Layout{1, 1, 0, Recompute::kNone, pp, sched});
    return p.stages[0].memory.activations;
  };
  for (int64_t pp : {2, 4}) {
    EXPECT_EQ(at(pp, pp, PpSchedule::k1F1B), at(pp, 4 * pp, PpSchedule::k1F1B)) << pp;
    EXPECT_LT(at(pp, pp, PpSchedule::kGPipe), at(pp, 4 * pp, PpSchedule::kGPipe)) << pp;
    EXPECT_EQ(at(pp, pp, PpSchedule::kGPipe), at(pp, pp, PpSchedule::k1F1B)) << pp;
  }
}

// Measured in one process: every stage of a PP=2 and PP=4 layout at m = 4 and 8 allocates
// through the runtime (its ParamStore, then its Model with the schedule's in-flight slots)
// exactly the plan's model states + activations for that stage; under 1F1B the first stage's
// allocation is the same at m = 4 and 8.
TEST(PlanPipeline, EachStageAllocatesWhatThePlanSays) {
  Runtime& host = host_runtime();
  for (PpSchedule sched : {PpSchedule::k1F1B, PpSchedule::kGPipe}) {
    for (int64_t pp : {2, 4}) {
      size_t first_at_4 = 0;
      for (int64_t m : {4, 8}) {
        auto sets = pipeline_model(true);
        sets.push_back("model.n_layers=8");
        sets.push_back("data.grad_accum=" + std::to_string(m));
        const TrainConfig c = config(sets);
        const LayoutPlan p = plan_layout(c, Layout{1, 1, 0, Recompute::kSelective, pp, sched});
        for (const StagePlan& st : p.stages) {
          SCOPED_TRACE(::testing::Message() << pp_schedule_name(sched) << " pp " << pp << " m " << m
                                            << " stage " << st.stage.rank);
          const size_t before = host.memory().in_use;
          ParamStore params(c.model, c.precision, false, nullptr, TpShard{}, true, st.stage);
          auto model = Model::create(&params, c.data.micro_batch, Recompute::kSelective, 0, nullptr,
                                     st.slots);
          const size_t allocated = host.memory().in_use - before;
          EXPECT_EQ(allocated, st.memory.model_states() + st.memory.activations);
          if (st.stage.first() && m == 4) first_at_4 = allocated;
          if (st.stage.first() && m == 8) {
            if (sched == PpSchedule::k1F1B) {
              EXPECT_EQ(allocated, first_at_4);
            } else {
              EXPECT_GT(allocated, first_at_4);
            }
          }
        }
      }
    }
  }
}

// The time model: compute is the costliest stage's FLOPs (the stages' FLOPs add up to the whole
// model's) at efficiency x peak, over m + pp - 1 slots; collectives on their links.
TEST(PlanPipeline, StepTimeIsTheBubbleTimesTheCostliestStage) {
  auto sets = pipeline_model(true);
  sets.push_back("data.grad_accum=4");
  const TrainConfig c = config(sets);
  Hardware hw;
  hw.peak_flops = 1e12;
  hw.efficiency = 0.5;
  LayoutPlan flat = plan_layout(c, Layout{1, 1, 0, Recompute::kNone, 1});
  LayoutPlan pipe = plan_layout(c, Layout{1, 1, 0, Recompute::kNone, 2});
  estimate_step(c, hw, &flat);
  estimate_step(c, hw, &pipe);
  const double tokens = 3 * 24;
  EXPECT_NEAR(pipe.stages[0].forward_flops_per_token + pipe.stages[1].forward_flops_per_token,
              flat.stages[0].forward_flops_per_token,
              1e-6 * flat.stages[0].forward_flops_per_token);
  EXPECT_DOUBLE_EQ(flat.compute_seconds,
                   4 * flat.stages[0].forward_flops_per_token * tokens / 0.5e12);
  const double costliest =
      std::max(pipe.stages[0].forward_flops_per_token, pipe.stages[1].forward_flops_per_token);
  EXPECT_DOUBLE_EQ(pipe.compute_seconds, (4 + 1) * costliest * tokens / 0.5e12);
  // One machine, fp32 activations of 3 x 24 x 48 sent each way per micro-batch over 300 GB/s.
  const double send = 3 * 24 * 48 * 4 / 300e9;
  EXPECT_NEAR(pipe.step_seconds, (4 + 1) * (costliest * tokens / 0.5e12 + send), 1e-15);
  EXPECT_DOUBLE_EQ(pipe.tokens_per_second, 4 * tokens / pipe.step_seconds);
  // Full recomputation adds one forward of the blocks.
  LayoutPlan full = plan_layout(c, Layout{1, 1, 0, Recompute::kFull, 1});
  EXPECT_GT(full.stages[0].forward_flops_per_token, flat.stages[0].forward_flops_per_token);
}

// The suggestion: without pipelining when it fits (no bubble), with stages when only they fit;
// pipeline boundaries across machines are charged at the network's bandwidth; the reason names
// the layout.
TEST(PlanPipeline, SuggestsStagesWhenOnlyTheyFit) {
  auto sets = pipeline_model(true);
  sets.push_back("data.grad_accum=8");
  const TrainConfig c = config(sets);
  Hardware hw;  // slow arithmetic: this small model's step is compute, not communication
  hw.ranks_per_node = 2;
  hw.peak_flops = 1e9;
  PlanFilter tp1;
  tp1.tp = 1;
  auto all = plan_layouts(c, 4, std::nullopt, hw, tp1);
  ASSERT_TRUE(all.is_ok());
  uint64_t flat_min = UINT64_MAX, pipe_min = UINT64_MAX;
  for (const auto& p : *all) {
    if (p.suggested) EXPECT_EQ(p.layout.pp, 1);
    (p.layout.pp == 1 ? flat_min : pipe_min) =
        std::min(p.layout.pp == 1 ? flat_min : pipe_min, p.memory.peak());
  }
  ASSERT_LT(pipe_min, flat_min);
  auto tight = plan_layouts(c, 4, (pipe_min + flat_min) / 2, hw, tp1);
  ASSERT_TRUE(tight.is_ok());
  const LayoutPlan* chosen = nullptr;
  for (const auto& p : *tight) {
    if (p.suggested) chosen = &p;
  }
  ASSERT_NE(chosen, nullptr);
  EXPECT_TRUE(*chosen->fits);
  EXPECT_GT(chosen->layout.pp, 1);  // no layout without stages fits, even fully recomputed
  const std::string why = describe_layout(*chosen, 2, (pipe_min + flat_min) / 2);
  EXPECT_NE(why.find("fits in"), std::string::npos) << why;
  EXPECT_NE(why.find("PP " + std::to_string(chosen->layout.pp)), std::string::npos) << why;
  EXPECT_NE(why.find("bubble"), std::string::npos) << why;
  // A boundary between machines costs the network's bandwidth: pp 4 on machines of 2 crosses
  // one, on a machine of 4 none.
  const LayoutPlan pp4 = plan_layout(c, Layout{1, 1, 0, Recompute::kNone, 4});
  Links slow{300e9, 1e6};
  EXPECT_GT(comm_seconds(pp4, 2, slow), 1000 * comm_seconds(pp4, 4, slow));
  // --global-batch: m = global / (dp x micro_batch) per layout.
  PlanFilter g;
  g.global_batch = 24;
  auto fixed = plan_layouts(c, 4, std::nullopt, hw, g);
  ASSERT_TRUE(fixed.is_ok());
  for (const auto& p : *fixed) EXPECT_EQ(p.micro_batches * p.layout.dp * 3, 24);
  g.global_batch = 0;
  EXPECT_FALSE(plan_layouts(c, 4, std::nullopt, hw, g).is_ok());
}

}  // namespace
}  // namespace kiln::engine
