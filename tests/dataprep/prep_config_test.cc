#include "dataprep/prep_config.h"

#include <gtest/gtest.h>
#include <yaml-cpp/yaml.h>

#include <functional>

#include "tests/test_paths.h"

namespace kiln::prep {
namespace {

// configs/prep/default.yaml documents exactly the built-in defaults.
TEST(PrepConfig, DocumentedDefaultsEqualBuiltIn) {
  YAML::Node file =
      YAML::LoadFile(std::string(kiln::test::source_dir()) + "/configs/prep/default.yaml");
  YAML::Node built = YAML::Load(kPrepDefaultsYaml);
  std::function<void(const YAML::Node&, const YAML::Node&, const std::string&)> same =
      [&](const YAML::Node& a, const YAML::Node& b, const std::string& path) {
        ASSERT_EQ(a.Type(), b.Type()) << path;
        if (a.IsMap()) {
          ASSERT_EQ(a.size(), b.size()) << path;
          for (const auto& kv : a) {
            std::string k = kv.first.as<std::string>();
            ASSERT_TRUE(b[k]) << "missing " << path + "." + k;
            same(kv.second, b[k], path + "." + k);
          }
        } else if (a.IsScalar()) {
          EXPECT_EQ(a.Scalar(), b.Scalar()) << path;
        } else if (a.IsSequence()) {
          EXPECT_EQ(a.size(), b.size()) << path;
        }
      };
  same(file, built, "");
}

TEST(PrepConfig, ValidatesAndResolvesLsh) {
  auto c = Config::load(kPrepDefaultsYaml, "", {});
  ASSERT_TRUE(c.is_ok());
  auto o = prep_options_from_config(*c);
  ASSERT_TRUE(o.is_ok()) << o.status().to_string();
  EXPECT_EQ(o->lsh.bands, 16);
  EXPECT_EQ(o->lsh.rows, 8);
  EXPECT_EQ(o->memory_bytes, uint64_t{2} << 30);
  auto bad = [](std::vector<std::string> sets, const std::string& key) {
    auto c = Config::load(kPrepDefaultsYaml, "", sets);
    if (!c.is_ok()) return c.status().key() == key;
    auto o = prep_options_from_config(*c);
    EXPECT_FALSE(o.is_ok());
    return !o.is_ok() && o.status().key() == key && o.status().exit_code() == 2;
  };
  EXPECT_TRUE(bad({"dedup.threshold=1.5"}, "dedup.threshold"));
  EXPECT_TRUE(bad({"dedup.bands=20", "dedup.rows=10"}, "dedup.bands"));
  EXPECT_TRUE(bad({"dedup.bands=4"}, "dedup.rows"));
  EXPECT_TRUE(bad({"memory=lots"}, "memory"));
  EXPECT_TRUE(bad({"input.utf8=drop"}, "input.utf8"));
  EXPECT_TRUE(bad({"shards.compression=gzip"}, "shards.compression"));
  auto ok = Config::load(kPrepDefaultsYaml, "", {"dedup.bands=20", "dedup.rows=6"});
  auto o2 = prep_options_from_config(*ok);
  ASSERT_TRUE(o2.is_ok());
  EXPECT_TRUE(o2->lsh_explicit);
  EXPECT_EQ(o2->lsh.bands, 20);
}

}  // namespace
}  // namespace kiln::prep
