// The memory preflight's decision (engine/train/preflight.h) against budgets set around the
// planner's own figures (engine/parallel/layout_plan.h): what fits passes, what does not names the
// parts, the budget and a layout that would fit. Through the CLI:
// tests/engine/train/train_cli_test.cc MemoryPreflightRefusesWhatCannotFit.
#include "engine/train/preflight.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <string>
#include <vector>

#include "engine/parallel/layout_plan.h"

namespace kiln::engine {
namespace {

TrainConfig config_of(std::vector<std::string> sets) {
  auto cfg = load_train_config("", sets);
  EXPECT_TRUE(cfg.is_ok());
  auto c = parse_train_config(*cfg);
  EXPECT_TRUE(c.is_ok());
  return *c;
}

// Activations dominate (long rows, small model): checkpointing is the way out.
TrainConfig tiny() {
  return config_of({"model.vocab_size=512", "model.d_model=64", "model.n_layers=2",
                    "model.n_heads=4", "model.seq_len=256", "data.micro_batch=8"});
}
// Model states dominate (a large vocabulary, short rows): sharding them over ranks is.
TrainConfig states_heavy() {
  return config_of({"model.vocab_size=8192", "model.d_model=256", "model.n_layers=4",
                    "model.n_heads=4", "model.seq_len=16", "data.micro_batch=1"});
}

uint64_t peak(const TrainConfig& c, Recompute r) {
  const RankMemory m = plan_layout(c, Layout{1, 1, 0, r}).memory;
  return std::max(m.total(), m.startup);
}

TEST(MemoryPreflight, FitsOrNamesWhatWouldFit) {
  TrainConfig c = tiny();
  const uint64_t none = peak(c, Recompute::kNone), full = peak(c, Recompute::kFull);
  ASSERT_LT(full, none);  // activations dominate this config: checkpointing is the way out
  c.memory.margin = 0.1;
  // Enough for the run as configured (after the margin): ok.
  EXPECT_TRUE(check_memory(c, 1, MemoryBudget{static_cast<uint64_t>(none / 0.9) + 1, "t"}).is_ok());
  // Between full checkpointing's peak and the configured one: refused, naming the way out.
  const uint64_t between = (full + none) / 2;
  const Status st = check_memory(c, 1, MemoryBudget{static_cast<uint64_t>(between / 0.9), "test"});
  ASSERT_FALSE(st.is_ok());
  EXPECT_EQ(st.code(), StatusCode::kConfig);
  EXPECT_EQ(st.key(), "memory");
  EXPECT_NE(st.message().find("per rank (parameters"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("(test; 10% held back"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("activation_checkpointing=full"), std::string::npos) << st.message();
  // The margin counts: the same budget with no margin fits what needs just under it.
  c.memory.margin = 0.0;
  EXPECT_TRUE(check_memory(c, 1, MemoryBudget{none, "t"}).is_ok());
  EXPECT_FALSE(check_memory(c, 1, MemoryBudget{none - 1, "t"}).is_ok());
  // Off: never refused; nothing measured: never refused; measured and full: refused.
  c.memory.check = false;
  EXPECT_TRUE(check_memory(c, 1, MemoryBudget{1, "t"}).is_ok());
  c.memory.check = true;
  EXPECT_TRUE(check_memory(c, 1, MemoryBudget{0, "unknown", /*known=*/false}).is_ok());
  EXPECT_FALSE(check_memory(c, 1, MemoryBudget{0, "a full cgroup"}).is_ok());
}

TEST(MemoryPreflight, MoreRanksWhenNoLayoutOfThisWorldFits) {
  TrainConfig c = states_heavy();
  c.memory.margin = 0.0;
  // Below even full checkpointing on one rank, but enough per rank when the states are sharded
  // over many (ZeRO-3).
  const uint64_t one_rank_min = peak(c, Recompute::kFull);
  const Status st = check_memory(c, 1, MemoryBudget{one_rank_min / 3, "t"});
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("No layout of 1 rank fits"), std::string::npos) << st.message();
  EXPECT_NE(st.message().find("ranks of this budget (kiln plan --world"), std::string::npos)
      << st.message();
}

TEST(MemoryPreflight, BudgetKeysParse) {
  auto cfg = load_train_config("", {"memory.budget=20GiB", "memory.margin=0.25"});
  ASSERT_TRUE(cfg.is_ok());
  auto c = parse_train_config(*cfg);
  ASSERT_TRUE(c.is_ok());
  EXPECT_EQ(c->memory.budget.value_or(0), 20ull << 30);
  EXPECT_EQ(c->memory.margin, 0.25);
  for (const char* bad :
       {"memory.budget=lots", "memory.budget=0", "memory.margin=0.95", "memory.margin=-1"}) {
    auto b = load_train_config("", {bad});
    ASSERT_TRUE(b.is_ok());
    auto p = parse_train_config(*b);
    ASSERT_FALSE(p.is_ok()) << bad;
    EXPECT_EQ(p.status().key().rfind("memory.", 0), 0u) << bad << ": " << p.status().to_string();
  }
}

// Pipeline stages (issue 32): each rank checks its own stage. A 1F1B pipeline of 4 keeps 4
// micro-batches in flight on the first stage and 1 on the last, so a budget between their peaks
// passes the last stage's ranks and refuses the first's, naming the stage; without a stage the
// worst one is checked.
TEST(MemoryPreflight, EachPipelineStageChecksItsOwnEstimate) {
  TrainConfig c =
      config_of({"model.vocab_size=512", "model.d_model=64", "model.n_layers=8", "model.n_heads=4",
                 "model.seq_len=256", "data.micro_batch=4", "data.grad_accum=8", "parallel.pp=4"});
  c.memory.margin = 0.0;
  const LayoutPlan plan =
      plan_layout(c, Layout{1, 1, 0, c.activation_checkpointing, 4, PpSchedule::k1F1B});
  const uint64_t first = plan.stages[0].memory.peak(), last = plan.stages[3].memory.peak();
  ASSERT_NE(first, last);
  const int big = first > last ? 0 : 3, small = 3 - big;
  const uint64_t between = (first + last) / 2;
  EXPECT_TRUE(check_memory(c, 4, MemoryBudget{between, "t"}, small).is_ok());
  const Status st = check_memory(c, 4, MemoryBudget{between, "t"}, big);
  ASSERT_FALSE(st.is_ok());
  EXPECT_NE(st.message().find("pipeline stage " + std::to_string(big) + " of 4"), std::string::npos)
      << st.message();
  EXPECT_NE(st.message().find("in flight under 1f1b"), std::string::npos) << st.message();
  EXPECT_FALSE(check_memory(c, 4, MemoryBudget{between, "t"}).is_ok());  // the worst stage
  EXPECT_TRUE(check_memory(c, 4, MemoryBudget{std::max(first, last), "t"}).is_ok());
  // Each stage's need is its own: exactly its peak passes, one byte less does not.
  for (int s = 0; s < 4; ++s) {
    const uint64_t need = plan.stages[s].memory.peak();
    EXPECT_TRUE(check_memory(c, 4, MemoryBudget{need, "t"}, s).is_ok()) << s;
    EXPECT_FALSE(check_memory(c, 4, MemoryBudget{need - 1, "t"}, s).is_ok()) << s;
  }
}

}  // namespace
}  // namespace kiln::engine
