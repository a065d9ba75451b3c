// Mixing policies and validation loss inside `kiln train` (engine/mix_controller, engine/eval):
// the policy's weights reach the loader and the metrics, replay exactly after a resume, pause
// when `kiln mix set` pins weights and resume with `kiln mix policy`; val_loss is measured on
// the same sequences at every evaluation and after a resume.
#include "engine/mixing/controller.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "engine/config/train_config.h"
#include "engine/mixing/control_file.h"
#include "engine/train/trainer.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {
namespace fs = std::filesystem;
using json = nlohmann::json;

std::string temp_dir(const std::string& name) { return test::temp_dir("mix_controller", name); }
using test::open_trainer;

// Synthetic data: "markov" (a random bigram chain, loss floor ln 4) is the hard domain,
// "repeat" (a repeated 16-token motif) the easy one.
TrainConfig tiny(const std::string& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {
      "model.vocab_size=64",  "model.d_model=32",    "model.n_layers=1",
      "model.n_heads=2",      "model.seq_len=32",    "data.micro_batch=4",
      "optimizer.lr=1e-2",    "run.threads=1",       "run.dir=" + dir,
      "run.steps=40",         "eval.every_steps=10", "eval.sequences_per_domain=6",
      "mixing.update_every=5"};
  return test::config_from_sets(std::move(sets), extra);
}

std::vector<json> read_jsonl(const std::string& path) {
  std::ifstream in(path);
  std::vector<json> out;
  for (std::string line; std::getline(in, line);) out.push_back(json::parse(line));
  return out;
}

TEST(MixController, OdmRaisesTheHardDomainAndReplaysExactlyAfterResume) {
  const std::string a = temp_dir("odm_full"), b = temp_dir("odm_split");
  std::vector<std::string> extra = {"mixing.policy=odm"};
  {
    auto t = open_trainer(tiny(a, extra));
    ASSERT_TRUE(t->run().is_ok());
  }
  {
    auto c = tiny(b, extra);
    c.run.steps = 17;  // a checkpoint between two policy updates
    c.schedule.total_steps = 40;
    auto t = open_trainer(c);
    ASSERT_TRUE(t->run().is_ok());
  }
  {
    auto t = open_trainer(tiny(b, extra), /*resume=*/true);
    ASSERT_TRUE(t->run().is_ok());
  }
  auto ma = read_jsonl(a + "/metrics.jsonl"), mb = read_jsonl(b + "/metrics.jsonl");
  ASSERT_EQ(ma.size(), 40u);
  ASSERT_EQ(mb.size(), 40u);
  for (size_t i = 0; i < ma.size(); ++i) {
    EXPECT_EQ(ma[i]["domain_weights"], mb[i]["domain_weights"]) << "step " << i + 1;
    EXPECT_EQ(ma[i]["loss"], mb[i]["loss"]) << "step " << i + 1;
    EXPECT_EQ(ma[i].value("val_loss", json()), mb[i].value("val_loss", json()));
    EXPECT_EQ(ma[i]["mixing_policy"], "odm");
  }
  // The policy moved the weights, toward the domain with the higher training loss (markov).
  const double first = ma.front()["domain_weights"]["markov"].get<double>();
  const double last = ma.back()["domain_weights"]["markov"].get<double>();
  EXPECT_DOUBLE_EQ(first, 0.5);
  EXPECT_GT(last, first);
  // The history and the result file exist and agree with the metrics.
  auto ha = read_jsonl(mixing_history_path(a)), hb = read_jsonl(mixing_history_path(b));
  EXPECT_EQ(ha, hb);
  ASSERT_GE(ha.size(), 2u);
  EXPECT_EQ(ha.front()["event"], "start");
  EXPECT_EQ(ha.back()["event"], "update");
  EXPECT_TRUE(fs::exists(mixing_result_path(a)));
}

TEST(MixController, DoremiWithAReferenceRunRaisesTheDomainThatLagsIt) {
  // Reference: a uniform static run. The proxy then starts from scratch, so both domains lag
  // the reference; the easy domain's reference loss is far lower, so its excess (and weight)
  // grows first.
  const std::string ref = temp_dir("ref"), run = temp_dir("doremi");
  {
    auto t = open_trainer(tiny(ref));
    ASSERT_TRUE(t->run().is_ok());
  }
  auto rows = read_jsonl(ref + "/metrics.jsonl");
  ASSERT_TRUE(rows.back().contains("val_loss"));
  const json ref_val = rows.back()["val_loss"];
  auto c = tiny(run, {"mixing.policy=doremi", "mixing.doremi.reference=" + ref});
  c.run.steps = 10;
  auto t = open_trainer(c);
  ASSERT_TRUE(t->run().is_ok());
  auto m = read_jsonl(run + "/metrics.jsonl");
  // After the first update (step 5; no validation yet, so the mean training loss of steps
  // 1..5) the weights follow s = max(l - ref, 0).
  auto excess = [&](const std::string& d) {
    double sum = 0;
    int n = 0;
    for (int i = 0; i < 5; ++i) {
      if (!m[i]["domain_loss"].contains(d)) continue;
      sum += m[i]["domain_loss"][d].get<double>();
      ++n;
    }
    return std::max(0.0, sum / n - ref_val[d].get<double>());
  };
  const double excess_markov = excess("markov"), excess_repeat = excess("repeat");
  ASSERT_NE(excess_markov, excess_repeat);
  const double w6 = m[5]["domain_weights"]["markov"].get<double>();
  if (excess_markov > excess_repeat)
    EXPECT_GT(w6, 0.5);
  else
    EXPECT_LT(w6, 0.5);
  EXPECT_TRUE(fs::exists(mixing_result_path(run)));
  // A doremi run without a reference is a config error naming the key.
  TrainOptions o;
  o.console = false;
  auto bad = Trainer::open(tiny(temp_dir("noref"), {"mixing.policy=doremi"}), "", o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().key(), "mixing.doremi.reference");
}

TEST(MixController, PinPausesThePolicyAndMixPolicyResumesIt) {
  const std::string dir = temp_dir("pin");
  auto t = open_trainer(tiny(dir, {"mixing.policy=odm"}));
  for (int i = 0; i < 12; ++i) ASSERT_TRUE(t->step().is_ok());
  ASSERT_TRUE(write_mixture(dir, {{"markov", 1.0}, {"repeat", 3.0}}).is_ok());
  for (int i = 0; i < 10; ++i) {
    auto r = t->step();
    ASSERT_TRUE(r.is_ok());
    EXPECT_DOUBLE_EQ(r->domain_weights.at("repeat"), 0.75) << "step " << r->step;
    EXPECT_TRUE(r->mixing_paused);
  }
  ASSERT_TRUE(write_policy_request(dir, "odm").is_ok());
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t->step().is_ok());
  const StepRecord& last = t->history().back();
  EXPECT_FALSE(last.mixing_paused);
  EXPECT_NE(last.domain_weights.at("repeat"), 0.75);  // the policy moves the weights again
  auto h = read_jsonl(mixing_history_path(dir));
  std::vector<std::string> events;
  for (const auto& l : h) events.push_back(l["event"]);
  EXPECT_NE(std::find(events.begin(), events.end(), "pin"), events.end());
  EXPECT_NE(std::find(events.begin(), events.end(), "resume"), events.end());
  EXPECT_FALSE(write_policy_request(dir, "dormi").is_ok());
}

TEST(MixController, ScheduleAppliesItsPoints) {
  const std::string dir = temp_dir("schedule");
  auto t = open_trainer(tiny(dir, {"mixing.policy=schedule",
                                   "mixing.schedule=[{step: 0, weights: {markov: 1, repeat: 0}}, "
                                   "{step: 7, weights: {markov: 0, repeat: 1}}]"}));
  for (int i = 0; i < 10; ++i) ASSERT_TRUE(t->step().is_ok());
  const auto& h = t->history();
  for (const auto& r : h) {
    // Weights decided after step 7 apply from step 8.
    EXPECT_DOUBLE_EQ(r.domain_weights.at("markov"), r.step <= 7 ? 1.0 : 0.0) << r.step;
    for (const auto& [d, l] : r.domain_loss) EXPECT_EQ(d, r.step <= 7 ? "markov" : "repeat");
  }
}

TEST(MixController, ValidationLossUsesTheSameSequencesEveryTime) {
  // lr 0: the model never changes, so every evaluation - also after a resume - must give
  // exactly the same numbers if and only if it scores the same sequences.
  const std::string dir = temp_dir("val");
  std::vector<std::string> extra = {"optimizer.lr=0", "run.steps=20", "checkpoint.every_steps=10"};
  {
    auto c = tiny(dir, extra);
    c.run.steps = 10;
    auto t = open_trainer(c);
    ASSERT_TRUE(t->run().is_ok());
  }
  {
    auto t = open_trainer(tiny(dir, extra), /*resume=*/true);
    ASSERT_TRUE(t->run().is_ok());
  }
  auto m = read_jsonl(dir + "/metrics.jsonl");
  ASSERT_EQ(m.size(), 20u);
  ASSERT_TRUE(m[9].contains("val_loss"));
  ASSERT_TRUE(m[19].contains("val_loss"));
  EXPECT_FALSE(m[10].contains("val_loss"));
  EXPECT_EQ(m[9]["val_loss"], m[19]["val_loss"]);
  EXPECT_EQ(m[9]["val_loss"].size(), 2u);
  // An untrained model scores about ln(vocab) on both domains.
  for (const auto& [d, v] : m[9]["val_loss"].items())
    EXPECT_NEAR(v.get<double>(), std::log(64.0), 0.5);
}

}  // namespace
}  // namespace kiln::engine
