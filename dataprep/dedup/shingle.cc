#include "dataprep/dedup/shingle.h"

#include <cstring>

// The shingle hashes are XXH3-64 with seed 0 (the same values as common/hash.h xxh3_64); the
// header-only build lets the compiler inline it for these short inputs.
#define XXH_INLINE_ALL
#include <xxhash.h>

namespace kiln::prep {

bool is_spaceless_script(uint32_t cp) {
  if (cp < 0x0E00) return false;
  return (cp >= 0x0E00 && cp <= 0x0EFF) ||    // Thai, Lao
         (cp >= 0x0F00 && cp <= 0x0FFF) ||    // Tibetan
         (cp >= 0x1000 && cp <= 0x109F) ||    // Myanmar
         (cp >= 0x1780 && cp <= 0x17FF) ||    // Khmer
         (cp >= 0x19E0 && cp <= 0x19FF) ||    // Khmer symbols
         (cp >= 0x2E80 && cp <= 0x2FDF) ||    // CJK radicals, Kangxi
         (cp >= 0x3000 && cp <= 0x303F) ||    // CJK symbols and punctuation
         (cp >= 0x3040 && cp <= 0x31FF) ||    // Hiragana, Katakana, Bopomofo, Kanbun, ...
         (cp >= 0x3200 && cp <= 0x4DBF) ||    // enclosed CJK, compatibility, Ext A
         (cp >= 0x4E00 && cp <= 0x9FFF) ||    // CJK Unified Ideographs
         (cp >= 0xA000 && cp <= 0xA4CF) ||    // Yi
         (cp >= 0xF900 && cp <= 0xFAFF) ||    // CJK compatibility ideographs
         (cp >= 0xFE30 && cp <= 0xFE4F) ||    // CJK compatibility forms
         (cp >= 0xFF61 && cp <= 0xFF9F) ||    // halfwidth Katakana
         (cp >= 0x1B000 && cp <= 0x1B16F) ||  // Kana supplement / extended
         (cp >= 0x20000 && cp <= 0x3134F);    // CJK Ext B..G, compatibility supplement
}

namespace {

// Decodes one code point of valid UTF-8 at p; returns its length.
inline int decode(const unsigned char* p, uint32_t* cp) {
  unsigned char c = p[0];
  if (c < 0x80) {
    *cp = c;
    return 1;
  }
  if (c < 0xE0) {
    *cp = ((c & 0x1Fu) << 6) | (p[1] & 0x3Fu);
    return 2;
  }
  if (c < 0xF0) {
    *cp = ((c & 0x0Fu) << 12) | ((p[1] & 0x3Fu) << 6) | (p[2] & 0x3Fu);
    return 3;
  }
  *cp = ((c & 0x07u) << 18) | ((p[1] & 0x3Fu) << 12) | ((p[2] & 0x3Fu) << 6) | (p[3] & 0x3Fu);
  return 4;
}

}  // namespace

namespace {

// Index of the first byte in the 8 bytes at p that is ' ' or >= 0x80, or 8.
inline unsigned first_space_or_high(const unsigned char* p) {
  uint64_t v;
  std::memcpy(&v, p, 8);
  constexpr uint64_t kOnes = 0x0101010101010101ull, kHigh = 0x8080808080808080ull;
  uint64_t x = v ^ (kOnes * ' ');
  uint64_t space = (x - kOnes) & ~x & kHigh;  // exact for bytes < 0x80; high bytes caught below
  uint64_t hit = space | (v & kHigh);
  return hit ? static_cast<unsigned>(__builtin_ctzll(hit)) / 8 : 8;
}

}  // namespace

void shingle_units(std::string_view text, std::vector<UnitSpan>* units) {
  units->clear();
  const auto* s = reinterpret_cast<const unsigned char*>(text.data());
  const uint32_t n = static_cast<uint32_t>(text.size());
  uint32_t i = 0;
  while (i < n) {
    if (s[i] == ' ') {
      ++i;
      continue;
    }
    uint32_t run_start = i;
    while (i < n && s[i] != ' ') {
      if (s[i] < 0x80) {  // skip ASCII 8 bytes at a time
        while (i + 8 <= n) {
          unsigned k = first_space_or_high(s + i);
          i += k;
          if (k < 8) break;
        }
        while (i < n && s[i] < 0x80 && s[i] != ' ') ++i;
        continue;
      }
      uint32_t cp;
      int len = decode(s + i, &cp);
      if (is_spaceless_script(cp)) {
        if (run_start < i) units->push_back({run_start, i});
        units->push_back({i, i + static_cast<uint32_t>(len)});
        i += static_cast<uint32_t>(len);
        run_start = i;
      } else {
        i += static_cast<uint32_t>(len);
      }
    }
    if (run_start < i) units->push_back({run_start, i});
  }
}

void shingle_hashes(std::string_view text, int ngram, std::vector<uint64_t>* out) {
  out->clear();
  thread_local std::vector<UnitSpan> units;
  shingle_units(text, &units);
  if (units.empty()) return;
  const size_t n = static_cast<size_t>(ngram < 1 ? 1 : ngram);
  if (units.size() <= n) {
    out->push_back(XXH3_64bits(text.data() + units.front().begin,
                               units.back().end - units.front().begin));
    return;
  }
  out->resize(units.size() - n + 1);
  uint64_t* o = out->data();
  const UnitSpan* u = units.data();
  for (size_t i = 0; i + n <= units.size(); ++i)
    o[i] = XXH3_64bits(text.data() + u[i].begin, u[i + n - 1].end - u[i].begin);
}

}  // namespace kiln::prep
