// A step's loss from its micro-batches (engine/train/step_loss.h): valid targets only, per
// domain, rows of unknown domains in the total only, the losses' stride per micro-batch.
#include "engine/train/step_loss.h"

#include <gtest/gtest.h>

#include <vector>

namespace kiln::engine {
namespace {

MicroBatch batch(std::vector<int32_t> targets, std::vector<int32_t> domains, int64_t T) {
  MicroBatch b;
  b.seq_len = T;
  b.rows = static_cast<int64_t>(domains.size());
  b.targets = std::move(targets);
  b.inputs.assign(b.targets.size(), 0);
  b.domains = std::move(domains);
  return b;
}

TEST(StepLoss, SumsValidTargetsPerDomain) {
  const int64_t T = 3;
  // Micro-batch 0: rows of domains 0 and 1; micro-batch 1: one row of domain 1, one unknown (7).
  std::vector<MicroBatch> batches = {batch({1, 2, -1, 3, -1, -1}, {0, 1}, T),
                                     batch({4, 5, 6, 1, 1, 1}, {1, 7}, T)};
  // Stride 8 (room for more rows than these): the values past rows * T are never read.
  std::vector<float> losses = {1.0f, 2.0f, 100.f, 0.5f,  100.f, 100.f, -1.f, -1.f,
                               3.0f, 3.0f, 3.0f,  0.25f, 0.25f, 0.5f,  -1.f, -1.f};
  const StepLoss s = sum_step_loss(batches, losses.data(), 8, 2);
  EXPECT_DOUBLE_EQ(s.sum, 1.0 + 2.0 + 0.5 + 9.0 + 1.0);
  ASSERT_EQ(s.domain_sum.size(), 2u);
  EXPECT_DOUBLE_EQ(s.domain_sum[0], 3.0);
  EXPECT_DOUBLE_EQ(s.domain_sum[1], 9.5);
  EXPECT_EQ(s.domain_targets, (std::vector<int64_t>{2, 4}));
  EXPECT_EQ(count_domain_sequences(batches, 2), (std::vector<int64_t>{1, 2}));
}

}  // namespace
}  // namespace kiln::engine
