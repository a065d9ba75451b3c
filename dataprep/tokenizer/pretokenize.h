// Pre-tokenisation: splitting text into the "words" that byte-level BPE merges within.
//
// Two hand-written scanners over Unicode categories (utf8proc), no regex engine:
//
//  kGpt2  exactly GPT-2's pattern
//           's|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+
//         (\s = Unicode White_Space, as in the `regex` module GPT-2 used). Used for vocabularies
//         loaded from vocab.json + merges.txt so token ids match GPT-2's exactly.
//
//  kKiln  the default for tokenizers Kiln trains ("kiln-v1"). GPT-2's rules with four changes:
//         - CJK (Han ideographs, Hiragana, Katakana, Bopomofo) runs are words of their own, never
//           glued to Latin letters, digits or punctuation ("GPU训练" -> "GPU", "训练"); optionally
//           a run is cut into chunks of at most `cjk_chunk` characters (default 0: whole runs,
//           the best compression measured; see docs/TOKENIZER.md).
//         - digits are grouped in at most 3 (" 12345" -> " 123", "45"), as in modern tokenizers;
//         - combining marks (\p{M}) continue a letter run, so decomposed accents stay in words;
//         - contractions match case-insensitively, and a whitespace run holding line breaks
//           splits after its last line break ("\n\n    x" -> "\n\n", "   ", " x").
//
//  llama3 Llama 3's pattern (a kRegex spec, llama3_pattern()), the default for tokenizers Kiln
//         trains: llama.cpp knows it as the pre-tokenizer "llama-bpe", Hugging Face tokenizers as
//         a Split. Trained with it, a tokenizer also sets ignore_merges (a word in the vocabulary
//         is one token), as Llama 3's tokenizer.json does and llama.cpp always does for it.
//
//  kRegex any regular expression (a Hugging Face `Split` pre-tokenizer, "Isolated"), matched by
//         PCRE2 with JIT (regex_split.h). Both scanners above are also regular expressions
//         (gpt2_pattern(), kiln_v1_pattern()): a tokenizer.json naming one of those exact patterns
//         gets the hand-written scanner, which is faster and tested equal to the regex.
//
// Invalid UTF-8 bytes are single "other" characters, so the pieces always concatenate back to
// the input exactly (decode(encode(x)) == x holds for any bytes). Pure functions, thread-safe.
#pragma once

#include <cstdint>
#include <memory>
#include <string>
#include <string_view>
#include <vector>

#include "common/status.h"

namespace kiln::prep {

class RegexSplitter;

enum class PretokenizerKind { kGpt2, kKiln, kRegex };

struct PretokenizerSpec {
  PretokenizerKind kind = PretokenizerKind::kKiln;
  uint32_t cjk_chunk = 0;  // kKiln only: max CJK characters per piece (0 = whole runs)
  std::shared_ptr<const RegexSplitter> regex;  // kRegex only
};

// The regular expressions (Oniguruma / PCRE2 syntax, as in a tokenizer.json) that the two
// hand-written scanners implement exactly (on valid UTF-8).
std::string gpt2_pattern();
std::string kiln_v1_pattern(uint32_t cjk_chunk);
// Llama 3's pre-tokenizer regex, exactly as its tokenizer.json writes it.
std::string llama3_pattern();
// The llama3 spec (compiled once), the default of TokenizerTrainOptions.
const PretokenizerSpec& llama3_pretokenizer();
// The pattern of any spec (kRegex: the one it was compiled from).
std::string pretokenizer_pattern(const PretokenizerSpec& spec);
// The spec for a pattern: a hand-written scanner when the pattern is exactly one of theirs (and
// `fast_path`), else kRegex compiled with PCRE2 (data error when it does not compile).
Result<PretokenizerSpec> pretokenizer_for_pattern(std::string_view pattern, bool fast_path = true);

// "gpt2" / "kiln-v1" / "regex".
const char* pretokenizer_name(PretokenizerKind kind);
Result<PretokenizerKind> parse_pretokenizer_name(std::string_view name);
// A spec by name: "llama3" (also "llama-bpe"), "gpt2" or "kiln-v1" (with its cjk_chunk); data
// error otherwise.
Result<PretokenizerSpec> pretokenizer_by_name(std::string_view name, uint32_t cjk_chunk = 0);
// What a spec is called: "gpt2", "kiln-v1", "llama3" (a regex that is exactly Llama 3's), or
// "regex".
std::string pretokenizer_label(const PretokenizerSpec& spec);

// Appends the pieces of `text` to *out (views into `text`). The pieces are non-empty and
// concatenate to `text`. A data error only when a regex gives up (RegexSplitter::split).
Status pretokenize(std::string_view text, const PretokenizerSpec& spec,
                   std::vector<std::string_view>* out);

// True for a code point in the CJK ranges used by kKiln (and by the `zh` tagging rule).
bool is_cjk_codepoint(int32_t cp);

}  // namespace kiln::prep
