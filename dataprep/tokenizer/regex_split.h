// Pre-tokenisation by an arbitrary regular expression (a Hugging Face `Split` pre-tokenizer with
// behavior "Isolated"): every match is a piece, and so is every stretch of text between matches.
// PCRE2 with its JIT compiler does the matching (Debian libpcre2-dev).
//
// Hugging Face tokenizers compile these patterns with Oniguruma (Ruby syntax). The patterns
// tokenizers ship (GPT-2, Llama 3, Qwen2, Mistral-Nemo) mean the same in PCRE2 with UTF and UCP
// except for a few escapes, which are rewritten before compiling so that they match what
// Oniguruma matches:
//   \s  Unicode White_Space (PCRE2's UCP \s lacks U+0085), \S its complement
//   \w  [\p{L}\p{M}\p{Nd}\p{Pc}], \W its complement
//   \h  a hexadecimal digit (PCRE2: horizontal space), \H its complement
// \S, \W and \H inside a character class, and \Q...\E, are refused (no equivalent in one class).
//
// Empty matches are skipped (as Hugging Face drops empty pieces). Invalid UTF-8 bytes never match
// a pattern character (PCRE2_MATCH_INVALID_UTF), so they end up in the stretches between matches:
// the pieces always concatenate back to the input. Thread-safe: each thread keeps its own match
// data and JIT stack.
#pragma once

#include <memory>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kiln::prep {

class RegexSplitter {
 public:
  // Usage-free: a pattern PCRE2 cannot compile is a data error (the caller names the file and
  // field) with PCRE2's message and offset.
  static Result<std::shared_ptr<const RegexSplitter>> compile(std::string_view pattern);
  ~RegexSplitter();
  RegexSplitter(const RegexSplitter&) = delete;
  RegexSplitter& operator=(const RegexSplitter&) = delete;

  // Appends the pieces of `text` (non-empty views into it, concatenating to it) to *out.
  // A data error naming the pattern when PCRE2 gives up (its match limit: catastrophic
  // backtracking, about a second at most).
  Status split(std::string_view text, std::vector<std::string_view>* out) const;
  // The matches [start, end) in order, as Oniguruma's iteration finds them: an empty match is
  // kept except right at the end of the previous match. Errors as split().
  Status find_matches(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const;

  const std::string& pattern() const { return pattern_; }  // as given (before rewriting)
  bool jit() const { return jit_; }

 private:
  RegexSplitter() = default;
  std::string pattern_;
  void* code_ = nullptr;  // pcre2_code_8*
  bool jit_ = false;
};

// The rewriting described above (exposed for tests). Data error for what cannot be rewritten.
Result<std::string> oniguruma_to_pcre2(std::string_view pattern);

}  // namespace kiln::prep
