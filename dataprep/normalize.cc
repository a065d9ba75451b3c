#include "dataprep/normalize.h"

#include <utf8proc.h>

#include <array>
#include <cstdint>
#include <cstdlib>
#include <cstring>
#include <vector>

namespace kiln {
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

bool is_punct_cp(int32_t cp) {
  switch (utf8proc_category(cp)) {
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

void normalize_for_dedup(std::string_view text, const NormalizeOptions& options,
                         std::string* out) {
  const AsciiTable& t = ascii();
  out->clear();
  out->reserve(text.size());
  thread_local std::vector<int32_t> cps;
  bool pending_space = false;
  const char* p = text.data();
  const char* end = p + text.size();
  while (p < end) {
    // Skip ASCII white space between words.
    while (p < end && is_ascii_space_byte(static_cast<unsigned char>(*p))) {
      pending_space = true;
      ++p;
    }
    if (p >= end) break;
    // One word: up to the next ASCII white space. NFKC never composes across a white space
    // starter, so normalising word by word equals normalising the whole text.
    const char* w = p;
    bool all_ascii = true;
    while (p < end && !is_ascii_space_byte(static_cast<unsigned char>(*p))) {
      all_ascii &= static_cast<unsigned char>(*p) < 0x80;
      ++p;
    }
    if (all_ascii) {
      for (const char* c = w; c < p; ++c) {
        unsigned char ch = static_cast<unsigned char>(*c);
        if (options.strip_punct && t.punct[ch]) continue;
        if (t.space[ch]) {  // other ASCII controls counted as space by Unicode (none left here)
          pending_space = true;
          continue;
        }
        if (pending_space) {
          if (!out->empty()) out->push_back(' ');
          pending_space = false;
        }
        out->push_back(t.lower[ch]);
      }
    } else {
      nfkc_casefold(std::string_view(w, static_cast<size_t>(p - w)), &cps);
      for (int32_t cp : cps) emit_cp(cp, options.strip_punct, &pending_space, out);
    }
  }
}

std::string normalize_for_dedup_reference(std::string_view text, const NormalizeOptions& options) {
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

}  // namespace kiln
