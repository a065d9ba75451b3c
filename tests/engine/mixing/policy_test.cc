// engine/mixing_policy: each policy's update rule, its direction on a hard vs an easy domain,
// flooring, pausing, and exact replay through the serialised state.
#include "engine/mixing/policy.h"

#include <gtest/gtest.h>

#include <cmath>
#include <filesystem>
#include <fstream>

namespace kiln::engine {
namespace {

const std::vector<std::string> kDomains = {"easy", "hard"};

MixingConfig config(MixPolicy p) {
  MixingConfig c;
  c.policy = p;
  c.update_every = 5;
  c.min_weight = 0.01;
  c.doremi_reference_loss = {{"easy", 1.0}, {"hard", 2.0}};
  return c;
}

// The hard domain's loss stays well above its reference; the easy one sits on its reference.
MixObservation observe(int64_t step) {
  MixObservation o;
  o.step = step;
  o.train_loss = {{"easy", 1.0}, {"hard", 5.0}};
  return o;
}

TEST(MixingPolicy, ParsesNamesAndNamesTheKeyOnError) {
  EXPECT_EQ(*parse_mix_policy("odm", "mixing.policy"), MixPolicy::kOdm);
  auto bad = parse_mix_policy("doremy", "mixing.policy");
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().key(), "mixing.policy");
}

TEST(MixingPolicy, StaticNeverChanges) {
  MixingConfig c = config(MixPolicy::kStatic);
  MixState s = mix_initial_state(c, kDomains, {{"easy", 3}, {"hard", 1}});
  EXPECT_DOUBLE_EQ(s.weights["easy"], 0.75);
  for (int64_t step = 1; step <= 50; ++step) {
    EXPECT_FALSE(mix_due(c, s, step));
    s = *mix_update(c, s, observe(step));
  }
  EXPECT_DOUBLE_EQ(s.weights["easy"], 0.75);
  EXPECT_DOUBLE_EQ(s.weights["hard"], 0.25);
}

TEST(MixingPolicy, ScheduleSteppedAndInterpolated) {
  MixingConfig c = config(MixPolicy::kSchedule);
  c.schedule = {{0, {{"easy", 0.8}, {"hard", 0.2}}}, {100, {{"easy", 0.2}, {"hard", 0.8}}}};
  EXPECT_DOUBLE_EQ(schedule_weights(c, 0)["easy"], 0.8);
  EXPECT_DOUBLE_EQ(schedule_weights(c, 99)["easy"], 0.8);
  EXPECT_DOUBLE_EQ(schedule_weights(c, 100)["easy"], 0.2);
  EXPECT_DOUBLE_EQ(schedule_weights(c, 1000)["hard"], 0.8);
  c.interpolate = true;
  EXPECT_NEAR(schedule_weights(c, 50)["easy"], 0.5, 1e-12);
  EXPECT_NEAR(schedule_weights(c, 25)["hard"], 0.35, 1e-12);
  // A stepped schedule is due at its points even off the update interval.
  c.interpolate = false;
  c.update_every = 7;
  MixState s = mix_initial_state(c, kDomains, {});
  EXPECT_DOUBLE_EQ(s.weights["easy"], 0.8);  // the schedule's step-0 point, not the base
  EXPECT_TRUE(mix_due(c, s, 100));
  s = *mix_update(c, s, observe(100));
  EXPECT_DOUBLE_EQ(s.weights["hard"], 0.8);
}

TEST(MixingPolicy, DoremiMovesWeightToTheDomainWithExcessLoss) {
  MixingConfig c = config(MixPolicy::kDoremi);
  MixState s = mix_initial_state(c, kDomains, {{"easy", 0.5}, {"hard", 0.5}});
  double prev = s.weights["hard"];
  // One update by hand: a <- softmax(log a + eta * max(l - ref, 0)), smoothed, floored.
  MixState one = *mix_update(c, s, observe(5));
  const double e = std::exp(1.0 * 3.0);
  double hard = e / (1.0 + e);
  hard = (1 - c.doremi_smoothing) * hard + c.doremi_smoothing / 2;
  hard = c.min_weight + (1 - 2 * c.min_weight) * hard;
  EXPECT_NEAR(one.weights["hard"], hard, 1e-12);
  for (int i = 1; i <= 10; ++i) {
    s = *mix_update(c, s, observe(5 * i));
    EXPECT_GT(s.weights["hard"], prev) << "update " << i;
    prev = s.weights["hard"];
    EXPECT_NEAR(s.weights["easy"] + s.weights["hard"], 1.0, 1e-12);
    EXPECT_GE(s.weights["easy"], c.min_weight);
  }
  EXPECT_EQ(s.updates, 10);
  // The run's average lies between the first update's weights and the last.
  const double avg = s.average()["hard"];
  EXPECT_GT(avg, one.weights["hard"] - 1e-12);
  EXPECT_LT(avg, s.weights["hard"]);
}

TEST(MixingPolicy, DoremiWithoutExcessOnlySmoothsTowardUniform) {
  MixingConfig c = config(MixPolicy::kDoremi);
  c.min_weight = 0;
  MixState s = mix_initial_state(c, kDomains, {{"easy", 0.9}, {"hard", 0.1}});
  MixObservation o;
  o.step = 5;
  o.val_loss = {{"easy", 0.5}, {"hard", 1.5}};  // both below their references
  MixState n = *mix_update(c, s, o);
  EXPECT_NEAR(n.weights["easy"], 0.9 * (1 - c.doremi_smoothing) + c.doremi_smoothing / 2, 1e-12);
}

TEST(MixingPolicy, DoremiPrefersValidationLossAndNeedsAReference) {
  MixingConfig c = config(MixPolicy::kDoremi);
  MixState s = mix_initial_state(c, kDomains, {});
  MixObservation o = observe(5);
  o.val_loss = {{"easy", 3.0}, {"hard", 2.0}};  // now the easy domain lags its reference
  MixState n = *mix_update(c, s, o);
  EXPECT_GT(n.weights["easy"], 0.5);
  c.doremi_reference_loss.erase("hard");
  EXPECT_FALSE(mix_update(c, s, o).is_ok());
}

TEST(MixingPolicy, OdmFavoursTheDomainWithTheHigherLoss) {
  MixingConfig c = config(MixPolicy::kOdm);
  MixState s = mix_initial_state(c, kDomains, {{"easy", 0.5}, {"hard", 0.5}});
  // First update by hand: R = (1-g) * l * n / (N p) with 30 of 60 sequences each (weight 1);
  // eps_1 = min(1/2, sqrt(ln 2 / 2)) = 0.5, so the first weights are exactly uniform (full
  // exploration); the rewards carry over.
  MixObservation first = observe(5);
  first.sequences = {{"easy", 30}, {"hard", 30}};
  MixState one = *mix_update(c, s, first);
  EXPECT_NEAR(one.reward["hard"], 0.1 * 5.0, 1e-12);
  EXPECT_NEAR(one.reward["easy"], 0.1 * 1.0, 1e-12);
  EXPECT_NEAR(one.weights["hard"], 0.5, 1e-12);
  // Second update by hand: R_hard = 0.9 * 0.5 + 0.1 * 5 = 0.95, R_easy = 0.19;
  // eps_2 = sqrt(ln 2 / 4); the rewards are weighted by eps_1 = 0.5.
  MixState two = *mix_update(c, one, observe(10));
  const double eps2 = std::sqrt(std::log(2.0) / 4.0);
  double hard = (1 - 2 * eps2) / (1 + std::exp(-0.5 * (0.95 - 0.19))) + eps2;
  hard = c.min_weight + (1 - 2 * c.min_weight) * hard;
  EXPECT_NEAR(two.weights["hard"], hard, 1e-12);
  // From then on the harder domain keeps the larger share; exploration eps_t shrinks as
  // sqrt(ln 2 / (2 t)) and bounds the easy domain's weight from below.
  s = two;
  for (int i = 3; i <= 40; ++i) {
    s = *mix_update(c, s, observe(5 * i));
    EXPECT_GT(s.weights["hard"], s.weights["easy"]) << "update " << i;
    const double eps = std::sqrt(std::log(2.0) / (2.0 * i));
    EXPECT_GE(s.weights["easy"], c.min_weight + (1 - 2 * c.min_weight) * eps - 1e-12);
  }
  EXPECT_GT(s.weights["hard"], 0.55);
}

TEST(MixingPolicy, OdmOnlyRewardsObservedDomains) {
  MixingConfig c = config(MixPolicy::kOdm);
  MixState s = mix_initial_state(c, kDomains, {});
  MixObservation o;
  o.step = 5;
  o.train_loss = {{"hard", 4.0}};
  o.sequences = {{"hard", 10}};
  s = *mix_update(c, s, o);
  EXPECT_EQ(s.reward["easy"], 0.0);
  // All 10 sequences came from a domain drawn with probability 0.5: importance weight 2.
  EXPECT_NEAR(s.reward["hard"], 0.1 * 4.0 * 2.0, 1e-12);
}

TEST(MixingPolicy, FloorHoldsForEveryPolicy) {
  for (MixPolicy p : {MixPolicy::kDoremi, MixPolicy::kOdm}) {
    MixingConfig c = config(p);
    c.min_weight = 0.1;
    c.doremi_eta = 50;
    MixState s = mix_initial_state(c, kDomains, {{"easy", 1.0}, {"hard", 0.0}});
    EXPECT_NEAR(s.weights["hard"], 0.1, 1e-12) << mix_policy_name(p);
    for (int i = 1; i <= 20; ++i) s = *mix_update(c, s, observe(5 * i));
    EXPECT_GE(s.weights["easy"], 0.1 - 1e-12) << mix_policy_name(p);
  }
}

TEST(MixingPolicy, PausedStateKeepsItsWeights) {
  MixingConfig c = config(MixPolicy::kOdm);
  MixState s = mix_initial_state(c, kDomains, {});
  s.paused = true;
  s.weights = {{"easy", 0.7}, {"hard", 0.3}};
  EXPECT_FALSE(mix_due(c, s, 5));
  MixState n = *mix_update(c, s, observe(5));
  EXPECT_EQ(n.weights, s.weights);
  EXPECT_EQ(n.updates, 0);
}

TEST(MixingPolicy, StateRoundTripReplaysExactly) {
  for (MixPolicy p : {MixPolicy::kDoremi, MixPolicy::kOdm}) {
    MixingConfig c = config(p);
    MixState straight = mix_initial_state(c, kDomains, {});
    MixState resumed = straight;
    for (int i = 1; i <= 30; ++i) {
      MixObservation o = observe(5 * i);
      o.train_loss["hard"] = 5.0 - 0.1 * i + 1.0 / 3.0;  // values with long binary expansions
      straight = *mix_update(c, straight, o);
      if (i == 12) {
        auto back = MixState::from_json(resumed.to_json(), "test");
        ASSERT_TRUE(back.is_ok()) << back.status().to_string();
        resumed = *back;
      }
      resumed = *mix_update(c, resumed, o);
    }
    EXPECT_EQ(straight.to_json(), resumed.to_json()) << mix_policy_name(p);
    EXPECT_EQ(straight.weights, resumed.weights);  // bit-exact doubles
  }
  EXPECT_FALSE(MixState::from_json("{\"policy\": \"x\"}", "f").is_ok());
}

TEST(MixingPolicy, LoadsReferenceLossesFromAFileOrARun) {
  namespace fs = std::filesystem;
  fs::path dir = fs::temp_directory_path() / ("kiln_mix_ref_" + std::to_string(::getpid()));
  fs::create_directories(dir / "run");
  std::ofstream(dir / "ref.json") << R"({"easy": 1.5, "hard": 3.25})";
  auto f = load_reference_loss((dir / "ref.json").string());
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_DOUBLE_EQ((*f)["hard"], 3.25);
  std::ofstream(dir / "run" / "metrics.jsonl")
      << R"({"step": 1, "domain_loss": {"easy": 2.0, "hard": 4.0}})"
      << "\n"
      << R"({"step": 2, "domain_loss": {"easy": 1.0, "hard": 2.0}, "val_loss": {"easy": 1.25, "hard": 2.5}})"
      << "\n"
      << R"({"step": 3, "domain_loss": {"easy": 1.0, "hard": 2.0}})"
      << "\n";
  auto r = load_reference_loss((dir / "run").string());
  ASSERT_TRUE(r.is_ok()) << r.status().to_string();
  EXPECT_DOUBLE_EQ((*r)["easy"], 1.25);  // the last validation loss wins over training loss
  std::ofstream(dir / "bad.json") << R"({"easy": "x"})";
  auto bad = load_reference_loss((dir / "bad.json").string());
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().key(), "mixing.doremi.reference");
  EXPECT_FALSE(load_reference_loss((dir / "missing.json").string()).is_ok());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::engine
