// engine/train/metrics.h: the metrics log keeps a resumed run's lines and drops the rest, and
// last_logged_weights reads what `kiln mix` shows as in effect.
#include "engine/train/metrics.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>
#include <sstream>

#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {

std::string read_text(const std::string& path) {
  std::ifstream in(path);
  std::stringstream s;
  s << in.rdbuf();
  return s.str();
}

StepRecord record(int64_t step, double weight_a) {
  StepRecord r;
  r.step = step;
  r.loss = 1.0 / static_cast<double>(step);
  r.domain_weights = loader::DomainWeights{{"a", weight_a}, {"b", 1 - weight_a}};
  return r;
}

TEST(EngineMetrics, OpenKeepsTheStepsOfTheCheckpointAndDropsATornLine) {
  const std::string dir = test::temp_dir("metrics", "keep");
  std::filesystem::create_directories(dir);
  {
    auto log = MetricsLog::open(dir, 0);
    ASSERT_TRUE(log.is_ok()) << log.status().to_string();
    for (int64_t s = 1; s <= 5; ++s) ASSERT_TRUE((*log)->append(record(s, 0.5)).is_ok());
  }
  std::ofstream(metrics_path(dir), std::ios::app) << "{\"step\": 6, \"lo";  // killed mid-line
  {
    auto log = MetricsLog::open(dir, 3);
    ASSERT_TRUE(log.is_ok());
    ASSERT_TRUE((*log)->append(record(4, 0.25)).is_ok());
  }
  const std::string expected =
      step_record_json(record(1, 0.5)) + "\n" + step_record_json(record(2, 0.5)) + "\n" +
      step_record_json(record(3, 0.5)) + "\n" + step_record_json(record(4, 0.25)) + "\n";
  EXPECT_EQ(read_text(metrics_path(dir)), expected);
  std::filesystem::remove_all(dir);
}

TEST(EngineMetrics, LastLoggedWeightsSkipsALineBeingWritten) {
  const std::string dir = test::temp_dir("metrics", "last");
  std::filesystem::create_directories(dir);
  EXPECT_FALSE(last_logged_weights(dir).has_value());  // no metrics.jsonl yet
  {
    auto log = MetricsLog::open(dir, 0);
    ASSERT_TRUE(log.is_ok());
    ASSERT_TRUE((*log)->append(record(1, 0.5)).is_ok());
    ASSERT_TRUE((*log)->append(record(2, 0.75)).is_ok());
  }
  std::ofstream(metrics_path(dir), std::ios::app) << "{\"step\": 3, \"domain_weigh";
  auto last = last_logged_weights(dir);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->step, 2);
  EXPECT_DOUBLE_EQ(last->weights.at("a"), 0.75);
  EXPECT_DOUBLE_EQ(last->weights.at("b"), 0.25);
  std::filesystem::remove_all(dir);
}

}  // namespace
}  // namespace kiln::engine
