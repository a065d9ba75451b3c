// The `kiln train` config schema: defaults, --set overrides, errors naming the key.
#include "engine/train/train_config.h"

#include <gtest/gtest.h>

#include <string>

namespace kiln::engine {
namespace {
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

}  // namespace
}  // namespace kiln::engine
