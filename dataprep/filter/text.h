// Text units for the quality filters: code points, lines, paragraphs and words with the exact
// semantics of the Python definitions the filters are specified in (datatrove's, Python 3 str):
// lengths are in code points, white space is str.isspace(), lines are str.splitlines() or
// split("\n"), letters are str.isalpha() (Unicode L*), punctuation is Unicode P* and S*.
// Character classes come from utf8proc. Input must be valid UTF-8 (prep's readers guarantee it).
// Internal to dataprep/filter/. Thread-safe: pure functions over caller-owned buffers.
#pragma once

#include <cstdint>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif
#include <string>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::prep::filter {

// Vectors whose resize() leaves new elements uninitialised: the decoder writes every element
// it keeps, and a document's buffers are regrown for each document.
template <typename T>
struct NoInitAllocator : std::allocator<T> {
  template <typename U>
  struct rebind {
    using other = NoInitAllocator<U>;
  };
  NoInitAllocator() = default;
  template <typename U>
  NoInitAllocator(const NoInitAllocator<U>&) noexcept {}
  template <typename U>
  void construct(U* p) noexcept {
    ::new (static_cast<void*>(p)) U;
  }
  template <typename U, typename... Args>
  void construct(U* p, Args&&... args) {
    ::new (static_cast<void*>(p)) U(std::forward<Args>(args)...);
  }
};
using CodePoints = std::vector<char32_t, NoInitAllocator<char32_t>>;
using Offsets = std::vector<uint32_t, NoInitAllocator<uint32_t>>;

// [begin, end) in code points.
struct Span {
  uint32_t begin = 0, end = 0;
  uint32_t size() const { return end - begin; }
};

namespace detail {
enum : uint8_t { kSpace = 1, kAlpha = 2, kPunct = 4 };
extern const uint8_t kAsciiClass[128];
bool is_space_slow(char32_t c);
bool is_alpha_slow(char32_t c);
bool is_punct_slow(char32_t c);
}  // namespace detail

// Python str.isspace()
inline bool is_space(char32_t c) {
  return c < 128 ? (detail::kAsciiClass[c] & detail::kSpace) != 0 : detail::is_space_slow(c);
}
// Python str.isalpha(): Lu Ll Lt Lm Lo
inline bool is_alpha(char32_t c) {
  return c < 128 ? (detail::kAsciiClass[c] & detail::kAlpha) != 0 : detail::is_alpha_slow(c);
}
// Unicode P* (Pc Pd Ps Pe Pi Pf Po): spaCy's token.is_punct per character, dedup's punctuation.
bool is_punctuation_category(char32_t c);
// Unicode P* or S*
inline bool is_punct(char32_t c) {
  return c < 128 ? (detail::kAsciiClass[c] & detail::kPunct) != 0 : detail::is_punct_slow(c);
}
// datatrove's PUNCTUATION_SET (utils/text.py at a649de79: its PUNCTUATION string, control
// characters included, and TERMINAL_PUNCTUATION): a word of only these is a symbol word.
bool is_symbol_char(char32_t c);
// datatrove's TERMINAL_PUNCTUATION (159 characters), ascending: FineWeb's default stop_chars.
const std::vector<char32_t>& terminal_punctuation();
// Han ideographs, kana and CJK compatibility ideographs: scripts written without spaces, where a
// character carries about a word.
inline bool is_cjk(char32_t c) {
  return c >= 0x3040 && ((c <= 0x30FF) || (c >= 0x31F0 && c <= 0x31FF) ||
                         (c >= 0x3400 && c <= 0x4DBF) || (c >= 0x4E00 && c <= 0x9FFF) ||
                         (c >= 0xF900 && c <= 0xFAFF) || (c >= 0x20000 && c <= 0x2FA1F));
}
// a str.splitlines() boundary
inline bool is_line_break(char32_t c) {
  return c < 128 ? (c >= 0x0A && c <= 0x0D) || (c >= 0x1C && c <= 0x1E)
                 : c == 0x85 || c == 0x2028 || c == 0x2029;
}

// Decodes UTF-8 into *out (cleared). Invalid bytes become U+FFFD. With byte_at, also the byte
// offset of each code point, plus one entry for the end.
void decode_utf8(std::string_view text, CodePoints* out, Offsets* byte_at = nullptr);
void append_utf8(char32_t c, std::string* out);

// The document a chain is running on, decoded once for all its filters (per thread): its code
// points, the byte offset of each (and of the end), and its words (split_words) on first use.
// FilterChain::run() calls reset_document_view() before each document and after each edit, so
// a view never outlives the text it was made from.
struct DocumentView {
  CodePoints cp;
  Offsets byte_at;
  std::vector<Span> words;
  bool decoded = false, have_words = false;
};
void reset_document_view();
const DocumentView& document_view(std::string_view text);        // decoded
const DocumentView& document_view_words(std::string_view text);  // decoded, with words

// str.splitlines(): spans of the lines, without their breaks ("\r\n" is one break).
void split_lines(const CodePoints& t, Span range, std::vector<Span>* out);
// The same over any code unit array: char32_t code points, or the bytes of an ASCII-only text
// (where a byte is a code point and byte offsets are code point offsets).
template <typename Ch>
void split_lines_of(const Ch* t, Span range, std::vector<Span>* out) {
  out->clear();
  uint32_t start = range.begin, i = range.begin;
  if constexpr (sizeof(Ch) == 1) {
    // Bytes of ASCII text: when '\n' is the only break there (one vectorised pass says), the
    // lines are found with memchr.
    uint32_t other = 0;
    for (uint32_t k = range.begin; k < range.end; ++k)
      other |= static_cast<uint8_t>(t[k] - 0x0B) < 3 || static_cast<uint8_t>(t[k] - 0x1C) < 3;
    if (!other) {
      while (const void* p = std::memchr(t + start, '\n', range.end - start)) {
        const uint32_t at = static_cast<uint32_t>(static_cast<const Ch*>(p) - t);
        out->push_back({start, at});
        start = at + 1;
      }
      if (start < range.end) out->push_back({start, range.end});
      return;
    }
  }
  // A code point that may be a break: a control character up to U+001E, U+0085, U+2028 or
  // U+2029 (every is_line_break is one).
  auto special = [](char32_t c) { return (c <= 0x1E) | (c == 0x85) | ((c | 1) == 0x2029); };
  while (i < range.end) {
    // Most code points are not special: skipped eight at a time (a loop the compiler turns into
    // vector compares), then one at a time.
#if defined(__SSE2__)
    if constexpr (sizeof(Ch) == 4) {
      const __m128i k1e = _mm_set1_epi32(0x1F), k85 = _mm_set1_epi32(0x85),
                    k2029 = _mm_set1_epi32(0x2029), one = _mm_set1_epi32(1);
      auto special4 = [&](const Ch* p) {  // (code points are < 2^31: signed compares are right)
        const __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(p));
        return _mm_or_si128(_mm_or_si128(_mm_cmplt_epi32(c, k1e), _mm_cmpeq_epi32(c, k85)),
                            _mm_cmpeq_epi32(_mm_or_si128(c, one), k2029));
      };
      while (i + 8 <= range.end &&
             _mm_movemask_epi8(_mm_or_si128(special4(t + i), special4(t + i + 4))) == 0)
        i += 8;
    }
#endif
    while (i + 8 <= range.end) {
      uint32_t any = 0;
      for (uint32_t k = 0; k < 8; ++k) any |= special(t[i + k]);
      if (any) break;
      i += 8;
    }
    while (i < range.end && !special(t[i])) ++i;
    if (i >= range.end) break;
    if (is_line_break(t[i])) {
      out->push_back({start, i});
      if (t[i] == '\r' && i + 1 < range.end && t[i + 1] == '\n') ++i;
      start = ++i;
    } else {
      ++i;
    }
  }
  if (start < range.end) out->push_back({start, range.end});
}
// str.strip() of a span of any code unit array (as split_lines_of).
template <typename Ch>
Span strip_of(const Ch* t, Span s) {
  while (s.begin < s.end && is_space(t[s.begin])) ++s.begin;
  while (s.end > s.begin && is_space(t[s.end - 1])) --s.end;
  return s;
}
// Whether text is all ASCII (every byte < 0x80): then its bytes are its code points. Filters
// with a byte-level path take it for such texts; set_ascii_paths(false) turns those paths off
// (the general code point path runs on every text), so tests can compare the two.
bool is_ascii(std::string_view text);
void set_ascii_paths(bool on);
bool ascii_paths();
inline bool take_ascii_path(std::string_view text) { return ascii_paths() && is_ascii(text); }
// str.split(sep) for a single character sep (the empty parts included).
void split_on(const CodePoints& t, Span range, char32_t sep, std::vector<Span>* out);
// re.split(sep + "{k,}") for a character sep and k >= 1: runs of at least k seps separate parts.
void split_on_runs(const CodePoints& t, Span range, char32_t sep, uint32_t k,
                   std::vector<Span>* out);
// split_on and split_on_runs on the bytes of an ASCII text (is_ascii; sep < 0x80), where byte
// offsets are code point offsets: the same spans, the separators found with memchr.
void split_on_ascii(std::string_view text, Span range, char sep, std::vector<Span>* out);
void split_on_runs_ascii(std::string_view text, Span range, char sep, uint32_t k,
                         std::vector<Span>* out);
// str.strip() of a span.
Span strip(const CodePoints& t, Span s);
// str.split() (white-space separated tokens) of a span, appended.
void split_whitespace(const CodePoints& t, Span s, std::vector<Span>* out);

// The filters' words (filter.h) of text, whose code points' byte offsets are byte_at (with the
// end's): spaCy's English tokens (spacy_en.h) that are not white space, as datatrove's
// word_tokenize gives them, with every CJK ideograph or kana a word of its own. Appended.
void split_words(std::string_view text, const Offsets& byte_at, std::vector<Span>* out);

bool span_equals(const CodePoints& t, Span s, std::u32string_view word);
bool ends_with(const CodePoints& t, Span s, std::u32string_view suffix);
bool starts_with(const CodePoints& t, Span s, std::u32string_view prefix);
uint64_t count_of(const CodePoints& t, Span s, std::u32string_view needle);  // str.count
// str.count on the UTF-8 text itself: the same count for a needle that is valid UTF-8 (UTF-8 is
// self-synchronising: a match of its bytes starts and ends on character boundaries).
uint64_t count_bytes(std::string_view text, std::string_view needle);
// 64-bit hash of the code points of a span.
uint64_t span_hash(const CodePoints& t, Span s);

}  // namespace kiln::prep::filter
