// The trainer's fault injection (engine/train/fault_injection.h): which steps fire, once or
// every time, on which rank. The end-to-end effects through kiln train are
// tests/engine/stability/stability_train_test.cc's.
#include "engine/train/fault_injection.h"

#include <gtest/gtest.h>

namespace kiln::engine {
namespace {

TEST(FaultInjection, NothingHappensWithoutInjectionKeys) {
  FaultInjection f{StabilityConfig{}};
  std::vector<MicroBatch> batches(1);
  batches[0].inputs = {5, 6};
  batches[0].targets = {6, -1};
  for (int64_t step = 1; step < 50; ++step) {
    EXPECT_FALSE(f.corrupt_batch(step, &batches));
    EXPECT_EQ(f.learning_rate(step, 0.25), 0.25);
    EXPECT_FALSE(f.overflow(step, 0, 1));
  }
  EXPECT_EQ(batches[0].inputs, (std::vector<int32_t>{5, 6}));
}

TEST(FaultInjection, BadBatchAndLrBurstFireOncePerStep) {
  StabilityConfig sc;
  sc.inject_bad_batch_at = {3};
  sc.inject_lr_burst_at = {4, 6};
  sc.lr_burst_factor = 10;
  FaultInjection f(sc);
  std::vector<MicroBatch> batches(2);
  batches[0].inputs = {5, 6, 7};
  batches[0].targets = {6, 7, -1};  // -1 (no target) stays
  batches[1].inputs = {9};
  batches[1].targets = {2};
  EXPECT_FALSE(f.corrupt_batch(2, &batches));
  EXPECT_TRUE(f.corrupt_batch(3, &batches));
  EXPECT_EQ(batches[0].inputs, (std::vector<int32_t>{1, 1, 1}));
  EXPECT_EQ(batches[0].targets, (std::vector<int32_t>{1, 1, -1}));
  EXPECT_EQ(batches[1].targets, (std::vector<int32_t>{1}));
  EXPECT_FALSE(f.corrupt_batch(3, &batches));  // step 3 replayed after a rollback: clean
  EXPECT_EQ(f.learning_rate(4, 0.5), 5.0);
  EXPECT_EQ(f.learning_rate(4, 0.5), 0.5);
  EXPECT_EQ(f.learning_rate(5, 0.5), 0.5);
  EXPECT_EQ(f.learning_rate(6, 0.5), 5.0);
}

TEST(FaultInjection, OverflowOnTheLastRankEveryTime) {
  StabilityConfig sc;
  sc.inject_overflow_at = {7};
  const FaultInjection f(sc);
  EXPECT_FALSE(f.overflow(7, 0, 2));
  EXPECT_TRUE(f.overflow(7, 1, 2));
  EXPECT_TRUE(f.overflow(7, 1, 2));  // not once: replayed steps overflow again
  EXPECT_FALSE(f.overflow(8, 1, 2));
  EXPECT_TRUE(f.overflow(7, 0, 1));
}

}  // namespace
}  // namespace kiln::engine
