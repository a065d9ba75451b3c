#include "dataprep/filter/text.h"

#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <atomic>
#include <cstring>
#if defined(__SSE2__)
#include <emmintrin.h>
#endif

#include "common/hash.h"
#include "dataprep/filter/spacy_en.h"

namespace kiln::prep::filter {
namespace detail {

constexpr uint8_t ascii_class(int c) {
  uint8_t k = 0;
  if ((c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20)) k |= kSpace;
  if ((c >= 'a' && c <= 'z') || (c >= 'A' && c <= 'Z')) k |= kAlpha;
  if ((c >= 0x21 && c <= 0x2f) || (c >= 0x3a && c <= 0x40) || (c >= 0x5b && c <= 0x60) ||
      (c >= 0x7b && c <= 0x7e))
    k |= kPunct;
  return k;
}
#define KILN_C8(b)                                                                                \
  ascii_class(b), ascii_class(b + 1), ascii_class(b + 2), ascii_class(b + 3), ascii_class(b + 4), \
      ascii_class(b + 5), ascii_class(b + 6), ascii_class(b + 7)
const uint8_t kAsciiClass[128] = {KILN_C8(0),  KILN_C8(8),   KILN_C8(16),  KILN_C8(24),
                                  KILN_C8(32), KILN_C8(40),  KILN_C8(48),  KILN_C8(56),
                                  KILN_C8(64), KILN_C8(72),  KILN_C8(80),  KILN_C8(88),
                                  KILN_C8(96), KILN_C8(104), KILN_C8(112), KILN_C8(120)};
#undef KILN_C8

bool is_space_slow(char32_t c) {
  return c == 0x85 || c == 0xA0 || c == 0x1680 || (c >= 0x2000 && c <= 0x200A) || c == 0x2028 ||
         c == 0x2029 || c == 0x202F || c == 0x205F || c == 0x3000;
}

bool is_alpha_slow(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return true;
    default:
      return false;
  }
}

bool is_punct_slow(char32_t c) {
  if (is_punctuation_category(c)) return true;
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_SM:
    case UTF8PROC_CATEGORY_SC:
    case UTF8PROC_CATEGORY_SK:
    case UTF8PROC_CATEGORY_SO:
      return true;
    default:
      return false;
  }
}

}  // namespace detail

bool is_punctuation_category(char32_t c) {
  switch (utf8proc_category(static_cast<utf8proc_int32_t>(c))) {
    case UTF8PROC_CATEGORY_PC:
    case UTF8PROC_CATEGORY_PD:
    case UTF8PROC_CATEGORY_PS:
    case UTF8PROC_CATEGORY_PE:
    case UTF8PROC_CATEGORY_PI:
    case UTF8PROC_CATEGORY_PF:
    case UTF8PROC_CATEGORY_PO:
      return true;
    default:
      return false;
  }
}

void decode_utf8(std::string_view text, CodePoints* out, Offsets* byte_at) {
  out->resize(text.size());
  if (byte_at) byte_at->resize(text.size() + 1);
  const auto* begin = reinterpret_cast<const uint8_t*>(text.data());
  const auto* p = begin;
  const auto* end = p + text.size();
  char32_t* o = out->data();
  uint32_t* b = byte_at ? byte_at->data() : nullptr;
  if (ascii_paths() && is_ascii(text)) {
    // All ASCII: a byte is a code point at its own offset (two loops the compiler vectorises).
    const uint32_t n = static_cast<uint32_t>(text.size());
    for (uint32_t i = 0; i < n; ++i) o[i] = p[i];
    if (b) {
      for (uint32_t i = 0; i <= n; ++i) b[i] = i;
    }
    return;
  }
  while (p < end) {
    // Eight ASCII bytes at a time (no per-byte branch); a chunk with any other byte goes on
    // byte by byte.
    if (end - p >= 8) {
      uint64_t chunk;
      std::memcpy(&chunk, p, 8);
      if ((chunk & 0x8080808080808080ull) == 0) {
        const uint32_t at = static_cast<uint32_t>(p - begin);
        for (int k = 0; k < 8; ++k) o[k] = p[k];
        if (b)
          for (uint32_t k = 0; k < 8; ++k) b[k] = at + k;
        o += 8;
        p += 8;
        if (b) b += 8;
        continue;
      }
    }
    if (*p < 0x80) {
      if (b) *b++ = static_cast<uint32_t>(p - begin);
      *o++ = *p++;
      continue;
    }
    if (b) *b++ = static_cast<uint32_t>(p - begin);
    // Valid two- and three-byte sequences decoded here (not overlong, no surrogate: what
    // utf8proc_iterate accepts); anything else by utf8proc_iterate.
    const uint8_t c0 = p[0];
    if (c0 >= 0xC2 && c0 <= 0xDF && end - p >= 2 && (p[1] & 0xC0) == 0x80) {
      *o++ = static_cast<char32_t>((c0 & 0x1F) << 6 | (p[1] & 0x3F));
      p += 2;
      continue;
    }
    if ((c0 & 0xF0) == 0xE0 && end - p >= 3 && (p[1] & 0xC0) == 0x80 && (p[2] & 0xC0) == 0x80) {
      const char32_t cp = (c0 & 0x0F) << 12 | (p[1] & 0x3F) << 6 | (p[2] & 0x3F);
      if (cp >= 0x800 && (cp < 0xD800 || cp > 0xDFFF)) {
        *o++ = cp;
        p += 3;
        continue;
      }
    }
    utf8proc_int32_t cp = 0;
    utf8proc_ssize_t n = utf8proc_iterate(p, end - p, &cp);
    if (n <= 0) {
      *o++ = 0xFFFD;
      ++p;
      continue;
    }
    *o++ = static_cast<char32_t>(cp);
    p += n;
  }
  out->resize(o - out->data());
  if (byte_at) {
    *b++ = static_cast<uint32_t>(text.size());
    byte_at->resize(b - byte_at->data());
  }
}

namespace {
#include "dataprep/filter/datatrove_tables.inc"
struct SymbolTable {
  bool ascii[128] = {};
  SymbolTable() {
    for (char32_t c : kDatatrovePunctuationSet)
      if (c < 128) ascii[c] = true;
  }
};
const SymbolTable& symbol_table() {
  static const SymbolTable t;
  return t;
}
}  // namespace

bool is_symbol_char(char32_t c) {
  if (c < 128) return symbol_table().ascii[c];
  return std::binary_search(std::begin(kDatatrovePunctuationSet),
                            std::end(kDatatrovePunctuationSet), c);
}

const std::vector<char32_t>& terminal_punctuation() {
  static const std::vector<char32_t> v(std::begin(kDatatroveTerminalPunctuation),
                                       std::end(kDatatroveTerminalPunctuation));
  return v;
}

namespace {
DocumentView& view() {
  thread_local DocumentView v;
  return v;
}
}  // namespace

void reset_document_view() {
  view().decoded = false;
  view().have_words = false;
}

const DocumentView& document_view(std::string_view text) {
  DocumentView& v = view();
  if (!v.decoded) {
    decode_utf8(text, &v.cp, &v.byte_at);
    v.decoded = true;
    v.have_words = false;
  }
  return v;
}

const DocumentView& document_view_words(std::string_view text) {
  document_view(text);
  DocumentView& v = view();
  if (!v.have_words) {
    v.words.clear();
    split_words(text, v.byte_at, &v.words);
    v.have_words = true;
  }
  return v;
}

void append_utf8(char32_t c, std::string* out) {
  if (c < 0x80) {
    out->push_back(static_cast<char>(c));
  } else if (c < 0x800) {
    out->push_back(static_cast<char>(0xC0 | (c >> 6)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else if (c < 0x10000) {
    out->push_back(static_cast<char>(0xE0 | (c >> 12)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  } else {
    out->push_back(static_cast<char>(0xF0 | (c >> 18)));
    out->push_back(static_cast<char>(0x80 | ((c >> 12) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | ((c >> 6) & 0x3F)));
    out->push_back(static_cast<char>(0x80 | (c & 0x3F)));
  }
}

void split_lines(const CodePoints& t, Span range, std::vector<Span>* out) {
  split_lines_of(t.data(), range, out);
}

namespace {
std::atomic<bool> g_ascii_paths{true};
}  // namespace
void set_ascii_paths(bool on) { g_ascii_paths.store(on, std::memory_order_relaxed); }
bool ascii_paths() { return g_ascii_paths.load(std::memory_order_relaxed); }

bool is_ascii(std::string_view text) {
  const char* p = text.data();
  size_t n = text.size();
  uint64_t any = 0;
  for (; n >= 32; p += 32, n -= 32) {
    uint64_t w[4];
    std::memcpy(w, p, 32);
    any |= w[0] | w[1] | w[2] | w[3];
    if (any & 0x8080808080808080ull) return false;
  }
  for (; n > 0; ++p, --n) any |= static_cast<uint8_t>(*p);
  return (any & 0x8080808080808080ull) == 0;
}

namespace {
// The first i in [i, end) with t[i] == sep, or end: eight code points compared at a time (a
// loop the compiler turns into vector compares), then one at a time.
inline uint32_t find_code_point(const char32_t* t, uint32_t i, uint32_t end, char32_t sep) {
  while (i + 8 <= end) {
    uint32_t hit = 0;
    for (uint32_t k = 0; k < 8; ++k) hit |= t[i + k] == sep;
    if (hit) break;
    i += 8;
  }
  while (i < end && t[i] != sep) ++i;
  return i;
}
}  // namespace

namespace {
// split_on / split_on_runs over t[range) with next(i) = the first separator at or after i (or
// range.end).
template <typename Ch, typename Next>
void split_on_of(const Ch* t, Span range, Ch sep, Next next, std::vector<Span>* out) {
  out->clear();
  uint32_t start = range.begin;
  for (uint32_t i = range.begin;; ++i) {
    i = next(i);
    if (i >= range.end) break;
    out->push_back({start, i});
    start = i + 1;
  }
  out->push_back({start, range.end});
}
template <typename Ch, typename Next>
void split_on_runs_of(const Ch* t, Span range, Ch sep, uint32_t k, Next next,
                      std::vector<Span>* out) {
  out->clear();
  uint32_t start = range.begin, i = range.begin;
  while (i < range.end) {
    i = next(i);
    if (i >= range.end) break;
    uint32_t j = i;
    while (j < range.end && t[j] == sep) ++j;
    if (j - i >= k) {
      out->push_back({start, i});
      start = j;
    }
    i = j;
  }
  out->push_back({start, range.end});
}
auto code_point_finder(const CodePoints& t, Span range, char32_t sep) {
  return [&t, range, sep](uint32_t i) { return find_code_point(t.data(), i, range.end, sep); };
}
auto byte_finder(std::string_view text, Span range, char sep) {
  return [text, range, sep](uint32_t i) {
    const void* p = std::memchr(text.data() + i, sep, range.end - i);
    return p ? static_cast<uint32_t>(static_cast<const char*>(p) - text.data()) : range.end;
  };
}
}  // namespace

void split_on(const CodePoints& t, Span range, char32_t sep, std::vector<Span>* out) {
  split_on_of(t.data(), range, sep, code_point_finder(t, range, sep), out);
}

void split_on_runs(const CodePoints& t, Span range, char32_t sep, uint32_t k,
                   std::vector<Span>* out) {
  split_on_runs_of(t.data(), range, sep, k, code_point_finder(t, range, sep), out);
}

void split_on_ascii(std::string_view text, Span range, char sep, std::vector<Span>* out) {
  split_on_of(text.data(), range, sep, byte_finder(text, range, sep), out);
}

void split_on_runs_ascii(std::string_view text, Span range, char sep, uint32_t k,
                         std::vector<Span>* out) {
  split_on_runs_of(text.data(), range, sep, k, byte_finder(text, range, sep), out);
}

Span strip(const CodePoints& t, Span s) { return strip_of(t.data(), s); }

void split_whitespace(const CodePoints& t, Span s, std::vector<Span>* out) {
  uint32_t i = s.begin;
  while (i < s.end) {
    while (i < s.end && is_space(t[i])) ++i;
    if (i >= s.end) break;
    uint32_t j = i;
    while (j < s.end && !is_space(t[j])) ++j;
    out->push_back({i, j});
    i = j;
  }
}

void split_words(std::string_view text, const Offsets& byte_at, std::vector<Span>* out) {
  thread_local std::vector<spacy::Token> tokens;
  spacy::tokenize(text, &tokens);
  const bool ascii = byte_at.size() == text.size() + 1;  // (a code point per byte)
  // (byte offsets -> code point offsets, walking forward: the tokens are in text order)
  uint32_t cp = 0;
  auto to_cp = [&](uint32_t byte) {
    if (ascii) return byte;
    while (byte_at[cp] < byte) ++cp;
    return cp;
  };
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (const spacy::Token& t : tokens) {
    if (spacy::is_space_token(text, t)) continue;
    const uint32_t b = to_cp(t.begin), e = to_cp(t.end);
    // CJK ideographs and kana: one word each (Kiln's rule; spaCy's English rules keep a run of
    // them as one token). Only tokens with a byte >= 0xE3 can hold one.
    bool high = false;
    if (!ascii)
      for (uint32_t k = t.begin; k < t.end && !high; ++k) high = p[k] >= 0xE3;
    if (!high) {
      out->push_back({b, e});
      continue;
    }
    uint32_t piece = b;
    // (the code points of [b, e) are decoded by the caller's view; recomputed here from bytes)
    uint32_t k = t.begin, i = b;
    while (k < t.end) {
      const uint32_t n = byte_at[i + 1] - byte_at[i];
      char32_t c = p[k];
      if (n == 2) c = (p[k] & 0x1F) << 6 | (p[k + 1] & 0x3F);
      if (n == 3) c = (p[k] & 0x0F) << 12 | (p[k + 1] & 0x3F) << 6 | (p[k + 2] & 0x3F);
      if (n == 4)
        c = (p[k] & 0x07) << 18 | (p[k + 1] & 0x3F) << 12 | (p[k + 2] & 0x3F) << 6 |
            (p[k + 3] & 0x3F);
      if (is_cjk(c)) {
        if (piece < i) out->push_back({piece, i});
        out->push_back({i, i + 1});
        piece = i + 1;
      }
      k += n;
      ++i;
    }
    if (piece < e) out->push_back({piece, e});
  }
}

bool span_equals(const CodePoints& t, Span s, std::u32string_view word) {
  if (s.size() != word.size()) return false;
  for (uint32_t k = 0; k < word.size(); ++k)
    if (t[s.begin + k] != word[k]) return false;
  return true;
}

bool ends_with(const CodePoints& t, Span s, std::u32string_view suffix) {
  if (s.size() < suffix.size()) return false;
  return span_equals(t, {static_cast<uint32_t>(s.end - suffix.size()), s.end}, suffix);
}

bool starts_with(const CodePoints& t, Span s, std::u32string_view prefix) {
  if (s.size() < prefix.size()) return false;
  return span_equals(t, {s.begin, static_cast<uint32_t>(s.begin + prefix.size())}, prefix);
}

uint64_t count_of(const CodePoints& t, Span s, std::u32string_view needle) {
  uint64_t n = 0;
  const uint32_t m = static_cast<uint32_t>(needle.size());
  uint32_t i = s.begin;
  while (i + m <= s.end) {
    if (t[i] == needle[0] && span_equals(t, {i, i + m}, needle)) {
      ++n;
      i += m;
    } else {
      ++i;
    }
  }
  return n;
}

uint64_t count_bytes(std::string_view text, std::string_view needle) {
  if (needle.empty()) return text.size() + 1;
  if (needle.size() == 1) {
    const char c = needle[0];
    uint64_t n = 0;
    for (char x : text) n += x == c;
    return n;
  }
  uint64_t n = 0;
  size_t at = 0;
  while ((at = text.find(needle, at)) != std::string_view::npos) {
    ++n;
    at += needle.size();
  }
  return n;
}

uint64_t span_hash(const CodePoints& t, Span s) {
  return xxh3_64(t.data() + s.begin, s.size() * sizeof(char32_t), 0x6b696c6e66696c74ull);
}

}  // namespace kiln::prep::filter
