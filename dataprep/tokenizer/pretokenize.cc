#include "dataprep/tokenizer/pretokenize.h"

#include <utf8proc.h>

#include <array>

#include "dataprep/tokenizer/regex_split.h"
#include "dataprep/tokenizer/unicode_data.h"

namespace kiln::prep {
namespace {

enum Cls : uint8_t { kLetter, kNumber, kSpace, kOther, kCjk };

struct Ch {
  Cls cls;
  uint8_t len;  // bytes
  int32_t cp;   // -1 for an invalid byte
};

// Categories of Unicode 16.0, as the regex engine of Hugging Face tokenizers has them
// (unicode_data.h); \s is Unicode White_Space (as in the `regex` module GPT-2 used).
Cls classify_cp(int32_t cp, bool kiln) {
  if (unicode::is_white_space(cp)) return kSpace;
  const unicode::Gc g = unicode::category(cp);
  if (unicode::is_letter(g)) return (kiln && is_cjk_codepoint(cp)) ? kCjk : kLetter;
  if (unicode::is_number(g)) return kNumber;
  if (unicode::is_mark(g)) return kiln ? kLetter : kOther;
  return kOther;
}

std::array<Cls, 128> make_ascii_table() {
  std::array<Cls, 128> t{};
  for (int c = 0; c < 128; ++c) t[c] = classify_cp(c, false);
  return t;
}
const std::array<Cls, 128> kAscii = make_ascii_table();

inline Ch char_at(const char* p, size_t n, bool kiln) {
  auto b = static_cast<unsigned char>(*p);
  if (b < 0x80) return {kAscii[b], 1, b};
  utf8proc_int32_t cp;
  utf8proc_ssize_t len =
      utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(p), static_cast<utf8proc_ssize_t>(n), &cp);
  if (len <= 0) return {kOther, 1, -1};
  return {classify_cp(cp, kiln), static_cast<uint8_t>(len), cp};
}

inline char lower_ascii(char c) { return (c >= 'A' && c <= 'Z') ? char(c - 'A' + 'a') : c; }

// Length of a contraction ('s 't 're 've 'm 'll 'd) at text[i] (which is '\''), or 0.
size_t contraction_len(std::string_view text, size_t i, bool case_insensitive) {
  auto at = [&](size_t k) -> char {
    if (i + k >= text.size()) return 0;
    return case_insensitive ? lower_ascii(text[i + k]) : text[i + k];
  };
  char c1 = at(1);
  if (c1 == 's' || c1 == 't' || c1 == 'm' || c1 == 'd') return 2;
  char c2 = at(2);
  if ((c1 == 'r' || c1 == 'v') && c2 == 'e') return 3;
  if (c1 == 'l' && c2 == 'l') return 3;
  return 0;
}

class Scanner {
 public:
  Scanner(std::string_view text, const PretokenizerSpec& spec)
      : text_(text), kiln_(spec.kind == PretokenizerKind::kKiln), cjk_chunk_(spec.cjk_chunk) {}

  void run(std::vector<std::string_view>* out) {
    size_t i = 0;
    const size_t n = text_.size();
    while (i < n) {
      size_t end = next_piece(i);
      out->push_back(text_.substr(i, end - i));
      i = end;
    }
  }

 private:
  Ch at(size_t i) const { return char_at(text_.data() + i, text_.size() - i, kiln_); }

  // End of a run of class `cls` starting at i; for numbers and CJK in kiln mode the run is capped.
  size_t run_end(size_t i, Cls cls) const {
    size_t limit = 0;
    if (kiln_ && cls == kNumber) limit = 3;
    if (kiln_ && cls == kCjk) limit = cjk_chunk_;
    size_t count = 0;
    while (i < text_.size()) {
      Ch c = at(i);
      if (c.cls != cls) {
        // A combining mark (kLetter in kiln mode) continues a CJK run without counting.
        if (!(kiln_ && cls == kCjk && c.cls == kLetter && c.cp >= 0 && is_mark(c.cp))) break;
      } else {
        if (limit && count == limit) break;
        ++count;
      }
      i += c.len;
    }
    return i;
  }

  static bool is_mark(int32_t cp) { return unicode::is_mark(unicode::category(cp)); }

  size_t next_piece(size_t i) const {
    const size_t n = text_.size();
    if (text_[i] == '\'') {
      size_t len = contraction_len(text_, i, kiln_);
      if (len) return i + len;
    }
    Ch c = at(i);
    size_t start = i;
    if (text_[i] == ' ' && i + 1 < n) {
      Ch next = at(i + 1);
      if (next.cls != kSpace) {  // " ?X" with X a letter, number, CJK or other run
        return run_end(i + 1, next.cls);
      }
    }
    if (c.cls != kSpace) return run_end(start, c.cls);

    // Whitespace run [i, j).
    size_t j = i;
    size_t last_break_end = 0;
    while (j < n) {
      Ch w = at(j);
      if (w.cls != kSpace) break;
      j += w.len;
      if (kiln_ && (w.cp == '\n' || w.cp == '\r')) last_break_end = j;
    }
    if (kiln_ && last_break_end) return last_break_end;  // \s*[\r\n]+
    if (j == n) return j;                                // \s+(?!\S) at the end of the text
    // \s+(?!\S): the run minus its last character, when that leaves at least one character;
    // otherwise \s+ takes the single character.
    size_t last_start = j - 1;
    while (last_start > i && (static_cast<unsigned char>(text_[last_start]) & 0xC0) == 0x80)
      --last_start;
    return last_start > i ? last_start : j;
  }

  std::string_view text_;
  bool kiln_;
  uint32_t cjk_chunk_;
};

}  // namespace

const char* pretokenizer_name(PretokenizerKind kind) {
  switch (kind) {
    case PretokenizerKind::kGpt2:
      return "gpt2";
    case PretokenizerKind::kKiln:
      return "kiln-v1";
    case PretokenizerKind::kRegex:
      return "regex";
  }
  return "?";
}

std::string gpt2_pattern() {
  return R"('s|'t|'re|'ve|'m|'ll|'d| ?\p{L}+| ?\p{N}+| ?[^\s\p{L}\p{N}]+|\s+(?!\S)|\s+)";
}

std::string llama3_pattern() {
  return R"((?i:'s|'t|'re|'ve|'m|'ll|'d)|[^\r\n\p{L}\p{N}]?\p{L}+|\p{N}{1,3}| ?[^\s\p{L}\p{N}]+[\r\n]*|\s*[\r\n]+|\s+(?!\S)|\s+)";
}

namespace {
// kiln-v1 in pieces: White_Space spelled out (the same set in Oniguruma and PCRE2), the CJK ranges
// of is_cjk_codepoint(), letters = \p{L} outside them or \p{M}; the CJK run's quantifier goes
// between the two halves.
constexpr const char* kSpaceClass =
    R"(\t-\r\x{20}\x{85}\x{A0}\x{1680}\x{2000}-\x{200A}\x{2028}\x{2029}\x{202F}\x{205F}\x{3000})";
constexpr const char* kCjkClass =
    R"(\x{3400}-\x{4DBF}\x{4E00}-\x{9FFF}\x{F900}-\x{FAFF}\x{20000}-\x{3134F}\x{3040}-\x{30FF})"
    R"(\x{31F0}-\x{31FF}\x{3100}-\x{312F}\x{FF66}-\x{FF9D}\x{3005}\x{3006})";
std::string kiln_v1_head() {
  const std::string cjk = kCjkClass;
  return R"('(?:[sStTmMdD]|[rRvV][eE]|[lL][lL])| ?(?:(?:\p{M}|(?![)" + cjk + R"(])\p{L})+)" +
         R"(|\p{N}{1,3}|(?:(?=\p{L})[)" + cjk + R"(]\p{M}*))";
}
std::string kiln_v1_tail() {
  const std::string s = kSpaceClass;
  return "|[^" + s + R"(\p{L}\p{M}\p{N}]+)|[)" + s + R"(]*[\r\n]|[)" + s + "]+(?![^" + s + "])|[" +
         s + "]+";
}
}  // namespace

std::string kiln_v1_pattern(uint32_t cjk_chunk) {
  return kiln_v1_head() + (cjk_chunk ? "{1," + std::to_string(cjk_chunk) + "}" : "+") +
         kiln_v1_tail();
}

std::string pretokenizer_pattern(const PretokenizerSpec& spec) {
  switch (spec.kind) {
    case PretokenizerKind::kGpt2:
      return gpt2_pattern();
    case PretokenizerKind::kKiln:
      return kiln_v1_pattern(spec.cjk_chunk);
    case PretokenizerKind::kRegex:
      return spec.regex ? spec.regex->pattern() : std::string();
  }
  return {};
}

Result<PretokenizerSpec> pretokenizer_for_pattern(std::string_view pattern, bool fast_path) {
  PretokenizerSpec spec;
  if (fast_path) {
    if (pattern == gpt2_pattern()) {
      spec.kind = PretokenizerKind::kGpt2;
      return spec;
    }
    const std::string head = kiln_v1_head(), tail = kiln_v1_tail();
    if (pattern.size() > head.size() + tail.size() && pattern.starts_with(head) &&
        pattern.ends_with(tail)) {
      std::string_view q = pattern.substr(head.size(), pattern.size() - head.size() - tail.size());
      uint32_t chunk = 0;
      bool ok = q == "+";
      if (!ok && q.size() > 4 && q.starts_with("{1,") && q.ends_with("}")) {
        std::string digits(q.substr(3, q.size() - 4));
        ok = !digits.empty() && digits.size() <= 4 &&
             digits.find_first_not_of("0123456789") == std::string::npos && digits[0] != '0';
        if (ok) chunk = uint32_t(std::stoul(digits));
      }
      if (ok && kiln_v1_pattern(chunk) == pattern) {
        spec.kind = PretokenizerKind::kKiln;
        spec.cjk_chunk = chunk;
        return spec;
      }
    }
  }
  KILN_ASSIGN_OR_RETURN(spec.regex, RegexSplitter::compile(pattern));
  spec.kind = PretokenizerKind::kRegex;
  return spec;
}

Result<PretokenizerKind> parse_pretokenizer_name(std::string_view name) {
  if (name == "gpt2") return PretokenizerKind::kGpt2;
  if (name == "kiln-v1") return PretokenizerKind::kKiln;
  return Status::data("unknown pre-tokenizer '" + std::string(name) +
                      "' (expected gpt2 or kiln-v1)");
}

const PretokenizerSpec& llama3_pretokenizer() {
  static const PretokenizerSpec spec = [] {
    auto s = pretokenizer_for_pattern(llama3_pattern());
    KILN_CHECK(s.is_ok(), "Llama 3's pre-tokenizer pattern does not compile");
    return std::move(s).value();
  }();
  return spec;
}

Result<PretokenizerSpec> pretokenizer_by_name(std::string_view name, uint32_t cjk_chunk) {
  if (name == "llama3" || name == "llama-bpe") return llama3_pretokenizer();
  PretokenizerSpec spec;
  if (name != "gpt2" && name != "kiln-v1")
    return Status::data("unknown pre-tokenizer '" + std::string(name) +
                        "' (expected llama3, gpt2 or kiln-v1)");
  KILN_ASSIGN_OR_RETURN(spec.kind, parse_pretokenizer_name(name));
  spec.cjk_chunk = spec.kind == PretokenizerKind::kKiln ? cjk_chunk : 0;
  return spec;
}

std::string pretokenizer_label(const PretokenizerSpec& spec) {
  if (spec.kind == PretokenizerKind::kRegex && spec.regex &&
      spec.regex->pattern() == llama3_pattern())
    return "llama3";
  return pretokenizer_name(spec.kind);
}

bool is_cjk_codepoint(int32_t cp) {
  return (cp >= 0x3400 && cp <= 0x4DBF) ||    // CJK Extension A
         (cp >= 0x4E00 && cp <= 0x9FFF) ||    // CJK Unified Ideographs
         (cp >= 0xF900 && cp <= 0xFAFF) ||    // Compatibility Ideographs
         (cp >= 0x20000 && cp <= 0x3134F) ||  // Extensions B-G, Compatibility Supplement
         (cp >= 0x3040 && cp <= 0x30FF) ||    // Hiragana, Katakana
         (cp >= 0x31F0 && cp <= 0x31FF) ||    // Katakana Phonetic Extensions
         (cp >= 0x3100 && cp <= 0x312F) ||    // Bopomofo
         (cp >= 0xFF66 && cp <= 0xFF9D) ||    // Halfwidth Katakana
         cp == 0x3005 || cp == 0x3006;        // 々 〆
}

Status pretokenize(std::string_view text, const PretokenizerSpec& spec,
                   std::vector<std::string_view>* out) {
  if (spec.kind == PretokenizerKind::kRegex) return spec.regex->split(text, out);
  Scanner(text, spec).run(out);
  return Status::ok();
}

}  // namespace kiln::prep
