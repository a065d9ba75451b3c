// The training loop: exact resume in every precision, fp16 overflow handling, live mixture
// changes, checkpoint retention, the metrics contract, and learning on synthetic data.
#include "engine/train/trainer.h"

#include <gtest/gtest.h>
#include <unistd.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>
#include <nlohmann/json.hpp>

#include "common/atomic_file.h"
#include "engine/config/train_config.h"
#include "engine/mixing/control_file.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {
namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) { return test::temp_dir("engine_trainer", name); }
using test::open_trainer;

TrainConfig tiny(const std::string& dir, std::vector<std::string> extra = {}) {
  std::vector<std::string> sets = {
      "model.vocab_size=96",     "model.d_model=32",   "model.n_layers=2",  "model.n_heads=2",
      "model.seq_len=32",        "data.micro_batch=2", "data.grad_accum=2", "optimizer.lr=3e-3",
      "schedule.warmup_steps=3", "run.threads=2",      "run.dir=" + dir};
  return test::config_from_sets(std::move(sets), extra);
}

std::vector<nlohmann::json> read_metrics(const std::string& dir) {
  std::ifstream in(fs::path(dir) / "metrics.jsonl");
  std::vector<nlohmann::json> out;
  std::string line;
  while (std::getline(in, line)) out.push_back(nlohmann::json::parse(line));
  return out;
}

TEST(Trainer, ResumeIsBitIdenticalInEveryPrecision) {
  for (const char* prec : {"fp32", "bf16", "fp16"}) {
    SCOPED_TRACE(prec);
    // fp16: a short growth interval and an injected overflow on each side of the resume point,
    // so the scaler state must survive the checkpoint too.
    std::vector<std::string> extra = {
        std::string("precision=") + prec, "activation_checkpointing=selective",
        "loss_scale.growth_interval=4", "stability.inject_overflow_at=[6, 13]"};
    const std::string a = temp_dir(std::string("full_") + prec);
    const std::string b = temp_dir(std::string("split_") + prec);
    auto ca = tiny(a, extra);
    ca.run.steps = 20;
    ca.schedule.total_steps = 20;
    auto ta = open_trainer(ca);
    ASSERT_TRUE(ta->run().is_ok());

    auto cb = tiny(b, extra);
    cb.run.steps = 10;
    cb.schedule.total_steps = 20;  // the same schedule as the 20-step run
    {
      auto tb = open_trainer(cb);
      ASSERT_TRUE(tb->run().is_ok());
    }
    cb.run.steps = 20;
    auto tr = open_trainer(cb, /*resume=*/true);
    EXPECT_EQ(tr->state().step, 10);
    ASSERT_TRUE(tr->run().is_ok());

    const auto& full = ta->history();
    const auto& resumed = tr->history();
    ASSERT_EQ(full.size(), 20u);
    ASSERT_EQ(resumed.size(), 10u);
    for (size_t i = 0; i < 10; ++i) {
      const StepRecord& x = full[10 + i];
      const StepRecord& y = resumed[i];
      EXPECT_EQ(x.step, y.step);
      EXPECT_EQ(0, std::memcmp(&x.loss, &y.loss, sizeof(double)))
          << "step " << x.step << ": " << x.loss << " vs " << y.loss;
      EXPECT_EQ(x.skipped, y.skipped);
      EXPECT_EQ(x.loss_scale, y.loss_scale);
      EXPECT_EQ(x.tokens, y.tokens);
    }
    EXPECT_TRUE(resumed[2].skipped);  // step 13
    // The resumed run's metrics.jsonl holds steps 1..20 once each.
    auto lines = read_metrics(b);
    ASSERT_EQ(lines.size(), 20u);
    for (size_t i = 0; i < lines.size(); ++i) EXPECT_EQ(lines[i]["step"], i + 1);
    fs::remove_all(a);
    fs::remove_all(b);
  }
}

TEST(Trainer, Fp16OverflowSkipsExactlyThatStepAndHalvesTheScale) {
  const std::string dir = temp_dir("overflow");
  auto c =
      tiny(dir, {"precision=fp16", "loss_scale.hysteresis=1", "stability.inject_overflow_at=[4]"});
  c.run.steps = 12;
  auto t = open_trainer(c);
  std::vector<std::vector<float>> before;
  for (int s = 1; s <= 12; ++s) {
    if (s == 4) {
      for (auto& u : t->params().units())
        before.emplace_back(u.master.data(), u.master.data() + u.numel);
    }
    auto rec = t->step();
    ASSERT_TRUE(rec.is_ok());
    if (s == 4) {  // weights and moments untouched by the skipped step
      for (size_t u = 0; u < before.size(); ++u)
        ASSERT_EQ(0, std::memcmp(before[u].data(), t->params().units()[u].master.data(),
                                 before[u].size() * 4));
    }
  }
  const auto& h = t->history();
  for (int s = 1; s <= 12; ++s) EXPECT_EQ(h[s - 1].skipped, s == 4) << "step " << s;
  EXPECT_EQ(*h[2].loss_scale, 65536.0);
  EXPECT_EQ(*h[3].loss_scale, 65536.0);  // the scale used by the overflowing step
  EXPECT_EQ(*h[4].loss_scale, 32768.0);  // halved for the next
  EXPECT_EQ(*h[11].loss_scale, 32768.0);
  EXPECT_FALSE(std::isfinite(h[3].grad_norm));
  EXPECT_EQ(t->state().skipped_steps, 1);
  EXPECT_EQ(t->state().adam_updates, 11);
  EXPECT_LT(h[11].loss, h[0].loss);  // training went on
  auto lines = read_metrics(dir);
  ASSERT_EQ(lines.size(), 12u);
  EXPECT_EQ(lines[3]["skipped"], true);
  EXPECT_TRUE(lines[3]["grad_norm"].is_null());
  EXPECT_EQ(lines[3]["loss_scale"], 65536.0);
  EXPECT_EQ(lines[4]["loss_scale"], 32768.0);

  // Default hysteresis 2: the first overflow skips without backing off, the second halves.
  const std::string dir2 = temp_dir("overflow2");
  auto c2 = tiny(dir2, {"precision=fp16", "stability.inject_overflow_at=[2, 5]"});
  c2.run.steps = 6;
  auto t2 = open_trainer(c2);
  ASSERT_TRUE(t2->run().is_ok());
  const auto& h2 = t2->history();
  EXPECT_TRUE(h2[1].skipped && h2[4].skipped);
  EXPECT_EQ(*h2[2].loss_scale, 65536.0);
  EXPECT_EQ(*h2[5].loss_scale, 32768.0);
  fs::remove_all(dir);
  fs::remove_all(dir2);
}

TEST(Trainer, NonFiniteGradientsInBf16AreSkippedOrStop) {
  const std::string dir = temp_dir("nonfinite");
  auto c = tiny(dir, {"precision=bf16", "stability.inject_overflow_at=[2]"});
  c.run.steps = 3;
  auto t = open_trainer(c);
  ASSERT_TRUE(t->run().is_ok());
  EXPECT_TRUE(t->history()[1].skipped);
  EXPECT_FALSE(t->history()[1].loss_scale.has_value());
  fs::remove_all(dir);
  auto c2 = tiny(dir, {"stability.inject_overflow_at=[2]", "stability.skip_nonfinite=false"});
  c2.run.steps = 3;
  auto t2 = open_trainer(c2);
  EXPECT_FALSE(t2->run().is_ok());
  fs::remove_all(dir);
}

TEST(Trainer, MetricsContractCheckpointsAndRetention) {
  const std::string dir = temp_dir("metrics");
  auto c = tiny(dir, {"checkpoint.every_steps=2", "checkpoint.keep_last=2"});
  c.run.steps = 7;
  auto t = open_trainer(c);
  ASSERT_TRUE(t->run().is_ok());
  auto lines = read_metrics(dir);
  ASSERT_EQ(lines.size(), 7u);
  for (const char* key :
       {"step", "loss", "lr", "grad_norm", "loss_scale", "tokens", "tokens_per_s", "step_ms",
        "skipped", "domain_loss", "domain_weights", "loader_wait_ms"}) {
    EXPECT_TRUE(lines[0].contains(key)) << key;
  }
  EXPECT_TRUE(lines[0]["loss_scale"].is_null());
  EXPECT_EQ(lines[6]["tokens"], 7 * 2 * 2 * 32);
  EXPECT_TRUE(lines[0]["domain_loss"].is_object());
  EXPECT_DOUBLE_EQ(lines[0]["domain_weights"]["markov"].get<double>(), 0.5);
  EXPECT_TRUE(fs::exists(fs::path(dir) / "config.yaml"));
  // Saved at 2, 4, 6 and at the end (7); only the last two remain.
  std::vector<std::string> kept;
  for (const auto& e : fs::directory_iterator(fs::path(dir) / "checkpoints"))
    kept.push_back(e.path().filename().string());
  std::sort(kept.begin(), kept.end());
  EXPECT_EQ(kept, (std::vector<std::string>{"latest", "step-00000006", "step-00000007"}));
  auto latest = read_file((fs::path(dir) / "checkpoints" / "latest").string());
  EXPECT_EQ(*latest, "step-00000007\n");
  for (const char* f :
       {"meta.json", "model.safetensors", "optimizer.safetensors", "state.json", "config.yaml"})
    EXPECT_TRUE(fs::exists(fs::path(dir) / "checkpoints" / "step-00000007" / f)) << f;

  // A fresh start in a used run directory is refused; --overwrite allows it.
  TrainOptions o;
  o.console = false;
  auto again = Trainer::open(c, "", o);
  ASSERT_FALSE(again.is_ok());
  EXPECT_EQ(again.status().code(), StatusCode::kUsage);
  o.overwrite = true;
  EXPECT_TRUE(Trainer::open(c, "", o).is_ok());
  EXPECT_FALSE(fs::exists(fs::path(dir) / "checkpoints"));

  // A corrupted checkpoint is reported, not loaded.
  ASSERT_TRUE(open_trainer(c)->run().is_ok());
  {
    std::fstream f((fs::path(dir) / "checkpoints" / "step-00000007" / "model.safetensors").string(),
                   std::ios::in | std::ios::out | std::ios::binary);
    f.seekp(-3, std::ios::end);
    f.put('\x7f');
  }
  o.resume = true;
  o.overwrite = false;
  auto bad = Trainer::open(c, "", o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_NE(bad.status().to_string().find("checksum"), std::string::npos);
  fs::remove_all(dir);
}

TEST(Trainer, LiveMixtureChangesApplyBetweenSteps) {
  const std::string dir = temp_dir("mixture");
  auto c = tiny(dir);
  c.run.steps = 8;
  auto t = open_trainer(c);
  for (int s = 1; s <= 8; ++s) {
    if (s == 3) {
      ASSERT_TRUE(write_mixture(dir, {{"markov", 1.0}}).is_ok());
    }
    if (s == 5) {
      ASSERT_TRUE(write_file_atomic(mixture_path(dir), "{\"weights\": {\"nope\": 1}}").is_ok());
    }
    if (s == 7) {
      ASSERT_TRUE(write_mixture(dir, {{"markov", 1.0}, {"repeat", 3.0}}).is_ok());
    }
    ASSERT_TRUE(t->step().is_ok());
  }
  const auto& h = t->history();
  EXPECT_DOUBLE_EQ(h[1].domain_weights.at("repeat"), 0.5);
  for (int s : {3, 4, 5, 6}) {
    EXPECT_DOUBLE_EQ(h[s - 1].domain_weights.at("markov"), 1.0) << s;
    EXPECT_EQ(h[s - 1].domain_loss.count("repeat"), 0u) << s;  // no repeat sequences drawn
  }
  EXPECT_DOUBLE_EQ(h[6].domain_weights.at("repeat"), 0.75);
  fs::remove_all(dir);
}

TEST(Trainer, ThreadCountDoesNotChangeResults) {
  std::vector<double> losses[2];
  for (int i = 0; i < 2; ++i) {
    const std::string dir = temp_dir("threads" + std::to_string(i));
    auto c = tiny(dir, {"precision=bf16", "run.threads=" + std::to_string(i + 1)});
    c.run.steps = 5;
    auto t = open_trainer(c);
    ASSERT_TRUE(t->run().is_ok());
    for (const auto& r : t->history()) losses[i].push_back(r.loss);
    fs::remove_all(dir);
  }
  ASSERT_EQ(losses[0].size(), 5u);
  EXPECT_EQ(0, std::memcmp(losses[0].data(), losses[1].data(), 5 * sizeof(double)));
}

TEST(Trainer, ResumeInAnotherPrecision) {
  const std::string dir = temp_dir("switch");
  auto c = tiny(dir, {"precision=bf16"});
  c.run.steps = 4;
  ASSERT_TRUE(open_trainer(c)->run().is_ok());
  auto c2 = tiny(dir, {"precision=fp16"});
  c2.run.steps = 6;
  auto t = open_trainer(c2, /*resume=*/true);
  EXPECT_EQ(t->state().step, 4);
  ASSERT_TRUE(t->run().is_ok());
  EXPECT_EQ(*t->history().back().loss_scale, 65536.0);
  // A different model shape is a config error naming the difference.
  auto c3 = tiny(dir, {"model.d_model=48"});
  TrainOptions o;
  o.resume = true;
  o.console = false;
  auto bad = Trainer::open(c3, "", o);
  ASSERT_FALSE(bad.is_ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kConfig);
  fs::remove_all(dir);
}

TEST(Trainer, LearnsSyntheticData) {
  const std::string dir = temp_dir("learn");
  // The markov domain: a bigram chain with 4 successors per token (best loss ln 4 = 1.39).
  auto c = tiny(dir, {"schedule.type=constant", "data.mixture.markov=1", "data.micro_batch=8",
                      "data.grad_accum=1"});
  c.run.steps = 100;
  auto t = open_trainer(c);
  ASSERT_TRUE(t->run().is_ok());
  const auto& h = t->history();
  double first = 0, last = 0;
  for (int i = 0; i < 5; ++i) {
    first += h[i].loss / 5;
    last += h[h.size() - 1 - i].loss / 5;
  }
  EXPECT_NEAR(first, std::log(96.0), 0.2);  // starts near uniform
  EXPECT_LT(last, first - 1.0) << first << " -> " << last;
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::engine
