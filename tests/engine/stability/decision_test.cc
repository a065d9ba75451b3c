// The stability decision of a step (engine/stability/decision.h): every branch of the rules.
#include "engine/stability/decision.h"

#include <gtest/gtest.h>

namespace kiln::engine {
namespace {

SpikeCheck spike(bool is_spike) {
  SpikeCheck c;
  c.spike = is_spike;
  c.loss_z = is_spike ? 7.5 : 0.5;
  c.why = is_spike ? "loss z 7.5 > 5" : "";
  return c;
}

TEST(StabilityDecision, NoSpikeUpdatesWhateverTheAction) {
  StabilityConfig sc;
  for (SpikeAction a : {SpikeAction::kWarn, SpikeAction::kSkip, SpikeAction::kRollback}) {
    sc.spike.action = a;
    const StepDecision d = decide_finite(sc, spike(false), 0);
    EXPECT_EQ(d.action, StepAction::kUpdate);
    EXPECT_FALSE(d.spike);
    EXPECT_EQ(d.spike_name, "");
  }
}

TEST(StabilityDecision, SpikeTakesTheConfiguredAction) {
  StabilityConfig sc;
  sc.spike.action = SpikeAction::kWarn;
  StepDecision d = decide_finite(sc, spike(true), 0);
  EXPECT_EQ(d.action, StepAction::kUpdate);
  EXPECT_TRUE(d.spike);
  EXPECT_EQ(d.spike_name, "warn");
  EXPECT_EQ(d.why, "loss z 7.5 > 5");
  sc.spike.action = SpikeAction::kSkip;
  d = decide_finite(sc, spike(true), 0);
  EXPECT_EQ(d.action, StepAction::kSkipSpike);
  EXPECT_EQ(d.spike_name, "skip");
  sc.spike.action = SpikeAction::kRollback;
  sc.spike.max_rollbacks = 2;
  d = decide_finite(sc, spike(true), 1);
  EXPECT_EQ(d.action, StepAction::kRollback);
  EXPECT_EQ(d.spike_name, "rollback");
  EXPECT_FALSE(d.rollbacks_spent);
}

TEST(StabilityDecision, RollbackFallsBackToSkipWhenSpent) {
  StabilityConfig sc;
  sc.spike.action = SpikeAction::kRollback;
  sc.spike.max_rollbacks = 2;
  const StepDecision d = decide_finite(sc, spike(true), 2);
  EXPECT_EQ(d.action, StepAction::kSkipSpike);
  EXPECT_EQ(d.spike_name, "skip");
  EXPECT_TRUE(d.rollbacks_spent);
  EXPECT_EQ(d.why, "loss z 7.5 > 5");  // the spike's reason, as RUN/stability.jsonl records it
}

TEST(StabilityDecision, NonFiniteSkipsUntilTheStreakLimit) {
  StabilityConfig sc;
  sc.max_nonfinite_in_row = 3;
  EXPECT_EQ(decide_nonfinite(sc, false, 1).action, StepAction::kSkipOverflow);
  EXPECT_EQ(decide_nonfinite(sc, true, 2).action, StepAction::kSkipOverflow);
  const StepDecision stop = decide_nonfinite(sc, true, 3);
  EXPECT_EQ(stop.action, StepAction::kStop);
  EXPECT_EQ(stop.why, "3 steps in a row had inf/NaN gradients (stability.max_nonfinite_in_row)");
  sc.max_nonfinite_in_row = 0;  // no limit
  EXPECT_EQ(decide_nonfinite(sc, true, 1000).action, StepAction::kSkipOverflow);
}

TEST(StabilityDecision, NonFiniteStopsAtOnceWhenNothingAllowsSkipping) {
  StabilityConfig sc;
  sc.skip_nonfinite = false;
  const StepDecision d = decide_nonfinite(sc, false, 1);
  EXPECT_EQ(d.action, StepAction::kStop);
  EXPECT_EQ(d.why, "stability.skip_nonfinite is false");
  // With fp16 loss scaling an overflow is the scaler's business: skipped, the scale backs off.
  EXPECT_EQ(decide_nonfinite(sc, true, 1).action, StepAction::kSkipOverflow);
}

}  // namespace
}  // namespace kiln::engine
