#include "dataprep/dedup/normalise.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kiln::prep {
namespace {

std::string norm(const std::string& s, bool strip = false) {
  std::string out;
  normalise_for_dedup(s, NormaliseOptions{strip}, &out);
  return out;
}

TEST(Normalise, AsciiCaseAndWhitespace) {
  EXPECT_EQ(norm("  Hello   WORLD\t\n foo  "), "hello world foo");
  EXPECT_EQ(norm(""), "");
  EXPECT_EQ(norm(" \t\r\n "), "");
  EXPECT_EQ(norm("a\r\nb"), "a b");
}

TEST(Normalise, NfkcAndCaseFolding) {
  EXPECT_EQ(norm("\xEF\xBD\x86\xEF\xBD\x95\xEF\xBD\x8C\xEF\xBD\x8C"), "full");  // fullwidth
  EXPECT_EQ(norm("\xEF\xAC\x81le"), "file");                                    // fi ligature
  EXPECT_EQ(norm("Stra\xC3\x9F"
                 "e"),
            "strasse");                                       // sharp s folds
  EXPECT_EQ(norm("Cafe\xCC\x81"), "caf\xC3\xA9");             // composed
  EXPECT_EQ(norm("\xC3\x89T\xC3\x89"), "\xC3\xA9t\xC3\xA9");  // ÉTÉ -> été
}

TEST(Normalise, UnicodeSpacesCollapse) {
  EXPECT_EQ(norm("a\xC2\xA0\xC2\xA0"
                 "b"),
            "a b");                                                                      // NBSP
  EXPECT_EQ(norm("\xE4\xBD\xA0\xE3\x80\x80\xE5\xA5\xBD"), "\xE4\xBD\xA0 \xE5\xA5\xBD");  // U+3000
  EXPECT_EQ(norm("x\xE2\x80\xA8y"), "x y");  // line separator
}

TEST(Normalise, IgnorablesRemoved) {
  EXPECT_EQ(norm("co\xC2\xADoperate"), "cooperate");      // soft hyphen
  EXPECT_EQ(norm("zero\xE2\x80\x8Bwidth"), "zerowidth");  // ZWSP
}

TEST(Normalise, StripPunctuation) {
  EXPECT_EQ(norm("Hello, world! (ok)", true), "hello world ok");
  EXPECT_EQ(norm("Hello, world!", false), "hello, world!");
  EXPECT_EQ(norm("a - b", true), "a b");
  EXPECT_EQ(norm("1+1=2 $5", true), "1+1=2 $5");  // symbols are not punctuation
  // Chinese full stop and comma.
  EXPECT_EQ(norm("\xE4\xBD\xA0\xE5\xA5\xBD\xEF\xBC\x8C\xE4\xB8\x96\xE7\x95\x8C\xE3\x80\x82", true),
            "\xE4\xBD\xA0\xE5\xA5\xBD\xE4\xB8\x96\xE7\x95\x8C");
}

TEST(Normalise, FastPathEqualsReference) {
  const std::vector<std::string> pool = {
      "a", "B", "z", "Q", " ", "  ", "\t", "\n", ",", ".", "!", "'", "-", "(", "$", "1", "\xC3\xA9",
      "\xC3\x89", "e\xCC\x81", "\xCC\x81", "\xC2\xA0", "\xE3\x80\x80", "\xE4\xBD\xA0",
      "\xE5\xA5\xBD", "\xEF\xBC\x8C", "\xEF\xBD\x86", "\xEF\xAC\x81", "\xC3\x9F", "\xC2\xAD",
      "\xE2\x80\x8B", "\xCE\xA3", "\xD0\x96", "\xF0\x9F\x98\x80", "\xE2\x84\xAB", "\xE2\x80\xA8",
      // table-free path: Latin-1, kana (voiced, combining mark), Hangul, CJK punctuation,
      // fullwidth letters/punctuation, halfwidth katakana, multiplication sign, y-diaeresis
      "\xC3\x80", "\xC3\x9E", "\xC3\x97", "\xC3\xBF", "\xC3\xB7", "\xE3\x81\x8C", "\xE3\x81\x8B",
      "\xE3\x82\x99", "\xE3\x82\x9B", "\xEA\xB0\x80", "\xE1\x86\xA8", "\xE3\x80\x81",
      "\xE3\x80\x82", "\xEF\xBC\xA1", "\xEF\xBC\x81", "\xEF\xBD\xB6", "\xE3\x83\xBB",
      "\xE4\xB8\x80", "\xEF\xA4\x80", "\xC2\xB5", "\xE3\x8C\x80"};
  std::mt19937 rng(7);
  for (int strip = 0; strip < 2; ++strip) {
    for (int iter = 0; iter < 20000; ++iter) {
      std::string s;
      int n = static_cast<int>(rng() % 40);
      for (int i = 0; i < n; ++i) s += pool[rng() % pool.size()];
      NormaliseOptions opt{strip == 1};
      std::string fast;
      normalise_for_dedup(s, opt, &fast);
      ASSERT_EQ(fast, normalise_for_dedup_reference(s, opt)) << "input: " << s;
    }
  }
}

// Long, mostly ASCII texts exercise the 64-byte vector path and its hand-over to the scalar one.
TEST(Normalise, LongAsciiTextsEqualReference) {
  const std::vector<std::string> pool = {"Word",
                                         "the",
                                         "QUICK",
                                         "x",
                                         " ",
                                         " ",
                                         "  ",
                                         "\t",
                                         "\n ",
                                         ",",
                                         ".",
                                         "e\xCC\x81",
                                         "caf\xC3\xA9",
                                         "\xE4\xBD\xA0",
                                         "\xEF\xBC\x8C",
                                         "\xC2\xA0",
                                         "0123456789abcdefghij",
                                         "ABCDEFGHIJKLMNOPQRSTUVWXYZ_abcdefghijklmnopqrstuvwxyz"};
  std::mt19937 rng(11);
  for (int iter = 0; iter < 3000; ++iter) {
    std::string s;
    int n = static_cast<int>(rng() % 200);
    for (int i = 0; i < n; ++i) {
      size_t k = rng() % pool.size();
      if (k >= 11 && k <= 15 && rng() % 8) k = rng() % 11;  // non-ASCII is rarer
      s += pool[k];
    }
    for (int strip = 0; strip < 2; ++strip) {
      NormaliseOptions opt{strip == 1};
      std::string fast;
      normalise_for_dedup(s, opt, &fast);
      ASSERT_EQ(fast, normalise_for_dedup_reference(s, opt)) << "input: " << s;
    }
  }
}

}  // namespace
}  // namespace kiln::prep
