// The quality filters' text units (dataprep/filter/text.h) on mixed text: the fast paths (eight
// ASCII bytes decoded at a time, the line splitter's skip of ordinary code points, counts on the
// UTF-8 bytes) against plain per-code-point definitions written here.
#include <gtest/gtest.h>

#include <algorithm>
#include <random>
#include <string>
#include <vector>

#include "dataprep/filter/text.h"

namespace kiln::prep::filter {
namespace {

// Random valid UTF-8 mixing ASCII runs of every length (across the 8-byte chunks), 2-, 3- and
// 4-byte characters, and every str.splitlines() break.
std::string mixed_text(std::mt19937_64& rng) {
  static const char32_t kOther[] = {0xE9,   0x85,   0xA0,    0x2028,  0x2029, 0x4E2D, 0x3002,
                                    0x212A, 0xFF01, 0x1F600, 0x20000, 0x1C,   0x1D,   0x1E,
                                    '\r',   '\n',   0x0B,    0x0C,    0x1F,   0x7F,   0x80};
  std::uniform_int_distribution<int> run(0, 20), kind(0, 3);
  std::string s;
  const int parts = run(rng);
  for (int p = 0; p < parts; ++p) {
    if (kind(rng) != 0) {
      for (int k = run(rng); k > 0; --k) s += static_cast<char>(' ' + (rng() % 95));
    } else {
      append_utf8(kOther[rng() % std::size(kOther)], &s);
      if (rng() % 4 == 0) s += "\r\n";
    }
  }
  return s;
}

// UTF-8 decoded one code point at a time (valid input).
std::vector<char32_t> plain_decode(const std::string& s, std::vector<uint32_t>* at) {
  std::vector<char32_t> out;
  at->clear();
  for (size_t i = 0; i < s.size();) {
    const auto b = static_cast<uint8_t>(s[i]);
    const int n = b < 0x80 ? 1 : b < 0xE0 ? 2 : b < 0xF0 ? 3 : 4;
    char32_t c = n == 1 ? b : n == 2 ? b & 0x1F : n == 3 ? b & 0x0F : b & 0x07;
    for (int k = 1; k < n; ++k) c = (c << 6) | (static_cast<uint8_t>(s[i + k]) & 0x3F);
    at->push_back(static_cast<uint32_t>(i));
    out.push_back(c);
    i += n;
  }
  at->push_back(static_cast<uint32_t>(s.size()));
  return out;
}

// str.splitlines(), one code point at a time.
std::vector<Span> plain_splitlines(const CodePoints& t) {
  auto brk = [](char32_t c) {
    return (c >= 0x0A && c <= 0x0D) || (c >= 0x1C && c <= 0x1E) || c == 0x85 || c == 0x2028 ||
           c == 0x2029;
  };
  std::vector<Span> out;
  uint32_t start = 0;
  for (uint32_t i = 0; i < t.size(); ++i) {
    if (!brk(t[i])) continue;
    out.push_back({start, i});
    if (t[i] == '\r' && i + 1 < t.size() && t[i + 1] == '\n') ++i;
    start = i + 1;
  }
  if (start < t.size()) out.push_back({start, static_cast<uint32_t>(t.size())});
  return out;
}

TEST(FilterText, FastPathsMatchPlainDefinitionsOnMixedText) {
  std::mt19937_64 rng(29);
  int with_ascii_chunks = 0, with_other = 0;
  for (int trial = 0; trial < 3000; ++trial) {
    const std::string s = mixed_text(rng);
    std::vector<uint32_t> want_at;
    const std::vector<char32_t> want = plain_decode(s, &want_at);
    CodePoints cp;
    Offsets at;
    decode_utf8(s, &cp, &at);
    ASSERT_EQ(std::vector<char32_t>(cp.begin(), cp.end()), want) << s;
    ASSERT_EQ(std::vector<uint32_t>(at.begin(), at.end()), want_at) << s;
    size_t run = 0, longest = 0;  // the longest ASCII run: the 8-byte path decodes it
    for (char c : s)
      longest = std::max(longest, run = static_cast<uint8_t>(c) < 0x80 ? run + 1 : 0);
    with_ascii_chunks += longest >= 16;
    with_other += cp.size() < s.size();

    std::vector<Span> lines;
    split_lines(cp, {0, static_cast<uint32_t>(cp.size())}, &lines);
    const std::vector<Span> want_lines = plain_splitlines(cp);
    ASSERT_EQ(lines.size(), want_lines.size()) << s;
    for (size_t i = 0; i < lines.size(); ++i) {
      EXPECT_EQ(lines[i].begin, want_lines[i].begin) << s;
      EXPECT_EQ(lines[i].end, want_lines[i].end) << s;
    }

    const Span all{0, static_cast<uint32_t>(cp.size())};
    for (const char32_t* needle : {U"\n", U"#", U"...", U"\u2026", U"\u4e2d\u3002", U"\r\n"}) {
      std::string utf8;
      for (const char32_t* c = needle; *c; ++c) append_utf8(*c, &utf8);
      EXPECT_EQ(count_bytes(s, utf8), count_of(cp, all, needle)) << s;
    }
  }
  EXPECT_GT(with_ascii_chunks, 1000);
  EXPECT_GT(with_other, 1000);
}

// An ASCII text's words are the same spans whether the document view took its ASCII path or
// decoded the text, for every length around 64-byte blocks and every white-space and
// punctuation byte.
TEST(FilterText, AsciiWordSplitMatchesCodePoints) {
  std::mt19937_64 rng(64);
  const std::string pool =
      std::string(" \t\n\r\x0b\x0c\x1c\x1d\x1e\x1f") + "!\".,;:-_()[]{}#aZ09x'";
  int checked = 0;
  for (int it = 0; it < 20000; ++it) {
    std::string s;
    const size_t n = it < 400 ? static_cast<size_t>(it) : rng() % 300;
    for (size_t k = 0; k < n; ++k)
      s += rng() % 4 ? pool[rng() % pool.size()] : static_cast<char>(rng() % 128);
    set_ascii_paths(true);
    reset_document_view();
    const std::vector<Span> fast = document_view_words(s).words;
    set_ascii_paths(false);
    reset_document_view();
    const std::vector<Span> plain = document_view_words(s).words;
    set_ascii_paths(true);
    reset_document_view();
    ASSERT_EQ(fast.size(), plain.size()) << n << ": " << s;
    for (size_t k = 0; k < fast.size(); ++k) {
      ASSERT_EQ(fast[k].begin, plain[k].begin) << s;
      ASSERT_EQ(fast[k].end, plain[k].end) << s;
    }
    checked += !plain.empty();
  }
  EXPECT_GT(checked, 19000);
}

}  // namespace
}  // namespace kiln::prep::filter
