// The spaCy English tokenizer and Sentencizer (dataprep/filter/spacy_en.h): cases whose tokens
// were taken from spaCy 3.8's algorithm on spaCy's rule data (the pure-Python port of
// ../shared/peers/datatrove, which passes spaCy's own tokenizer tests), the memo changing
// nothing, hostile runs that stay linear, and a serving mode through which
// tests/dataprep/filter_spacy_tests.py runs spaCy's own English tokenizer tests against this
// code (KILN_SPACY_SERVE=1: length-prefixed texts on stdin, tokens on stdout).
#include <gtest/gtest.h>

#include <chrono>
#include <cstdlib>
#include <iostream>
#include <random>
#include <string>
#include <vector>

#include "dataprep/filter/spacy_en.h"

namespace kiln::prep::filter::spacy {
namespace {

struct Case {
  const char* text;
  const char* tokens;  // tokens separated by \037, \036 after a token with a trailing space
  std::vector<uint32_t> starts;
};

// clang-format off
const Case kCases[] = {
    {"I don't know.", "I\036\037do\037n't\036\037know\037.", {0}},
    {"Mr. Smith went to Washington, D.C. on Jan. 5th.", "Mr.\036\037Smith\036\037went\036\037to\036\037Washington\037,\036\037D.C.\036\037on\036\037Jan.\036\0375th\037.", {0}},
    {"It's 10:30 a.m. now!", "It\037's\036\03710:30\036\037a.m.\036\037now\037!", {0}},
    {"Visit https://www.example.com/path\077q=1 today.", "Visit\036\037https://www.example.com/path\077q=1\036\037today\037.", {0}},
    {"email foo.bar@baz.org, please", "email\036\037foo.bar@baz.org\037,\036\037please", {0}},
    {":) :-( <3 ^_^", ":)\036\037:-(\036\037<3\036\037^_^", {0}},
    {"I/O a-b x[edit] ===== ** --", "I\037/\037O\036\037a\037-\037b\036\037x[edit\037]\036\037=\037=\037=\037=\037=\036\037*\037*\036\037--", {0}},
    {"10km 5kg $5.00 US$10 100% 20\302\260C.", "10\037km\036\0375\037kg\036\037$\0375.00\036\037US$\03710\036\037100\037%\036\03720\037\302\260\037C\037.", {0}},
    {"can't won't gonna y'all o'clock", "ca\037n't\036\037wo\037n't\036\037gon\037na\036\037y'\037all\036\037o'clock", {0}},
    {"Hello world!!! Isn't it great\077\077\077", "Hello\036\037world\037!\037!\037!\036\037Is\037n't\036\037it\036\037great\037\077\037\077\037\077", {0, 5}},
    {"\"Yes,\" she said. (Really.)", "\"\037Yes\037,\037\"\036\037she\036\037said\037.\036\037(\037Really\037.\037)", {0, 8}},
    {"e.g. i.e. etc. U.S. U.K.'s", "e.g.\036\037i.e.\036\037etc\037.\036\037U.S.\036\037U.K.\037's", {0, 4}},
    {"a  b\012\012c\011 d ", "a\036\037 \037b\037\012\012\037c\037\011 \037d\036", {0}},
    {" leading", " \037leading", {0}},
    {"trailing ", "trailing\036", {0}},
    {"state-of-the-art and/or he/she", "state\037-\037of\037-\037the\037-\037art\036\037and/or\036\037he\037/\037she", {0}},
    {"\342\200\246wait\342\200\246 what\077!", "\342\200\246\037wait\037\342\200\246\036\037what\037\077\037!", {0}},
    {"(a) 1) [1] {x}", "(\037a\037)\036\0371\037)\036\037[\0371\037]\036\037{\037x\037}", {0}},
    {"na\303\257ve caf\303\251 \342\200\224 r\303\251sum\303\251 \342\200\223 ok", "na\303\257ve\036\037caf\303\251\036\037\342\200\224\036\037r\303\251sum\303\251\036\037\342\200\223\036\037ok", {0}},
    {"We're 'quoted' \342\200\230curly\342\200\231 \342\200\234double\342\200\235.", "We\037're\036\037'\037quoted\037'\036\037\342\200\230\037curly\037\342\200\231\036\037\342\200\234\037double\037\342\200\235\037.", {0}},
    {"Don\342\200\231t you\342\200\231re", "Do\037n\342\200\231t\036\037you\037\342\200\231re", {0}},
    {"This is a sentence. This is another one... And a third\077 Yes! Dr. Who.", "This\036\037is\036\037a\036\037sentence\037.\036\037This\036\037is\036\037another\036\037one\037...\036\037And\036\037a\036\037third\037\077\036\037Yes\037!\036\037Dr.\036\037Who\037.", {0, 5, 14, 16}},
    {"3.14 1,000 1+2=3 2-3 4*5 6^7", "3.14\036\0371,000\036\0371\037+\0372=3\036\0372\037-\0373\036\0374\037*\0375\036\0376\037^\0377", {0}},
};
// clang-format on

std::string render(std::string_view text, const std::vector<Token>& toks) {
  std::string out;
  for (size_t i = 0; i < toks.size(); ++i) {
    if (i) out += '\037';
    out.append(text.substr(toks[i].begin, toks[i].end - toks[i].begin));
    if (toks[i].space_after) out += '\036';
  }
  return out;
}

TEST(SpacyEnglish, TokensAndSentencesAsSpacy) {
  std::vector<Token> toks;
  std::vector<uint32_t> starts;
  for (const Case& c : kCases) {
    tokenize(c.text, &toks);
    EXPECT_EQ(render(c.text, toks), c.tokens) << c.text;
    sentence_starts(c.text, toks, &starts);
    EXPECT_EQ(starts, c.starts) << c.text;
  }
}

TEST(SpacyEnglish, SpecialCasesAndAffixes) {
  std::vector<Token> toks;
  auto words = [&](const std::string& s) {
    tokenize(s, &toks);
    std::vector<std::string> w;
    for (const Token& t : toks) w.emplace_back(s.substr(t.begin, t.end - t.begin));
    return w;
  };
  using V = std::vector<std::string>;
  EXPECT_EQ(words("don't"), (V{"do", "n't"}));
  EXPECT_EQ(words("(don't)"), (V{"(", "do", "n't", ")"}));
  EXPECT_EQ(words("U.S."), (V{"U.S."}));
  EXPECT_EQ(words(":)"), (V{":)"}));
  EXPECT_EQ(words("====="), (V{"=", "=", "=", "=", "="}));
  EXPECT_EQ(words("a-b"), (V{"a", "-", "b"}));
  EXPECT_EQ(words("I/O"), (V{"I", "/", "O"}));
  EXPECT_EQ(words("x[edit]"), (V{"x[edit", "]"}));  // (spaCy splits only the final bracket)
  EXPECT_EQ(words("10km"), (V{"10", "km"}));
  EXPECT_EQ(words("www.example.com"), (V{"www.example.com"}));
  EXPECT_EQ(words(""), V{});
}

// The per-thread memo of runs is speed only: the same tokens with it off, on random text made
// of the pieces the rules care about.
TEST(SpacyEnglish, MemoChangesNothing) {
  const char* pieces[] = {"a",
                          "B",
                          "0",
                          " ",
                          "  ",
                          "\n",
                          ".",
                          ",",
                          "'",
                          "\"",
                          "(",
                          ")",
                          "-",
                          "/",
                          ":",
                          "n't",
                          "'s",
                          "http://",
                          ".com",
                          "a.m.",
                          "U.S.",
                          ":)",
                          "km",
                          "$",
                          "\xe2\x80\xa6",
                          "\xe3\x80\x82",
                          "\xc3\xa9",
                          "\xe2\x80\x99",
                          "..."};
  std::mt19937 rng(5);
  std::vector<Token> a, b;
  for (int d = 0; d < 3000; ++d) {
    std::string s;
    const int n = 1 + static_cast<int>(rng() % 40);
    for (int k = 0; k < n; ++k) s += pieces[rng() % std::size(pieces)];
    set_memo(true);
    tokenize(s, &a);
    tokenize(s, &a);  // (the second time from the memo)
    set_memo(false);
    tokenize(s, &b);
    set_memo(true);
    ASSERT_EQ(render(s, a), render(s, b)) << s;
  }
}

// Runs that make spaCy's suffix loop quadratic stay linear here (a 1 MB run of ')' and of
// '.'), and a long URL-like run stops at the match limit; the tokens cover the text.
TEST(SpacyEnglish, HostileRunsAreBounded) {
  for (const std::string s : {std::string(1 << 20, ')'), std::string(1 << 20, '.'),
                              "http://" + std::string(1 << 18, ':') + "x",
                              std::string(1 << 19, 'a') + std::string(1 << 19, ':')}) {
    const auto t0 = std::chrono::steady_clock::now();
    std::vector<Token> toks;
    tokenize(s, &toks);
    const double secs =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    EXPECT_LT(secs, 30.0) << s.substr(0, 20);
    uint64_t covered = 0;
    for (const Token& t : toks) covered += t.end - t.begin;
    EXPECT_EQ(covered, s.size());
  }
}

// KILN_SPACY_SERVE=1: reads "<bytes>\n<text>" records from stdin, writes "<bytes>\n" then the
// tokens (render()) and "\035" and the sentence starts, comma-separated, for each.
TEST(SpacyEnglish, Serve) {
  if (!std::getenv("KILN_SPACY_SERVE")) GTEST_SKIP() << "serving mode for filter_spacy_tests.py";
  std::string len;
  std::vector<Token> toks;
  std::vector<uint32_t> starts;
  while (std::getline(std::cin, len)) {
    std::string text(std::stoul(len), '\0');
    std::cin.read(text.data(), static_cast<std::streamsize>(text.size()));
    tokenize(text, &toks);
    sentence_starts(text, toks, &starts);
    std::string out = render(text, toks) + "\035";
    for (uint32_t s : starts) out += std::to_string(s) + ",";
    std::cout << out.size() << "\n" << out << std::flush;
  }
}

}  // namespace
}  // namespace kiln::prep::filter::spacy
