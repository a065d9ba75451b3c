// Pre-tokenisation: GPT-2's pattern rule by rule, and Kiln's CJK / digit / newline changes.
#include "dataprep/tokenizer/pretokenize.h"

#include <gtest/gtest.h>

#include <random>
#include <string>
#include <vector>

namespace kiln::prep {
namespace {

std::vector<std::string> split(std::string_view text, PretokenizerKind kind, uint32_t chunk = 4) {
  std::vector<std::string_view> pieces;
  PretokenizerSpec spec;
  spec.kind = kind;
  spec.cjk_chunk = chunk;
  EXPECT_TRUE(pretokenize(text, spec, &pieces).is_ok());
  return {pieces.begin(), pieces.end()};
}

using V = std::vector<std::string>;
constexpr auto kGpt2 = PretokenizerKind::kGpt2;
constexpr auto kKiln = PretokenizerKind::kKiln;

TEST(Pretokenize, Gpt2Words) {
  EXPECT_EQ(split("Hello world", kGpt2), (V{"Hello", " world"}));
  EXPECT_EQ(split("it's they're I'LL", kGpt2), (V{"it", "'s", " they", "'re", " I", "'", "LL"}));
  EXPECT_EQ(split("x  y", kGpt2), (V{"x", " ", " y"}));
  EXPECT_EQ(split("x   y", kGpt2), (V{"x", "  ", " y"}));
  EXPECT_EQ(split("a\n\nb", kGpt2), (V{"a", "\n", "\n", "b"}));
  EXPECT_EQ(split("a\tb", kGpt2), (V{"a", "\t", "b"}));
  EXPECT_EQ(split("end  ", kGpt2), (V{"end", "  "}));
  EXPECT_EQ(split(" 12345 ab1", kGpt2), (V{" 12345", " ab", "1"}));
  EXPECT_EQ(split("f(x) += 1;", kGpt2), (V{"f", "(", "x", ")", " +=", " 1", ";"}));
  EXPECT_EQ(split("''s", kGpt2), (V{"''", "s"}));
  // GPT-2 keeps a whole run of ideographs as one letter run.
  EXPECT_EQ(split("GPU训练好", kGpt2), (V{"GPU训练好"}));
  // Combining marks are not letters in GPT-2's pattern.
  EXPECT_EQ(split("cafe\xCC\x81s", kGpt2), (V{"cafe", "\xCC\x81", "s"}));
}

TEST(Pretokenize, KilnChanges) {
  EXPECT_EQ(split("GPU训练好", kKiln), (V{"GPU", "训练好"}));
  EXPECT_EQ(split("自然语言处理是人工智能", kKiln), (V{"自然语言", "处理是人", "工智能"}));
  EXPECT_EQ(split("自然语言处理。是人工", kKiln, 0), (V{"自然语言处理", "。", "是人工"}));
  EXPECT_EQ(split("自然语言处理", kKiln, 0), (V{"自然语言处理"}));
  EXPECT_EQ(split("自然语", kKiln, 1), (V{"自", "然", "语"}));
  EXPECT_EQ(split("使用 GPU 训练。", kKiln), (V{"使用", " GPU", " 训练", "。"}));
  EXPECT_EQ(split(" 12345", kKiln), (V{" 123", "45"}));
  EXPECT_EQ(split("IT'S", kKiln), (V{"IT", "'S"}));
  EXPECT_EQ(split("cafe\xCC\x81s", kKiln), (V{"cafe\xCC\x81s"}));
  EXPECT_EQ(split("a\n\n    b", kKiln), (V{"a", "\n\n", "   ", " b"}));
  EXPECT_EQ(split("a  \r\n\tb", kKiln), (V{"a", "  \r\n", "\t", "b"}));
  EXPECT_EQ(split("カタカナとひらがな", kKiln), (V{"カタカナ", "とひらが", "な"}));
  EXPECT_EQ(split("한국어 텍스트", kKiln), (V{"한국어", " 텍스트"}));
}

TEST(Pretokenize, InvalidBytesAreSingleCharacters) {
  std::string text = "ab\xff\xfe cd\xe4\xb8";
  auto pieces = split(text, kKiln);
  std::string joined;
  for (auto& p : pieces) joined += p;
  EXPECT_EQ(joined, text);
  EXPECT_EQ(split(text, kGpt2), (V{"ab", "\xff\xfe", " cd", "\xe4\xb8"}));
}

TEST(Pretokenize, PiecesAlwaysConcatenateToTheInput) {
  std::mt19937 rng(7);
  const std::vector<std::string> atoms = {
      "a",  "Z",  " ", "  ",       "\n",       "\r\n", "\t", "1", "'", "'s", "中",
      "文", "。", "😀", "\xCC\x81", "\xC2\xA0", "\xff", "é",  ".", "{", "ん", "\xE3\x80\x80"};
  for (int iter = 0; iter < 2000; ++iter) {
    std::string text;
    int len = int(rng() % 30);
    for (int i = 0; i < len; ++i) text += atoms[rng() % atoms.size()];
    for (auto kind : {kGpt2, kKiln}) {
      auto pieces = split(text, kind);
      std::string joined;
      for (auto& p : pieces) {
        EXPECT_FALSE(p.empty());
        joined += p;
      }
      ASSERT_EQ(joined, text);
    }
  }
}

TEST(Pretokenize, Names) {
  EXPECT_EQ(*parse_pretokenizer_name("gpt2"), kGpt2);
  EXPECT_EQ(*parse_pretokenizer_name(pretokenizer_name(kKiln)), kKiln);
  EXPECT_FALSE(parse_pretokenizer_name("nope").is_ok());
}

}  // namespace
}  // namespace kiln::prep
