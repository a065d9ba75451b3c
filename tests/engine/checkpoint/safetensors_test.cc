// safetensors files: round trip and validation of what is read.
#include "engine/checkpoint/safetensors.h"

#include <gtest/gtest.h>

#include <cstring>
#include <filesystem>
#include <string>

#include "common/atomic_file.h"
#include "tests/engine/engine_test_util.h"

namespace kiln::engine {
namespace {
namespace fs = std::filesystem;

std::string temp_dir(const std::string& name) {
  std::string p = test::temp_dir("safetensors_test", name);
  fs::create_directories(p);
  return p;
}

TEST(Safetensors, RoundTripAndValidation) {
  const std::string dir = temp_dir("st");
  std::vector<float> a = {1, 2, 3, 4, 5, 6};
  std::vector<uint16_t> b = {7, 8, 9};
  const std::string path = dir + "/t.safetensors";
  ASSERT_TRUE(
      write_safetensors(path, {{"a", "F32", {2, 3}, a.data(), 24}, {"b", "BF16", {3}, b.data(), 6}},
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

}  // namespace
}  // namespace kiln::engine
