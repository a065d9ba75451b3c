// Unicode character data at the versions Hugging Face tokenizers 0.23 uses, so that Kiln's
// tokenizers give its ids (docs/TOKENIZER.md, "Unicode versions"). Generated tables:
// unicode/tables.inc (unicode/gen_tables.mjs, from the Unicode Character Database).
//   - General_Category: Unicode 16.0, as Oniguruma 6.9.10 (Hugging Face's Split regexes) has it;
//   - the code points a category gained from 14.0 (PCRE2 10.42's tables) to 16.0, which Kiln adds
//     to the \p{..} classes of patterns it compiles with PCRE2;
//   - normalization (NFC, NFD, NFKC, NFKD): utf8proc (Unicode 15.0) with the code points
//     unassigned in Unicode 9.0 (Hugging Face's unicode-normalization-alignments 0.1.12 tables)
//     left as they are.
#pragma once

#include <cstdint>
#include <string_view>
#include <utility>
#include <vector>

namespace kiln::prep::unicode {

// General categories in the order of the generated table; kCn = unassigned.
enum Gc : uint8_t {
  kLu,
  kLl,
  kLt,
  kLm,
  kLo,
  kMn,
  kMc,
  kMe,
  kNd,
  kNl,
  kNo,
  kPc,
  kPd,
  kPs,
  kPe,
  kPi,
  kPf,
  kPo,
  kSm,
  kSc,
  kSk,
  kSo,
  kZs,
  kZl,
  kZp,
  kCc,
  kCf,
  kCs,
  kCo,
  kCn = 255
};

struct CpRange {
  int32_t lo, hi;  // inclusive
};

// General_Category of a code point in Unicode 16.0 (kCn for out of range / unassigned).
Gc category(int32_t cp);
inline bool is_letter(Gc g) { return g <= kLo; }
inline bool is_mark(Gc g) { return g >= kMn && g <= kMe; }
inline bool is_number(Gc g) { return g >= kNd && g <= kNo; }
inline bool is_punctuation(Gc g) { return g >= kPc && g <= kPo; }
inline bool is_symbol(Gc g) { return g >= kSm && g <= kSo; }
// Unicode White_Space (the same in every version since 6.0).
bool is_white_space(int32_t cp);

// The code points of category `name` (one letter: L, M, N, P, S, Z, C; or two letters: Lu, ...)
// in Unicode 16.0 that PCRE2 10.42 (Unicode 14.0) does not put in it. Empty for an unknown name.
std::vector<CpRange> added_since_pcre2(std::string_view name);

// True for a code point unassigned in Unicode 9.0 (normalization leaves it alone).
bool new_since_unicode9(int32_t cp);

}  // namespace kiln::prep::unicode
