// Engine building blocks that need no kernels: config parsing, LR schedules, the fp16 loss
// scaler, the mixture control file, safetensors I/O and the counter-based RNG.
#include <gtest/gtest.h>

#include <cmath>
#include <cstring>
#include <filesystem>
#include <fstream>

#include "common/atomic_file.h"
#include "engine/model/loss_scaler.h"
#include "engine/mixing/control_file.h"
#include "engine/model/rng.h"
#include "engine/checkpoint/safetensors.h"
#include "engine/model/schedule.h"
#include "engine/train/train_config.h"
#include "tests/engine_test_util.h"

namespace kiln::engine {
namespace {
namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  std::string p = test::temp_dir("engine_units", name);
  fs::create_directories(p);
  return p;
}

TEST(TrainConfig, DefaultsParse) {
  auto cfg = load_train_config("", {});
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto tc = parse_train_config(*cfg);
  ASSERT_TRUE(tc.is_ok()) << tc.status().to_string();
  EXPECT_EQ(tc->precision, Precision::kFp32);
  EXPECT_EQ(tc->schedule.total_steps, tc->run.steps);  // 0 means run.steps
  EXPECT_FLOAT_EQ(tc->optimizer.beta2, 0.95f);
  EXPECT_EQ(tc->loss_scale.initial, 65536.0);
  EXPECT_EQ(tc->loss_scale.growth_interval, 2000);
  EXPECT_EQ(tc->loss_scale.hysteresis, 2);
}

TEST(TrainConfig, SetsAndErrorsNameTheKey) {
  auto cfg = load_train_config("", {"precision=bf16", "model.n_layers=2", "data.mixture.code=0.7",
                                    "data.mixture.web=0.3", "schedule.type=wsd"});
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  auto tc = parse_train_config(*cfg);
  ASSERT_TRUE(tc.is_ok()) << tc.status().to_string();
  EXPECT_EQ(tc->precision, Precision::kBf16);
  EXPECT_EQ(tc->model.n_layers, 2);
  EXPECT_EQ(tc->schedule.kind, ScheduleKind::kWsd);
  EXPECT_DOUBLE_EQ(tc->data.mixture.at("code"), 0.7);

  auto unknown = load_train_config("", {"model.n_layer=2"});
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().to_string().find("model.n_layers"), std::string::npos);

  struct Bad {
    const char* set;
    const char* key;
  } bads[] = {{"precision=fp8", "precision"},
              {"model.n_heads=3", "model.n_heads"},
              {"optimizer.betas=[0.9]", "optimizer.betas"},
              {"activation_checkpointing=some", "activation_checkpointing"},
              {"schedule.type=cosin", "schedule.type"},
              {"data.mixture.web=-1", "data.mixture.web"},
              {"loss_scale.hysteresis=0", "loss_scale.hysteresis"},
              {"optimizer.lr=-1", "optimizer.lr"}};
  for (const auto& b : bads) {
    auto c = load_train_config("", {b.set});
    ASSERT_TRUE(c.is_ok()) << b.set;
    auto t = parse_train_config(*c);
    ASSERT_FALSE(t.is_ok()) << b.set;
    EXPECT_EQ(t.status().code(), StatusCode::kConfig) << b.set;
    EXPECT_EQ(t.status().key(), b.key) << b.set << ": " << t.status().to_string();
  }
  auto c = load_train_config("", {"schedule.type=cosin"});
  EXPECT_NE(parse_train_config(*c).status().to_string().find("did you mean 'cosine'"),
            std::string::npos);
}

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
  EXPECT_TRUE(s.update(true));   // second backs off
  EXPECT_EQ(s.scale(), 512);
  EXPECT_TRUE(s.update(true));   // hysteresis stays spent until the next growth
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

TEST(MixtureControl, ParseValidateWriteRead) {
  auto ok = parse_mixture_json(R"({"weights": {"code": 3, "web": 1}})", "f");
  ASSERT_TRUE(ok.is_ok());
  EXPECT_DOUBLE_EQ(ok->normalised().at("code"), 0.75);
  const char* bad[] = {"", "[]", "{}", R"({"weights": 3})", R"({"weights": {"a": -1}})",
                       R"({"weights": {"a": "x"}})", R"({"weights": {"a": 0}})",
                       R"({"weights": {"a": 1e999}})"};
  for (const char* b : bad) EXPECT_FALSE(parse_mixture_json(b, "f").is_ok()) << b;
  auto unknown = parse_mixture_json(R"({"weights": {"cdoe": 1}})", "f", {"code", "web"});
  ASSERT_FALSE(unknown.is_ok());
  EXPECT_NE(unknown.status().to_string().find("did you mean 'code'"), std::string::npos);

  const std::string dir = temp_dir("mix");
  auto none = read_mixture(dir);
  ASSERT_TRUE(none.is_ok());
  EXPECT_FALSE(none->has_value());
  ASSERT_TRUE(write_mixture(dir, {{"code", 0.25}, {"web", 0.75}}).is_ok());
  auto back = read_mixture(dir);
  ASSERT_TRUE(back.is_ok() && back->has_value());
  EXPECT_DOUBLE_EQ((**back).at("web"), 0.75);
  EXPECT_FALSE(write_mixture(dir, {{"code", -1}}).is_ok());
  fs::remove_all(dir);
}

TEST(MixtureControl, WatcherAppliesOnceAndIgnoresBadContent) {
  const std::string dir = temp_dir("watch");
  MixtureWatcher w(dir, {"code", "web"});
  EXPECT_FALSE(w.poll().has_value());  // no file
  ASSERT_TRUE(write_file_atomic(mixture_path(dir), R"({"weights": {"code": 1}})").is_ok());
  auto first = w.poll();
  ASSERT_TRUE(first.has_value());
  EXPECT_EQ(first->size(), 1u);
  EXPECT_FALSE(w.poll().has_value());  // unchanged content is not re-applied
  ASSERT_TRUE(write_file_atomic(mixture_path(dir), "{not json").is_ok());
  EXPECT_FALSE(w.poll().has_value());
  EXPECT_FALSE(w.poll().has_value());
  EXPECT_EQ(w.rejected(), 1);  // logged once
  ASSERT_TRUE(write_file_atomic(mixture_path(dir), R"({"weights": {"nope": 1}})").is_ok());
  EXPECT_FALSE(w.poll().has_value());
  EXPECT_EQ(w.rejected(), 2);
  ASSERT_TRUE(write_file_atomic(mixture_path(dir), R"({"weights": {"web": 2, "code": 1}})").is_ok());
  auto second = w.poll();
  ASSERT_TRUE(second.has_value());
  EXPECT_DOUBLE_EQ(second->at("web"), 2.0);
  // A resumed watcher that knows the applied hash does not apply it again.
  MixtureWatcher resumed(dir, {"code", "web"});
  resumed.set_applied_hash(w.applied_hash());
  EXPECT_FALSE(resumed.poll().has_value());
  fs::remove_all(dir);
}

TEST(Safetensors, RoundTripAndValidation) {
  const std::string dir = temp_dir("st");
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {7, 8, 9};
  const std::string path = dir + "/t.safetensors";
  ASSERT_TRUE(write_safetensors(path, {{"a", "F32", {2, 3}, a.data(), 24}, {"b", "BF16", {3}, b.data(), 6}},
                                {{"format", "test"}})
                  .is_ok());
  auto f = SafetensorsFile::read(path);
  ASSERT_TRUE(f.is_ok()) << f.status().to_string();
  EXPECT_EQ(f->metadata().at("format"), "test");
  auto pa = f->get("a", "F32", {2, 3});
  ASSERT_TRUE(pa.is_ok());
  EXPECT_EQ(static_cast<const float*>(*pa)[5], 6.0f);
  EXPECT_FALSE(f->get("a", "F32", {3, 2}).is_ok());
  EXPECT_FALSE(f->get("c", "F32", {1}).is_ok());
  // Header length is 8-byte aligned; a truncated file is a data error.
  auto bytes = read_file(path);
  ASSERT_TRUE(bytes.is_ok());
  uint64_t n = 0;
  std::memcpy(&n, bytes->data(), 8);
  EXPECT_EQ(n % 8, 0u);
  ASSERT_TRUE(write_file_atomic(path, bytes->substr(0, bytes->size() - 4)).is_ok());
  auto trunc = SafetensorsFile::read(path);
  ASSERT_FALSE(trunc.is_ok());
  EXPECT_EQ(trunc.status().code(), StatusCode::kData);
  fs::remove_all(dir);
}

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
