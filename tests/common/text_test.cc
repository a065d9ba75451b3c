// common/text.h: human_bytes and the JSON string writer (byte-identical to nlohmann's dump).
#include "common/text.h"

#include <gtest/gtest.h>
#include <nlohmann/json.hpp>

#include <string>

namespace kiln {
namespace {

TEST(Text, HumanBytes) {
  EXPECT_EQ(human_bytes(0), "0 B");
  EXPECT_EQ(human_bytes(1023), "1023 B");
  EXPECT_EQ(human_bytes(1024), "1.0 KiB");
  EXPECT_EQ(human_bytes(1536), "1.5 KiB");
  EXPECT_EQ(human_bytes(uint64_t{3} << 20), "3.0 MiB");
  EXPECT_EQ(human_bytes(uint64_t{5} << 40), "5.0 TiB");
  EXPECT_EQ(human_bytes(uint64_t{2048} << 40), "2048.0 TiB");
}

TEST(Text, JsonStringMatchesNlohmannForEveryAsciiByteAndUtf8) {
  std::string all;
  for (int c = 1; c < 0x80; ++c) all.push_back(static_cast<char>(c));
  all += "\xc3\xa9 \xe4\xb8\xad \xf0\x9f\x98\x80";  // é 中 😀
  for (const std::string& s : {std::string(), all, std::string("plain"), std::string(1, '\0')}) {
    std::string mine;
    append_json_string(&mine, s);
    EXPECT_EQ(mine, nlohmann::json(s).dump()) << s.size();
  }
  std::string appended = "x=";
  append_json_string(&appended, "a\"b");
  EXPECT_EQ(appended, "x=\"a\\\"b\"");
}

}  // namespace
}  // namespace kiln
