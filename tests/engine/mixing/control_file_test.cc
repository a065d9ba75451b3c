// RUN/control/mixture.json: parse, validate, write, read; the watcher applies a change once.
#include "engine/mixing/control_file.h"

#include <gtest/gtest.h>

#include <filesystem>
#include <string>

#include "common/atomic_file.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {
namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  std::string p = test::temp_dir("control_file_test", name);
  fs::create_directories(p);
  return p;
}

TEST(MixtureControl, ParseValidateWriteRead) {
  auto ok = parse_mixture_json(R"({"weights": {"code": 3, "web": 1}})", "f");
  ASSERT_TRUE(ok.is_ok());
  EXPECT_DOUBLE_EQ(ok->normalised().at("code"), 0.75);
  const char* bad[] = {"",
                       "[]",
                       "{}",
                       R"({"weights": 3})",
                       R"({"weights": {"a": -1}})",
                       R"({"weights": {"a": "x"}})",
                       R"({"weights": {"a": 0}})",
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
  ASSERT_TRUE(
      write_file_atomic(mixture_path(dir), R"({"weights": {"web": 2, "code": 1}})").is_ok());
  auto second = w.poll();
  ASSERT_TRUE(second.has_value());
  EXPECT_DOUBLE_EQ(second->at("web"), 2.0);
  // A resumed watcher that knows the applied hash does not apply it again.
  MixtureWatcher resumed(dir, {"code", "web"});
  resumed.set_applied_hash(w.applied_hash());
  EXPECT_FALSE(resumed.poll().has_value());
  fs::remove_all(dir);
}

}  // namespace
}  // namespace kiln::engine
