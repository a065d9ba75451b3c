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

// The one grammar of sizes in configs and flags (kiln plan --memory-per-device, prep's memory
// and --shard-bytes, --max-bytes, ...): binary units with or without iB/B, decimals, exponents.
TEST(Text, ParseByteSize) {
  EXPECT_EQ(*parse_byte_size("80GiB"), 80ull << 30);
  EXPECT_EQ(*parse_byte_size("16 GB"), 16ull << 30);
  EXPECT_EQ(*parse_byte_size("512MiB"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("512m"), 512ull << 20);
  EXPECT_EQ(*parse_byte_size("1.5G"), 3ull << 29);
  EXPECT_EQ(*parse_byte_size("1e9"), 1000000000ull);
  EXPECT_EQ(*parse_byte_size("2k"), 2048ull);
  EXPECT_EQ(*parse_byte_size("100"), 100ull);
  EXPECT_EQ(*parse_byte_size("100B"), 100ull);
  EXPECT_EQ(*parse_byte_size("0"), 0ull);
  EXPECT_EQ(*parse_byte_size("1T"), 1ull << 40);
  EXPECT_EQ(*parse_byte_size("18446744073709551615"), UINT64_MAX);  // integers stay exact
  EXPECT_EQ(*parse_byte_size("9007199254740993"), 9007199254740993ull);
  EXPECT_FALSE(parse_byte_size("18446744073709551616").is_ok());
  EXPECT_FALSE(parse_byte_size("16777216T").is_ok());
  for (const char* bad : {"", "lots", "3 parsecs", "-1G", "12Q", "1.5GiBs", "nan", "inf", "0x10",
                          "1e", "5iB", "99999999999T"}) {
    auto r = parse_byte_size(bad);
    EXPECT_FALSE(r.is_ok()) << bad;
    if (!r.is_ok()) {
      EXPECT_EQ(r.status().code(), StatusCode::kUsage) << bad;
      EXPECT_NE(r.status().message().find(std::string("'") + bad + "'"), std::string::npos)
          << r.status().message();
    }
  }
}

TEST(Text, BytesInOneUnit) {
  EXPECT_EQ(bytes_in(3 << 20, ByteUnit::kMiB), "3.0 MiB");
  EXPECT_EQ(bytes_in(1536, ByteUnit::kKiB), "1.5 KiB");
  EXPECT_EQ(bytes_in(150ull << 30, ByteUnit::kGiB, 2), "150.00 GiB");
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
