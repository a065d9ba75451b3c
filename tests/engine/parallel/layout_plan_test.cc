// engine/parallel/layout_plan.h: the memory and communication model behind `kiln plan`, checked
// against the engine's own allocations (ParamStore, the model's activation plan) and the ZeRO
// formulas.
#include "engine/parallel/layout_plan.h"

#include <gtest/gtest.h>

#include <algorithm>

#include "engine/model/model.h"
#include "engine/model/params.h"
#include "engine/train/train_config.h"

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
  // tp in {1, 2, 4} (divides 4 and the 4 heads); dp 1 only has stage 0.
  EXPECT_EQ(all->size(), (4 + 4 + 1) * 3u);
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
    EXPECT_EQ(*p.fits, p.memory.total() <= (z0 + z3) / 2);
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
    (p.within_node ? inside : across) = std::min(p.within_node ? inside : across, p.memory.total());
  }
  EXPECT_EQ(suggested, 1);
  // A budget only tp 4 meets (its activations and weights are split 4 ways): nothing is
  // suggested on 2-rank machines, tp 4 on 8-rank ones.
  ASSERT_LT(across, inside);
  const uint64_t budget = (across + inside) / 2;
  auto small = plan_layouts(c, 8, budget, 2);
  auto big = plan_layouts(c, 8, budget, 8);
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

}  // namespace
}  // namespace kiln::engine
