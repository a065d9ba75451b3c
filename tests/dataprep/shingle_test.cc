#include "dataprep/dedup/shingle.h"

#include <gtest/gtest.h>

#include "common/hash.h"

namespace kiln::prep {
namespace {

std::vector<std::string> units_of(const std::string& s) {
  std::vector<UnitSpan> u;
  shingle_units(s, &u);
  std::vector<std::string> out;
  for (auto x : u) out.push_back(s.substr(x.begin, x.end - x.begin));
  return out;
}

TEST(Shingle, WordsAndCjkCharacters) {
  EXPECT_EQ(units_of("the quick fox"), (std::vector<std::string>{"the", "quick", "fox"}));
  // 中文abc 字 -> 中, 文, abc, 字
  EXPECT_EQ(units_of("\xE4\xB8\xAD\xE6\x96\x87"
                     "abc \xE5\xAD\x97"),
            (std::vector<std::string>{"\xE4\xB8\xAD", "\xE6\x96\x87", "abc", "\xE5\xAD\x97"}));
  // Non-CJK non-ASCII letters stay inside words.
  EXPECT_EQ(units_of("caf\xC3\xA9 na\xC3\xAFve"),
            (std::vector<std::string>{"caf\xC3\xA9", "na\xC3\xAFve"}));
  EXPECT_TRUE(is_spaceless_script(0x4E2D));
  EXPECT_TRUE(is_spaceless_script(0x3042));   // Hiragana
  EXPECT_TRUE(is_spaceless_script(0x0E01));   // Thai
  EXPECT_FALSE(is_spaceless_script(0xAC00));  // Hangul uses spaces
  EXPECT_FALSE(is_spaceless_script('a'));
}

TEST(Shingle, CountsAndHashes) {
  std::vector<uint64_t> h;
  shingle_hashes("a b c d e f g", 5, &h);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0], xxh3_64(std::string_view("a b c d e")));
  EXPECT_EQ(h[2], xxh3_64(std::string_view("c d e f g")));
  shingle_hashes("a b", 5, &h);  // shorter than n: one shingle of everything
  ASSERT_EQ(h.size(), 1u);
  EXPECT_EQ(h[0], xxh3_64(std::string_view("a b")));
  shingle_hashes("", 5, &h);
  EXPECT_TRUE(h.empty());
  // "a b" and "ab" differ.
  std::vector<uint64_t> h2;
  shingle_hashes("ab", 5, &h2);
  EXPECT_NE(h[0], 0u);
  shingle_hashes("a b", 1, &h);
  EXPECT_EQ(h.size(), 2u);
  // CJK: character 3-grams over 5 characters -> 3 shingles.
  shingle_hashes("\xE4\xB8\x80\xE4\xBA\x8C\xE4\xB8\x89\xE5\x9B\x9B\xE4\xBA\x94", 3, &h);
  ASSERT_EQ(h.size(), 3u);
  EXPECT_EQ(h[0], xxh3_64(std::string_view("\xE4\xB8\x80\xE4\xBA\x8C\xE4\xB8\x89")));
}

}  // namespace
}  // namespace kiln::prep
