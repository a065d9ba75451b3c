// The data side of a rollback (engine/stability/rollback.h): the quarantined window per domain
// and the stability state the run continues with.
#include "engine/stability/rollback.h"

#include <gtest/gtest.h>

namespace kiln::engine {
namespace {

TEST(StabilityRollback, QuarantinesWhatWasHandedOutSinceTheCheckpoint) {
  StabilityState at_ck, now;
  at_ck.sequences = {{"code", 40}, {"web", 100}};
  now.sequences = {{"code", 40}, {"math", 3}, {"web", 124}};  // no code since; math is new
  now.spikes = 2;
  now.rollbacks = 1;
  now.nonfinite_in_row = 4;
  const Quarantine q = quarantine_window(now, at_ck, 20, 26, "loss z 9.00, grad z 1.00");
  EXPECT_EQ(q.from_step, 20);
  EXPECT_EQ(q.to_step, 26);
  EXPECT_EQ(q.spike_step, 26);
  EXPECT_EQ(q.reason, "loss z 9.00, grad z 1.00");
  ASSERT_EQ(q.sequences.size(), 2u);
  EXPECT_EQ(q.sequences.at("web"), (std::pair<uint64_t, uint64_t>{100, 124}));
  EXPECT_EQ(q.sequences.at("math"), (std::pair<uint64_t, uint64_t>{0, 3}));
  EXPECT_EQ(quarantine_ranges_json(q), R"({"math":[0,3],"web":[100,124]})");

  const StabilityState after = after_rollback(now, q);
  EXPECT_EQ(after.rollbacks, 2);
  EXPECT_EQ(after.spikes, 2);  // counters go on
  EXPECT_EQ(after.nonfinite_in_row, 0);
  EXPECT_EQ(after.sequences, now.sequences);  // the data position does not go back
  ASSERT_EQ(after.quarantined.size(), 1u);
  EXPECT_EQ(after.quarantined[0].to_step, 26);
}

TEST(StabilityRollback, NothingHandedOutQuarantinesNothing) {
  StabilityState s;
  s.sequences = {{"web", 7}};
  const Quarantine q = quarantine_window(s, s, 5, 5, "r");
  EXPECT_TRUE(q.sequences.empty());
  EXPECT_EQ(quarantine_ranges_json(q), "{}");
}

}  // namespace
}  // namespace kiln::engine
