#include "dataprep/tokenizer/pretokenize.h"

#include <utf8proc.h>

#include <array>

namespace kiln::prep {
namespace {

enum Cls : uint8_t { kLetter, kNumber, kSpace, kOther, kCjk };

struct Ch {
  Cls cls;
  uint8_t len;  // bytes
  int32_t cp;   // -1 for an invalid byte
};

bool is_white_space(int32_t cp) {
  // Unicode White_Space property (what \s means in the `regex` module GPT-2 used).
  return (cp >= 0x09 && cp <= 0x0D) || cp == 0x20 || cp == 0x85 || cp == 0xA0 || cp == 0x1680 ||
         (cp >= 0x2000 && cp <= 0x200A) || cp == 0x2028 || cp == 0x2029 || cp == 0x202F ||
         cp == 0x205F || cp == 0x3000;
}

Cls classify_cp(int32_t cp, bool kiln) {
  if (is_white_space(cp)) return kSpace;
  switch (utf8proc_category(cp)) {
    case UTF8PROC_CATEGORY_LU:
    case UTF8PROC_CATEGORY_LL:
    case UTF8PROC_CATEGORY_LT:
    case UTF8PROC_CATEGORY_LM:
    case UTF8PROC_CATEGORY_LO:
      return (kiln && is_cjk_codepoint(cp)) ? kCjk : kLetter;
    case UTF8PROC_CATEGORY_ND:
    case UTF8PROC_CATEGORY_NL:
    case UTF8PROC_CATEGORY_NO:
      return kNumber;
    case UTF8PROC_CATEGORY_MN:
    case UTF8PROC_CATEGORY_MC:
    case UTF8PROC_CATEGORY_ME:
      return kiln ? kLetter : kOther;
    default:
      return kOther;
  }
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

  static bool is_mark(int32_t cp) {
    auto cat = utf8proc_category(cp);
    return cat == UTF8PROC_CATEGORY_MN || cat == UTF8PROC_CATEGORY_MC ||
           cat == UTF8PROC_CATEGORY_ME;
  }

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
  return kind == PretokenizerKind::kGpt2 ? "gpt2" : "kiln-v1";
}

Result<PretokenizerKind> parse_pretokenizer_name(std::string_view name) {
  if (name == "gpt2") return PretokenizerKind::kGpt2;
  if (name == "kiln-v1") return PretokenizerKind::kKiln;
  return Status::data("unknown pre-tokenizer '" + std::string(name) +
                      "' (expected gpt2 or kiln-v1)");
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

void pretokenize(std::string_view text, const PretokenizerSpec& spec,
                 std::vector<std::string_view>* out) {
  Scanner(text, spec).run(out);
}

}  // namespace kiln::prep
