// Text units for the quality filters: code points, lines, paragraphs and words with the exact
// semantics of the Python definitions the filters are specified in (datatrove's, Python 3 str):
// lengths are in code points, white space is str.isspace(), lines are str.splitlines() or
// split("\n"), letters are str.isalpha() (Unicode L*), punctuation is Unicode P* and S*.
// Character classes come from utf8proc. Input must be valid UTF-8 (prep's readers guarantee it).
// Internal to dataprep/filter/. Thread-safe: pure functions over caller-owned buffers.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

namespace kiln::prep::filter {

// [begin, end) in code points.
struct Span {
  uint32_t begin = 0, end = 0;
  uint32_t size() const { return end - begin; }
};

bool is_space(char32_t c);  // Python str.isspace()
bool is_alpha(char32_t c);  // Python str.isalpha(): Lu Ll Lt Lm Lo
bool is_punct(char32_t c);  // Unicode P* or S*
// Han ideographs, kana and CJK compatibility ideographs: scripts written without spaces, where a
// character carries about a word.
bool is_cjk(char32_t c);
bool is_line_break(char32_t c);  // a str.splitlines() boundary

// Decodes UTF-8 into *out (cleared). Invalid bytes become U+FFFD.
void decode_utf8(std::string_view text, std::vector<char32_t>* out);
void append_utf8(char32_t c, std::string* out);

// str.splitlines(): spans of the lines, without their breaks ("\r\n" is one break).
void split_lines(const std::vector<char32_t>& t, Span range, std::vector<Span>* out);
// str.split(sep) for a single character sep (the empty parts included).
void split_on(const std::vector<char32_t>& t, Span range, char32_t sep, std::vector<Span>* out);
// re.split(sep + "{k,}") for a character sep and k >= 1: runs of at least k seps separate parts.
void split_on_runs(const std::vector<char32_t>& t, Span range, char32_t sep, uint32_t k,
                   std::vector<Span>* out);
// str.strip() of a span.
Span strip(const std::vector<char32_t>& t, Span s);
// str.split() (white-space separated tokens) of a span, appended.
void split_whitespace(const std::vector<char32_t>& t, Span s, std::vector<Span>* out);

// The filters' words (filter.h): appended to *out.
void split_words(const std::vector<char32_t>& t, Span s, std::vector<Span>* out);

bool span_equals(const std::vector<char32_t>& t, Span s, std::u32string_view word);
bool ends_with(const std::vector<char32_t>& t, Span s, std::u32string_view suffix);
bool starts_with(const std::vector<char32_t>& t, Span s, std::u32string_view prefix);
uint64_t count_of(const std::vector<char32_t>& t, Span s, std::u32string_view needle);  // str.count
// 64-bit hash of the code points of a span.
uint64_t span_hash(const std::vector<char32_t>& t, Span s);

}  // namespace kiln::prep::filter
