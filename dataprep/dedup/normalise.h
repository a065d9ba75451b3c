// Text normalisation for duplicate detection only (the shards keep the original text).
//
// normalise_for_dedup(): Unicode NFKC with case folding (utf8proc), default-ignorable code points
// (soft hyphen, zero-width space, ...) removed, every run of white space (Unicode Z* and the
// ASCII/Unicode control spaces) collapsed to one U+0020, leading and trailing space trimmed, and
// optionally every punctuation code point (Unicode categories Pc Pd Ps Pe Pi Pf Po) deleted.
// ASCII words take a fast path that gives exactly the same bytes as the general path.
// Input must be valid UTF-8 (the readers guarantee it). Thread-safe; allocation-free once `out`
// and the per-thread scratch buffers have grown.
#pragma once

#include <string>
#include <string_view>

namespace kiln::prep {

struct NormaliseOptions {
  bool strip_punct = false;
};

// Writes the normalised form of `text` into *out (cleared first).
void normalise_for_dedup(std::string_view text, const NormaliseOptions& options, std::string* out);

// The reference implementation: utf8proc over the whole text, then one pass of whitespace and
// punctuation handling. Same result as normalise_for_dedup(); used by tests and the benchmark.
std::string normalise_for_dedup_reference(std::string_view text, const NormaliseOptions& options);

}  // namespace kiln::prep
