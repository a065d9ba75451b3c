// loader/weights_history.h: the weights of every step as the loader's state records them.
#include <gtest/gtest.h>

#include "loader/weights_history.h"

namespace kiln::loader::detail {
namespace {

TEST(LoaderWeightsHistory, ChangesApplyFromTheirStepAndReplaceLaterOnes) {
  WeightsHistory h({"a", "b"});
  EXPECT_TRUE(h.empty());
  h.append(0, {0.5, 0.5});
  h.append(10, {1.0, 0.0});
  EXPECT_EQ(h.at(0), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(h.at(9), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(h.at(10), (std::vector<double>{1.0, 0.0}));
  EXPECT_EQ(h.at(1000), (std::vector<double>{1.0, 0.0}));
  // set_weights at step 5 (the consumer's step) drops the change at 10 that had not happened.
  h.set_from(5, {0.0, 1.0});
  ASSERT_EQ(h.changes().size(), 2u);
  EXPECT_EQ(h.changes()[1].step, 5);
  EXPECT_EQ(h.at(10), (std::vector<double>{0.0, 1.0}));
  // Twice at the same step: the last one stands.
  h.set_from(5, {0.25, 0.75});
  ASSERT_EQ(h.changes().size(), 2u);
  EXPECT_EQ(h.changes()[1].weights.at("b"), 0.75);
  EXPECT_EQ(h.changes()[0].weights.at("a"), 0.5);  // by name, every domain named
  EXPECT_EQ(h.first(), (std::vector<double>{0.5, 0.5}));
  EXPECT_EQ(h.first_step(), 0);
}

}  // namespace
}  // namespace kiln::loader::detail
