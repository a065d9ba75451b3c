// engine/stability: rolling statistics, spike z-scores, the bad-batch rule, per-unit gradient
// norms, the non-finite locator, per-unit clipping, update ratios and the checkpointed state.
#include "engine/stability/monitor.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace kiln::engine {
namespace {

TEST(RollingStats, MeanVarianceAndZOverTheWindow) {
  RollingStats r(4);
  EXPECT_EQ(r.z(5.0), 0.0);                                // empty: no opinion
  for (double x : {100.0, 1.0, 2.0, 3.0, 4.0}) r.push(x);  // 100 falls out of the window
  EXPECT_EQ(r.size(), 4);
  EXPECT_DOUBLE_EQ(r.mean(), 2.5);
  EXPECT_DOUBLE_EQ(r.variance(), 1.25);
  EXPECT_NEAR(r.z(2.5 + 3 * std::sqrt(1.25)), 3.0, 1e-12);
  RollingStats flat(8);
  for (int i = 0; i < 8; ++i) flat.push(2.0);
  EXPECT_TRUE(std::isfinite(flat.z(2.1)));  // the std floor keeps a flat window finite
  EXPECT_GT(flat.z(2.1), 10.0);
}

StabilityConfig::Spike spike_config() {
  StabilityConfig::Spike c;
  c.window = 50;
  c.warmup_steps = 10;
  c.z_loss = 4;
  c.z_grad = 4;
  return c;
}

TEST(SpikeDetector, FlagsLossAndGradientSpikesAfterWarmup) {
  SpikeDetector d(spike_config());
  for (int step = 1; step <= 30; ++step) {
    const double loss = 3.0 + 0.05 * std::sin(step), grad = 0.5 + 0.02 * std::cos(step);
    SpikeCheck c = d.check(step, loss, grad);
    EXPECT_FALSE(c.spike) << step;
    d.record_clean(loss, grad);
  }
  SpikeCheck loss_spike = d.check(31, 4.0, 0.5);
  EXPECT_TRUE(loss_spike.spike);
  EXPECT_GT(loss_spike.loss_z, 4);
  EXPECT_NE(loss_spike.why.find("loss z"), std::string::npos);
  SpikeCheck grad_spike = d.check(31, 3.0, 5.0);
  EXPECT_TRUE(grad_spike.spike);
  EXPECT_NE(grad_spike.why.find("grad norm z"), std::string::npos);
  EXPECT_FALSE(d.check(31, 3.01, 0.51).spike);
  // A loss drop is not a spike (one-sided).
  EXPECT_FALSE(d.check(31, 1.0, 0.5).spike);
}

TEST(SpikeDetector, QuietDuringWarmupAndUntilTheWindowHasValues) {
  SpikeDetector d(spike_config());
  for (int step = 1; step <= 5; ++step) d.record_clean(3.0, 0.5);
  EXPECT_FALSE(d.check(20, 100.0, 0.5).spike);  // 5 values: too few for a z-score
  for (int step = 6; step <= 9; ++step) d.record_clean(3.0 + 0.01 * step, 0.5);
  EXPECT_FALSE(d.check(9, 100.0, 0.5).spike);  // within warmup_steps
  EXPECT_TRUE(d.check(11, 100.0, 0.5).spike);
}

MicroBatch batch(std::vector<int32_t> targets) {
  MicroBatch b;
  b.rows = 1;
  b.seq_len = static_cast<int64_t>(targets.size());
  b.inputs.assign(targets.size(), 0);
  b.targets = std::move(targets);
  return b;
}

TEST(InspectBatch, OneDominantTokenIsABadBatch) {
  std::vector<MicroBatch> ok = {batch({1, 2, 3, 4, 1, 2, 3, 4}), batch({5, 6, 7, 8, 9, 1, 1, -1})};
  BatchCheck c = inspect_batch(ok, 0.9);
  EXPECT_FALSE(c.bad);
  EXPECT_EQ(c.token, 1);
  EXPECT_EQ(c.targets, 15);
  EXPECT_NEAR(c.fraction, 4.0 / 15.0, 1e-12);
  std::vector<MicroBatch> bad = {batch({7, 7, 7, 7, 7, 7, 7, 7, 7, 7}),
                                 batch({7, 7, 7, 7, 7, 7, 7, 7, 7, 1})};
  c = inspect_batch(bad, 0.9);
  EXPECT_TRUE(c.bad);
  EXPECT_EQ(c.token, 7);
  EXPECT_NEAR(c.fraction, 0.95, 1e-12);
  EXPECT_FALSE(inspect_batch(bad, 0).bad);                  // 0: off
  EXPECT_FALSE(inspect_batch({batch({-1, -1})}, 0.5).bad);  // no targets
}

ModelConfig small_model() {
  ModelConfig m;
  m.vocab_size = 16;
  m.d_model = 8;
  m.n_layers = 2;
  m.n_heads = 2;
  m.seq_len = 4;
  return m;
}

void fill_grads(ParamStore& p, float value) {
  for (ParamUnit& u : p.units())
    for (size_t i = 0; i < u.numel; ++i) u.grad.data()[i] = value;
}

TEST(LayerStats, NormsNonFiniteLocatorClippingAndUpdateRatio) {
  ParamStore p(small_model(), Precision::kFp32);
  p.init(1);
  std::vector<std::string> names;
  for (const auto& u : p.units()) names.push_back(u.name);
  ASSERT_EQ(names.front(), "embed");
  ASSERT_EQ(names.back(), "final");

  fill_grads(p, 2.0f);  // gradients of loss * 4 (a loss scale of 4): 0.5 per element
  auto norms = unit_grad_norms(p, 4.0);
  for (const auto& u : p.units())
    EXPECT_NEAR(norms[u.name], 0.5 * std::sqrt(static_cast<double>(u.numel)), 1e-9) << u.name;

  EXPECT_EQ(find_nonfinite(p).first_unit, "");
  // A NaN in blocks.0 and an inf in blocks.1: backward reaches blocks.1 first.
  p.units()[1].grad.data()[3] = std::numeric_limits<float>::quiet_NaN();
  p.units()[2].grad.data()[0] = std::numeric_limits<float>::infinity();
  NonFinite nf = find_nonfinite(p);
  EXPECT_EQ(nf.first_unit, "blocks.1");
  EXPECT_EQ(nf.count, 2);

  // Per-unit clipping by an absolute limit: every unit over it ends exactly at it.
  fill_grads(p, 1.0f);
  std::map<std::string, RollingStats> avgs;
  auto clipped = clip_units(p, 1.0, 3.0, 0.0, &avgs);
  for (const auto& [unit, before] : unit_grad_norms(p, 1.0)) {
    EXPECT_LE(before, 3.0 + 1e-6) << unit;
  }
  EXPECT_FALSE(clipped.empty());
  // By factor x the unit's own history: 8 calm steps, then one unit jumps 100x.
  std::map<std::string, RollingStats> hist;
  for (int i = 0; i < 8; ++i) {
    fill_grads(p, 0.01f);
    EXPECT_TRUE(clip_units(p, 1.0, 0.0, 5.0, &hist).empty());
  }
  fill_grads(p, 0.01f);
  for (size_t i = 0; i < p.units()[1].numel; ++i) p.units()[1].grad.data()[i] = 1.0f;
  clipped = clip_units(p, 1.0, 0.0, 5.0, &hist);
  ASSERT_EQ(clipped.size(), 1u);
  EXPECT_EQ(clipped.begin()->first, "blocks.0");
  const double n = static_cast<double>(p.units()[1].numel);
  EXPECT_NEAR(clipped.begin()->second, std::sqrt(n), 1e-6);  // the norm before clipping
  EXPECT_NEAR(unit_grad_norms(p, 1.0)["blocks.0"], 5.0 * 0.01 * std::sqrt(n), 1e-5);
  EXPECT_NEAR(unit_grad_norms(p, 1.0)["blocks.1"],
              0.01 * std::sqrt(static_cast<double>(p.units()[2].numel)), 1e-6);

  // Update ratio: a 1% change of every weight of one unit.
  auto before = snapshot_masters(p);
  for (size_t i = 0; i < p.units()[2].numel; ++i) p.units()[2].master.data()[i] *= 1.01f;
  auto ratio = update_ratios(p, before);
  EXPECT_NEAR(ratio["blocks.1"], 0.01, 1e-5);
  EXPECT_EQ(ratio["embed"], 0.0);
}

TEST(StabilityState, RoundTripsWithTheDetectorWindows) {
  SpikeDetector d(spike_config());
  for (int i = 0; i < 12; ++i) d.record_clean(3.0 + i / 3.0, 0.5 + i / 7.0);
  StabilityState s;
  s.spikes = 3;
  s.rollbacks = 1;
  s.nonfinite_in_row = 2;
  s.sequences = {{"web", 120}, {"code", 40}};
  Quarantine q;
  q.from_step = 20;
  q.to_step = 26;
  q.spike_step = 26;
  q.reason = "loss z 9";
  q.sequences = {{"web", {80, 100}}};
  s.quarantined.push_back(q);
  const std::string text = s.to_json(d);
  SpikeDetector d2(spike_config());
  StabilityState s2;
  ASSERT_TRUE(StabilityState::from_json(text, &s2, &d2).is_ok());
  EXPECT_EQ(s2.to_json(d2), text);
  EXPECT_EQ(d2.loss().values(), d.loss().values());
  EXPECT_EQ(s2.quarantined.at(0).sequences.at("web"), std::make_pair(uint64_t{80}, uint64_t{100}));
  EXPECT_FALSE(StabilityState::from_json("{}", &s2, &d2).is_ok());
}

}  // namespace
}  // namespace kiln::engine
