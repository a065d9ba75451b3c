#include "common/config.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <fstream>

namespace kiln {
namespace {

constexpr const char* kDefaults = R"(
model:
  d_model: 256
  n_layers: 4
  init: gpt2
optimizer:
  lr: 3.0e-4
  clip_grad: 1.0
data:
  manifest: ""
  mixture: {}
run:
  steps: 100
  amp: true
)";

std::string write_temp(const std::string& text) {
  auto path =
      std::filesystem::temp_directory_path() /
      ("kiln_config_test_" + std::to_string(::testing::UnitTest::GetInstance()->random_seed()) +
       ::testing::UnitTest::GetInstance()->current_test_info()->name() + ".yaml");
  std::ofstream(path) << text;
  return path.string();
}

TEST(Config, DefaultsAndOverrides) {
  auto path = write_temp("model:\n  n_layers: 2\noptimizer:\n  lr: 1\n");
  auto cfg = Config::load(kDefaults, path, {"model.d_model=64", "run.steps=7"}, {"data.mixture"});
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  EXPECT_EQ(*cfg->get<int>("model.n_layers"), 2);
  EXPECT_EQ(*cfg->get<int>("model.d_model"), 64);
  EXPECT_EQ(*cfg->get<int>("run.steps"), 7);
  EXPECT_DOUBLE_EQ(*cfg->get<double>("optimizer.lr"), 1.0);  // int accepted for a float key
  EXPECT_EQ(*cfg->get<std::string>("model.init"), "gpt2");
}

TEST(Config, UnknownKeyNamesItWithSuggestion) {
  auto path = write_temp("model:\n  n_layer: 2\n");
  auto cfg = Config::load(kDefaults, path, {});
  ASSERT_FALSE(cfg.is_ok());
  EXPECT_EQ(cfg.status().code(), StatusCode::kConfig);
  EXPECT_EQ(cfg.status().key(), "model.n_layer");
  EXPECT_NE(cfg.status().to_string().find("did you mean 'model.n_layers'"), std::string::npos)
      << cfg.status().to_string();
  EXPECT_EQ(cfg.status().exit_code(), 2);
}

TEST(Config, UnknownSetKeyAndWrongType) {
  auto a = Config::load(kDefaults, "", {"optimizer.lrr=2"});
  ASSERT_FALSE(a.is_ok());
  EXPECT_EQ(a.status().key(), "optimizer.lrr");
  auto b = Config::load(kDefaults, "", {"model.d_model=big"});
  ASSERT_FALSE(b.is_ok());
  EXPECT_EQ(b.status().key(), "model.d_model");
  auto c = Config::load(kDefaults, "", {"run.amp=3"});
  ASSERT_FALSE(c.is_ok());
  auto d = Config::load(kDefaults, "", {"model=3"});
  ASSERT_FALSE(d.is_ok());
}

TEST(Config, OpenPathsAcceptAnyChildKeys) {
  auto cfg = Config::load(kDefaults, "", {"data.mixture.code=0.3", "data.mixture.web=0.7"},
                          {"data.mixture"});
  ASSERT_TRUE(cfg.is_ok()) << cfg.status().to_string();
  EXPECT_DOUBLE_EQ(*cfg->get<double>("data.mixture.code"), 0.3);
}

// YAML's explicit keys can be lists, mappings or empty: a config error naming the file and line,
// at the top, under a section and under a free-form section (the fuzzer's train_config finding:
// an uncaught yaml-cpp exception aborted kiln train).
TEST(Config, KeysThatAreNotNamesAreConfigErrors) {
  for (const std::string& text :
       {std::string("? [a, b]\n: 1\n"), std::string("model:\n  ? {d_model: 1}\n  : 2\n"),
        std::string("data:\n  mixture:\n    ? [web]\n    : 0.5\n"), std::string("?\n")}) {
    SCOPED_TRACE(text);
    auto path = write_temp(text);
    auto cfg = Config::load(kDefaults, path, {}, {"data.mixture"});
    ASSERT_FALSE(cfg.is_ok());
    EXPECT_EQ(cfg.status().code(), StatusCode::kConfig);
    EXPECT_EQ(cfg.status().file(), path);
    EXPECT_NE(cfg.status().message().find("a key must be a name"), std::string::npos)
        << cfg.status().to_string();
  }
  // --set builds its mapping from names, and free-form children merge as before.
  auto ok = Config::load(kDefaults, write_temp("data:\n  mixture:\n    web: 0.5\n"), {},
                         {"data.mixture"});
  ASSERT_TRUE(ok.is_ok()) << ok.status().to_string();
}

TEST(Config, InvalidYamlNamesFileAndLine) {
  auto path = write_temp("model:\n  d_model: [1, 2\n");
  auto cfg = Config::load(kDefaults, path, {});
  ASSERT_FALSE(cfg.is_ok());
  EXPECT_EQ(cfg.status().file(), path);
  EXPECT_GT(cfg.status().line(), 0);
}

TEST(EditDistance, ClosestMatch) {
  EXPECT_EQ(edit_distance("kitten", "sitting"), 3u);
  EXPECT_EQ(closest_match("n_layer", {"n_layers", "d_model"}), "n_layers");
  EXPECT_EQ(closest_match("zzzzzz", {"n_layers", "d_model"}), "");
}

}  // namespace
}  // namespace kiln
