// The fp16 dynamic loss scaler: back-off, hysteresis, growth.
#include "engine/model/loss_scaler.h"

#include <gtest/gtest.h>

#include <string>

namespace kiln::engine {
namespace {
TEST(LossScaler, BackoffHysteresisGrowth) {
  LossScaleConfig c;
  c.initial = 1024;
  c.growth_interval = 3;
  c.hysteresis = 2;
  c.min_scale = 256;
  LossScaler s(c, true);
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_FALSE(s.update(true));  // first overflow spends hysteresis
  EXPECT_EQ(s.scale(), 1024);
  EXPECT_TRUE(s.update(true));  // second backs off
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));  // hysteresis stays spent until the next growth
  EXPECT_EQ(s.scale(), 256);
  EXPECT_FALSE(s.update(true));  // not below min_scale
  EXPECT_EQ(s.scale(), 256);
  s.update(false);
  s.update(false);
  EXPECT_EQ(s.scale(), 256);
  EXPECT_TRUE(s.update(false));  // 3 clean steps: x2, hysteresis refilled
  EXPECT_EQ(s.scale(), 512);
  EXPECT_EQ(s.state().hysteresis_left, 2);
  EXPECT_EQ(s.state().overflows, 4);

  c.hysteresis = 1;
  LossScaler h1(c, true);
  EXPECT_TRUE(h1.update(true));
  EXPECT_EQ(h1.scale(), 512);

  LossScaler off(c, false);
  EXPECT_EQ(off.scale(), 1.0);
  EXPECT_FALSE(off.update(true));
  EXPECT_EQ(off.scale(), 1.0);
}

}  // namespace
}  // namespace kiln::engine
