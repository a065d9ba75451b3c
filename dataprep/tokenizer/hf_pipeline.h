// The parts of a Hugging Face tokenizer.json around its model, as Hugging Face tokenizers defines
// them: normalizers, pre-tokenizers and decoders (docs/TOKENIZER.md lists each with its fields).
// Built from the JSON by hf_json.cc; used by tokenizer.cc. Internal to dataprep/tokenizer/.
//
// Text is UTF-8; bytes that are not valid UTF-8 (Hugging Face never sees them: its input is a
// string) pass every step unchanged, as characters of no class.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kiln::prep {

class RegexSplitter;

// A pattern of a Replace normalizer or a Split pre-tokenizer: {"String": s} or {"Regex": r}.
struct HfPattern {
  std::string literal;                         // String
  std::shared_ptr<const RegexSplitter> regex;  // Regex (PCRE2, Oniguruma-compatible)
  // The matches [start, end) in text, left to right, non-overlapping.
  Status find(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;
};

struct NormalizerStep {
  enum Kind { kNfc, kNfd, kNfkc, kNfkd, kLowercase, kReplace, kPrepend, kStrip, kPrecompiled };
  Kind kind = kNfc;
  HfPattern pattern;                 // kReplace
  std::string content;               // kReplace: the replacement; kPrepend: the prefix
  bool left = false, right = false;  // kStrip
  std::shared_ptr<const class PrecompiledCharsmap> charsmap;  // kPrecompiled
};

// A normalizer: its steps in order (a Sequence flattened).
struct HfNormalizer {
  std::vector<NormalizerStep> steps;
  Status apply(std::string_view text, std::string* out) const;
};

// Unicode normalization with Hugging Face's tables (unicode_data.h): NFC, NFD, NFKC or NFKD.
std::string unicode_normalize(std::string_view text, NormalizerStep::Kind form);

enum class SplitBehavior { kRemoved, kIsolated, kMergedWithPrevious, kMergedWithNext, kContiguous };

struct PreTokenizerStep {
  enum Kind {
    kSplit,
    kDigits,
    kPunctuation,
    kWhitespace,
    kWhitespaceSplit,
    kMetaspace,
    kByteLevel
  };
  Kind kind = kSplit;
  HfPattern pattern;                                           // kSplit
  SplitBehavior behavior = SplitBehavior::kIsolated;           // kSplit, kPunctuation
  bool invert = false;                                         // kSplit
  bool individual_digits = false;                              // kDigits
  std::string replacement;                                     // kMetaspace
  enum Prepend { kAlways, kFirst, kNever } prepend = kAlways;  // kMetaspace
  bool split = true;                                           // kMetaspace
  bool add_prefix_space = false, use_regex = true;             // kByteLevel
};

// One piece of pre-tokenized text and whether it starts the document (Metaspace "first").
struct Piece {
  std::string text;
  bool first = false;
};

// A pre-tokenizer: its steps in order (a Sequence flattened); ByteLevel only as the last.
struct HfPreTokenizer {
  std::vector<PreTokenizerStep> steps;
  // Splits `text` (first: it starts the document) into *out (non-empty pieces, appended).
  Status apply(std::string_view text, bool first, std::vector<Piece>* out) const;
};

struct DecoderStep {
  enum Kind { kByteLevel, kReplace, kByteFallback, kFuse, kStrip, kMetaspace };
  Kind kind = kByteLevel;
  std::string pattern, content;  // kReplace (String patterns); kStrip: content = the character
  size_t start = 0, stop = 0;    // kStrip
  std::string replacement;       // kMetaspace
  bool prepend = true;           // kMetaspace: prepend_scheme != never
};

// A decoder: steps applied in order to the list of token strings, which are then concatenated.
struct HfDecoder {
  std::vector<DecoderStep> steps;
  // tokens: the vocabulary spellings of the ids (byte-level tokens already as their bytes).
  std::string decode(std::vector<std::string> tokens) const;
};

}  // namespace kiln::prep
