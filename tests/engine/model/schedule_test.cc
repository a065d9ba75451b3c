// Learning-rate schedules: warmup, cosine, WSD.
#include "engine/model/schedule.h"

#include <gtest/gtest.h>

#include <cmath>
#include <string>

namespace kiln::engine {
namespace {
TEST(Schedule, WarmupCosineWsd) {
  ScheduleConfig s;
  s.kind = ScheduleKind::kCosine;
  s.warmup_steps = 10;
  s.total_steps = 110;
  s.min_lr_ratio = 0.1;
  const double lr = 1.0;
  EXPECT_DOUBLE_EQ(learning_rate(s, lr, 0), 0.1);
  EXPECT_DOUBLE_EQ(learning_rate(s, lr, 9), 1.0);
  EXPECT_DOUBLE_EQ(learning_rate(s, lr, 10), 1.0);
  EXPECT_NEAR(learning_rate(s, lr, 60), 0.55, 1e-12);  // halfway: (1 + 0.1) / 2
  EXPECT_NEAR(learning_rate(s, lr, 110), 0.1, 1e-12);
  EXPECT_NEAR(learning_rate(s, lr, 500), 0.1, 1e-12);
  for (int i = 11; i < 110; ++i) EXPECT_LE(learning_rate(s, lr, i), learning_rate(s, lr, i - 1));

  s.kind = ScheduleKind::kConstant;
  EXPECT_DOUBLE_EQ(learning_rate(s, lr, 5), 0.6);
  EXPECT_DOUBLE_EQ(learning_rate(s, lr, 1000), 1.0);

  s.kind = ScheduleKind::kWsd;
  s.warmup_steps = 10;
  s.total_steps = 100;
  s.decay_fraction = 0.2;  // decay over steps 80..100
  for (DecayShape shape : {DecayShape::kLinear, DecayShape::kCosine, DecayShape::kOneMinusSqrt}) {
    s.decay_shape = shape;
    EXPECT_DOUBLE_EQ(learning_rate(s, lr, 50), 1.0);
    EXPECT_DOUBLE_EQ(learning_rate(s, lr, 79), 1.0);
    EXPECT_DOUBLE_EQ(learning_rate(s, lr, 80), 1.0);
    EXPECT_NEAR(learning_rate(s, lr, 100), 0.1, 1e-12);
    for (int i = 81; i <= 100; ++i) EXPECT_LT(learning_rate(s, lr, i), learning_rate(s, lr, i - 1));
  }
  s.decay_shape = DecayShape::kLinear;
  EXPECT_NEAR(learning_rate(s, lr, 90), 0.55, 1e-12);
  s.decay_shape = DecayShape::kOneMinusSqrt;
  EXPECT_NEAR(learning_rate(s, lr, 90), 0.1 + 0.9 * (1 - std::sqrt(0.5)), 1e-12);
}

}  // namespace
}  // namespace kiln::engine
