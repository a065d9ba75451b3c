// SentencePiece's precompiled normalization map ("precompiled_charsmap": in a .model's
// NormalizerSpec, and base64 in a tokenizer.json "Precompiled" normalizer), read and checked.
//
// The blob: a little-endian uint32 N, then N bytes of a darts-clone double-array trie (uint32
// units) over UTF-8 keys whose values are offsets into the rest of the blob, a list of
// NUL-terminated replacement strings. parse() checks every reachable trie node and value
// before the map is used (the library itself does not: a corrupt map crashes it), so it is safe
// on untrusted bytes; usable from a fuzzer.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kiln::prep {

class PrecompiledCharsmap {
 public:
  // Data error naming what is wrong (sizes, a node or value outside the blob, an unterminated
  // replacement).
  static Result<std::shared_ptr<const PrecompiledCharsmap>> parse(std::string_view blob);
  // Checks a blob without keeping it (the .model checks, sentencepiece.cc).
  static Status validate(std::string_view blob);

  // Hugging Face's Precompiled normalizer: per extended grapheme cluster shorter than 6 bytes,
  // the replacement of its shortest matching prefix replaces it whole; else per character.
  std::string normalize(std::string_view text) const;

 private:
  // The replacement of the shortest key that is a prefix of `s`, or nullptr.
  const char* transform(std::string_view s) const;
  std::vector<uint32_t> units_;
  std::string strings_;
};

// Checks the wire format of a SentencePiece ModelProto (every length inside its message) and the
// precompiled charsmaps of its normalizer and denormalizer specs, before libsentencepiece sees it.
Status validate_sentencepiece_model(std::string_view bytes);

}  // namespace kiln::prep
