// Shingles of normalised text, hashed to 64 bits for MinHash.
//
// Units: the text is cut at spaces into words; inside a word, every code point of a script
// written without spaces between words (Han, Hiragana, Katakana, Bopomofo, Thai, Lao, Khmer,
// Myanmar, Tibetan, Yi, CJK symbols) is a unit of its own, and each run of other code points is
// one unit. So English gets word n-grams, Chinese character n-grams, and mixed text both.
// A shingle is n consecutive units; its hash is XXH3-64 (seed 0) of the normalised bytes from
// the first unit's start to the last unit's end (so "a b" and "ab" differ). A text with fewer
// than n units (but at least one) has one shingle holding all its units; an empty text has none.
// Input: the output of normalise_for_dedup() (valid UTF-8, single spaces). Thread-safe.
#pragma once

#include <cstdint>
#include <string_view>
#include <vector>

namespace kiln::prep {

// True for code points of scripts written without spaces between words (see above).
bool is_spaceless_script(uint32_t cp);

// Appends the shingle hashes of `normalised` to *out (cleared first), in text order.
void shingle_hashes(std::string_view normalised, int ngram, std::vector<uint64_t>* out);

// The units' byte ranges [begin, end) (exposed for tests and the reference implementation).
struct UnitSpan {
  uint32_t begin;
  uint32_t end;
};
void shingle_units(std::string_view normalised, std::vector<UnitSpan>* units);

}  // namespace kiln::prep
