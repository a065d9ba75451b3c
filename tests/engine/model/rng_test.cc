// The counter-based random numbers: a pure function of (seed, stream, index).
#include "engine/model/rng.h"

#include <gtest/gtest.h>

#include <string>

namespace kiln::engine {
namespace {
TEST(Rng, CounterBasedNormal) {
  EXPECT_EQ(random_bits(1, 2, 3), random_bits(1, 2, 3));
  EXPECT_NE(random_bits(1, 2, 3), random_bits(1, 2, 4));
  EXPECT_NE(random_bits(1, 2, 3), random_bits(2, 2, 3));
  double sum = 0, sq = 0;
  const int n = 200000;
  for (int i = 0; i < n; ++i) {
    double x = random_normal(42, 7, i);
    sum += x;
    sq += x * x;
  }
  EXPECT_NEAR(sum / n, 0.0, 0.01);
  EXPECT_NEAR(sq / n, 1.0, 0.01);
}

}  // namespace
}  // namespace kiln::engine
