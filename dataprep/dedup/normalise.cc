#include "dataprep/dedup/normalise.h"

#include <immintrin.h>
#include <utf8proc.h>

#include <algorithm>
#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

#include "dataprep/filter/text.h"

namespace kiln::prep {
namespace {

constexpr utf8proc_option_t kNfkcCasefold = static_cast<utf8proc_option_t>(
    UTF8PROC_STABLE | UTF8PROC_COMPAT | UTF8PROC_COMPOSE | UTF8PROC_CASEFOLD | UTF8PROC_IGNORE);

bool is_space_cp(int32_t cp) {
  if (cp < 0x80) return cp == ' ' || (cp >= 0x09 && cp <= 0x0d);
  if (cp == 0x85) return true;
  utf8proc_category_t cat = utf8proc_category(cp);
  return cat == UTF8PROC_CATEGORY_ZS || cat == UTF8PROC_CATEGORY_ZL ||
         cat == UTF8PROC_CATEGORY_ZP;
}

bool is_punct_cp(int32_t cp) { return filter::is_punctuation_category(static_cast<char32_t>(cp)); }

// Per-ASCII-byte classes, derived from utf8proc so both paths agree by construction.
struct AsciiTable {
  std::array<char, 128> lower{};
  std::array<bool, 128> space{};
  std::array<bool, 128> punct{};
  AsciiTable() {
    for (int c = 0; c < 128; ++c) {
      lower[c] = static_cast<char>(c >= 'A' && c <= 'Z' ? c + 32 : c);
      space[c] = is_space_cp(c);
      punct[c] = is_punct_cp(c);
    }
  }
};

const AsciiTable& ascii() {
  static const AsciiTable table;
  return table;
}

// Appends one code point, applying the whitespace / punctuation rules. `pending_space` carries a
// collapsed space until the next visible character (so trailing space is trimmed).
inline void emit_cp(int32_t cp, bool strip_punct, bool* pending_space, std::string* out) {
  if (is_space_cp(cp)) {
    *pending_space = true;
    return;
  }
  if (strip_punct && is_punct_cp(cp)) return;
  if (*pending_space) {
    if (!out->empty()) out->push_back(' ');
    *pending_space = false;
  }
  uint8_t buf[4];
  ssize_t n = utf8proc_encode_char(cp, buf);
  out->append(reinterpret_cast<const char*>(buf), static_cast<size_t>(n));
}

// NFKC + case fold of a (valid UTF-8) piece into code points, without allocating per call.
void nfkc_casefold(std::string_view piece, std::vector<int32_t>* cps) {
  if (cps->size() < piece.size() + 16) cps->resize(piece.size() * 2 + 16);
  for (;;) {
    utf8proc_ssize_t n = utf8proc_decompose(reinterpret_cast<const utf8proc_uint8_t*>(piece.data()),
                                            static_cast<utf8proc_ssize_t>(piece.size()),
                                            cps->data(), static_cast<utf8proc_ssize_t>(cps->size()),
                                            kNfkcCasefold);
    if (n < 0) {  // invalid UTF-8 cannot reach here (readers repair or reject it); be safe
      cps->clear();
      return;
    }
    if (static_cast<size_t>(n) > cps->size()) {
      cps->resize(static_cast<size_t>(n) + 16);
      continue;
    }
    utf8proc_ssize_t m = utf8proc_normalize_utf32(cps->data(), n, kNfkcCasefold);
    cps->resize(static_cast<size_t>(m < 0 ? 0 : m));
    return;
  }
}

inline bool is_ascii_space_byte(unsigned char c) { return c == ' ' || (c >= 0x09 && c <= 0x0d); }

}  // namespace

// Non-ASCII words made only of code points whose NFKC + case fold is known without tables
// (the common case for Chinese, Japanese, Korean and Western European text) skip utf8proc:
//   CJK ideographs, kana, Hangul syllables, "、。〃": unchanged (NFKC-stable, no case);
//   U+3000 ideographic space: a space;  U+FF01..U+FF5E fullwidth ASCII: the ASCII character;
//   U+00C0..U+00FE Latin-1 letters: lower case.  ASCII: as in the ASCII path.
// Anything else (combining marks included) returns false and the word goes through utf8proc.
// Writes at o + *len; returns false without a defined output on fallback.
bool fast_word(const unsigned char* w, const unsigned char* e, bool strip, const AsciiTable& t,
               bool* pending_space, char* o, size_t* len) {
  while (w < e) {
    unsigned char c = *w;
    uint32_t cp;
    int n;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if (c < 0xE0) {
      cp = ((c & 0x1Fu) << 6) | (w[1] & 0x3Fu);
      n = 2;
    } else if (c < 0xF0) {
      cp = ((c & 0x0Fu) << 12) | ((w[1] & 0x3Fu) << 6) | (w[2] & 0x3Fu);
      n = 3;
    } else {
      return false;
    }
    bool copy = false, punct = false;
    uint32_t ascii = 0;  // != 0: emit this ASCII character instead
    if (cp < 0x80) {
      ascii = cp;
    } else if ((cp >= 0x4E00 && cp <= 0x9FFF) || (cp >= 0x3400 && cp <= 0x4DBF) ||
               (cp >= 0xAC00 && cp <= 0xD7A3) || (cp >= 0x3041 && cp <= 0x3096) ||
               (cp >= 0x30A1 && cp <= 0x30FA) || (cp >= 0x00E0 && cp <= 0x00FE)) {
      copy = true;
    } else if (cp >= 0x3001 && cp <= 0x3003) {
      copy = true;
      punct = true;
    } else if (cp >= 0xFF01 && cp <= 0xFF5E) {
      ascii = cp - 0xFEE0;
    } else if (cp >= 0x00C0 && cp <= 0x00DE && cp != 0x00D7) {
      cp += 0x20;  // Latin-1 capital -> small (2-byte UTF-8 either way)
      copy = true;
      n = -2;
    } else if (cp == 0x3000) {
      *pending_space = true;
      w += 3;
      continue;
    } else {
      return false;
    }
    if (ascii) {
      if (strip && t.punct[ascii]) {
        w += n;
        continue;
      }
      if (is_ascii_space_byte(static_cast<unsigned char>(ascii))) {  // not reachable; be safe
        *pending_space = true;
        w += n;
        continue;
      }
    } else if (strip && punct) {
      w += n;
      continue;
    }
    if (*pending_space) {
      if (*len > 0) o[(*len)++] = ' ';
      *pending_space = false;
    }
    if (ascii) {
      o[(*len)++] = t.lower[ascii];
    } else if (n == -2) {
      o[(*len)++] = static_cast<char>(0xC0 | (cp >> 6));
      o[(*len)++] = static_cast<char>(0x80 | (cp & 0x3F));
      n = 2;
    } else if (copy) {
      for (int k = 0; k < n; ++k) o[(*len)++] = static_cast<char>(w[k]);
    }
    w += n;
  }
  return true;
}

// AVX-512 (BW + VBMI2) path for 64-byte blocks of pure ASCII (no punctuation stripping): lower
// case, white space runs to one ' ', compressed out in one go. It processes a block only up to
// its last white space, so words never straddle the vector and scalar paths. Returns the bytes
// consumed (0: the scalar path must take the next word). Same result as the scalar code.
__attribute__((target("avx512f,avx512bw,avx512vbmi2,bmi2"))) size_t ascii_block_avx512(
    const unsigned char* p, char* o, size_t* len, bool* pending_space) {
  const __m512i v = _mm512_loadu_si512(p);
  if (_mm512_movepi8_mask(v) != 0) return 0;  // non-ASCII inside
  const __mmask64 sp = _mm512_cmpeq_epi8_mask(v, _mm512_set1_epi8(' ')) |
                       (_mm512_cmpge_epu8_mask(v, _mm512_set1_epi8(9)) &
                        _mm512_cmple_epu8_mask(v, _mm512_set1_epi8(13)));
  if (sp == 0) return 0;  // one 64-byte word: the scalar path
  const unsigned last = 63 - static_cast<unsigned>(__builtin_clzll(sp));  // last white space
  const uint64_t in_range = last == 63 ? ~uint64_t{0} : (uint64_t{1} << (last + 1)) - 1;
  const uint64_t vis = ~sp & in_range;
  // A space is kept when the next byte is visible and inside the processed range; a run that
  // starts the output is dropped.
  uint64_t keep_sp = sp & (vis >> 1);
  if (vis != 0) {
    const unsigned first_vis = static_cast<unsigned>(__builtin_ctzll(vis));
    if (first_vis > 0 && *len == 0) keep_sp &= ~(uint64_t{1} << (first_vis - 1));
    if (first_vis == 0 && *pending_space && *len > 0) o[(*len)++] = ' ';
  }
  const __mmask64 upper = _mm512_cmpge_epu8_mask(v, _mm512_set1_epi8('A')) &
                          _mm512_cmple_epu8_mask(v, _mm512_set1_epi8('Z'));
  __m512i lower = _mm512_mask_add_epi8(v, upper, v, _mm512_set1_epi8(32));
  lower = _mm512_mask_mov_epi8(lower, sp, _mm512_set1_epi8(' '));
  const __mmask64 keep = vis | keep_sp;
  _mm512_storeu_si512(o + *len, _mm512_maskz_compress_epi8(keep, lower));
  *len += static_cast<size_t>(__builtin_popcountll(keep));
  *pending_space = true;  // the range ends with white space
  return last + 1;
}

bool have_avx512_text() {
  static const bool ok = [] {
    __builtin_cpu_init();
    return __builtin_cpu_supports("avx512bw") && __builtin_cpu_supports("avx512vbmi2");
  }();
  return ok;
}

void normalise_for_dedup(std::string_view text, const NormaliseOptions& options,
                         std::string* out) {
  const AsciiTable& t = ascii();
  thread_local std::vector<int32_t> cps;
  // ASCII output is never longer than the input; non-ASCII words grow the buffer as needed. The
  // vector path stores whole 64-byte vectors, hence the slack.
  out->resize(text.size() + 72);
  const bool simd = !options.strip_punct && have_avx512_text();
  char* o = out->data();
  size_t len = 0;
  bool pending_space = false;
  const bool strip = options.strip_punct;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const auto* end = p + text.size();
  while (p < end) {
    if (simd && end - p >= 64) {
      size_t used = ascii_block_avx512(p, o, &len, &pending_space);
      if (used > 0) {
        p += used;
        continue;
      }
    }
    if (is_ascii_space_byte(*p)) {
      pending_space = true;
      ++p;
      continue;
    }
    // A word up to the next ASCII white space. NFKC never composes across a white space
    // starter, so normalising word by word equals normalising the whole text.
    const unsigned char* w = p;
    const size_t word_out = len;
    if (pending_space && len > 0) o[len++] = ' ';  // taken back if the word leaves nothing
    bool ascii_word = true;
    while (p < end) {
      unsigned char c = *p;
      if (c >= 0x80) {
        ascii_word = false;
        break;
      }
      if (is_ascii_space_byte(c)) break;
      if (!(strip && t.punct[c])) o[len++] = t.lower[c];
      ++p;
    }
    if (ascii_word) {
      if (len == word_out + (pending_space && word_out > 0 ? 1 : 0)) {
        len = word_out;  // nothing visible: keep the space pending
      } else {
        pending_space = false;
      }
      continue;
    }
    // Non-ASCII inside the word: redo the whole word, by the table-free path when it can.
    while (p < end && !is_ascii_space_byte(*p)) ++p;
    len = word_out;
    {
      // Fullwidth forms turn 3 bytes into 1 and Latin-1 keeps its length, so the output fits.
      bool pend = pending_space;
      size_t l = len;
      if (fast_word(w, p, strip, t, &pend, o, &l)) {
        pending_space = pend;
        len = l;
        continue;
      }
    }
    nfkc_casefold(std::string_view(reinterpret_cast<const char*>(w), static_cast<size_t>(p - w)),
                  &cps);
    out->resize(std::max(out->size(), len + 4 * cps.size() + 72 + static_cast<size_t>(end - p)));
    o = out->data();
    for (int32_t cp : cps) {
      if (is_space_cp(cp)) {
        pending_space = true;
        continue;
      }
      if (strip && is_punct_cp(cp)) continue;
      if (pending_space) {
        if (len > 0) o[len++] = ' ';
        pending_space = false;
      }
      len += static_cast<size_t>(utf8proc_encode_char(cp, reinterpret_cast<uint8_t*>(o + len)));
    }
  }
  out->resize(len);
}

std::string normalise_for_dedup_reference(std::string_view text, const NormaliseOptions& options) {
  utf8proc_uint8_t* mapped = nullptr;
  utf8proc_ssize_t n = utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data()),
                                    static_cast<utf8proc_ssize_t>(text.size()), &mapped,
                                    kNfkcCasefold);
  std::string out;
  if (n < 0) return out;
  bool pending_space = false;
  utf8proc_ssize_t at = 0;
  while (at < n) {
    utf8proc_int32_t cp;
    utf8proc_ssize_t len = utf8proc_iterate(mapped + at, n - at, &cp);
    if (len <= 0) break;
    at += len;
    emit_cp(cp, options.strip_punct, &pending_space, &out);
  }
  std::free(mapped);
  return out;
}

}  // namespace kiln::prep
