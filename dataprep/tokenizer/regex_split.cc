#include "dataprep/tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

namespace kiln::prep {
namespace {

// Unicode White_Space, as a character-class body (what Oniguruma's \s matches).
constexpr const char* kSpaceBody =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr const char* kWordBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kHexBody = "0-9a-fA-F";

// Per-thread PCRE2 state: match data for one pair (the whole match is all a split needs) and a
// JIT stack larger than the default 32 KiB, for long runs under look-arounds.
struct MatchState {
  pcre2_match_data* data = nullptr;
  pcre2_match_context* context = nullptr;
  pcre2_jit_stack* stack = nullptr;
  MatchState() {
    data = pcre2_match_data_create(1, nullptr);
    context = pcre2_match_context_create(nullptr);
    stack = pcre2_jit_stack_create(64 * 1024, 8 * 1024 * 1024, nullptr);
    if (context && stack) pcre2_jit_stack_assign(context, nullptr, stack);
  }
  ~MatchState() {
    pcre2_jit_stack_free(stack);
    pcre2_match_context_free(context);
    pcre2_match_data_free(data);
  }
};

MatchState& match_state() {
  thread_local MatchState state;
  return state;
}

// Length of the UTF-8 character at s[i] (1 for an invalid byte).
size_t char_len(std::string_view s, size_t i) {
  auto b = static_cast<unsigned char>(s[i]);
  size_t len = b < 0x80 ? 1 : (b >> 5) == 0x6 ? 2 : (b >> 4) == 0xE ? 3 : (b >> 3) == 0x1E ? 4 : 1;
  if (i + len > s.size()) return 1;
  for (size_t k = 1; k < len; ++k)
    if ((static_cast<unsigned char>(s[i + k]) & 0xC0) != 0x80) return 1;
  return len;
}

}  // namespace

Result<std::string> oniguruma_to_pcre2(std::string_view p) {
  std::string out;
  out.reserve(p.size() + 64);
  int depth = 0;  // character-class nesting
  for (size_t i = 0; i < p.size(); ++i) {
    char c = p[i];
    if (c == '\\' && i + 1 < p.size()) {
      char e = p[i + 1];
      ++i;
      const char* body = e == 's' || e == 'S'   ? kSpaceBody
                         : e == 'w' || e == 'W' ? kWordBody
                         : e == 'h' || e == 'H' ? kHexBody
                                                : nullptr;
      if (e == 'Q')
        return Status::data("\\Q...\\E quoting is not supported in a pre-tokenizer pattern");
      if (!body) {
        out += '\\';
        out += e;
        continue;
      }
      const bool negated = e == 'S' || e == 'W' || e == 'H';
      if (depth > 0) {
        if (negated)
          return Status::data(std::string("\\") + e +
                              " inside a character class is not supported in a pre-tokenizer "
                              "pattern");
        out += body;
      } else {
        out += negated ? "[^" : "[";
        out += body;
        out += ']';
      }
      continue;
    }
    if (c == '[') {
      ++depth;
      out += c;
      // A ']' right after '[' or '[^' is a literal.
      if (i + 1 < p.size() && p[i + 1] == '^') out += p[++i];
      if (i + 1 < p.size() && p[i + 1] == ']') out += p[++i];
      continue;
    }
    if (c == ']' && depth > 0) --depth;
    out += c;
  }
  return out;
}

Result<std::shared_ptr<const RegexSplitter>> RegexSplitter::compile(std::string_view pattern) {
  KILN_ASSIGN_OR_RETURN(std::string rewritten, oniguruma_to_pcre2(pattern));
  int error = 0;
  PCRE2_SIZE offset = 0;
  pcre2_code* code =
      pcre2_compile(reinterpret_cast<PCRE2_SPTR>(rewritten.data()), rewritten.size(),
                    PCRE2_UTF | PCRE2_UCP | PCRE2_MATCH_INVALID_UTF, &error, &offset, nullptr);
  if (!code) {
    PCRE2_UCHAR msg[256];
    pcre2_get_error_message(error, msg, sizeof msg);
    return Status::data("pattern '" + std::string(pattern) + "' does not compile: " +
                        reinterpret_cast<const char*>(msg) + " (at offset " +
                        std::to_string(offset) + " of the rewritten pattern '" + rewritten + "')");
  }
  std::shared_ptr<RegexSplitter> s(new RegexSplitter());
  s->pattern_ = std::string(pattern);
  s->code_ = code;
  s->jit_ = pcre2_jit_compile(code, PCRE2_JIT_COMPLETE) == 0;
  return std::shared_ptr<const RegexSplitter>(std::move(s));
}

RegexSplitter::~RegexSplitter() { pcre2_code_free(static_cast<pcre2_code*>(code_)); }

void RegexSplitter::split(std::string_view text, std::vector<std::string_view>* out) const {
  auto* code = static_cast<const pcre2_code*>(code_);
  MatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0, prev = 0;
  while (pos < n) {
    int rc = jit_ ? pcre2_jit_match(code, subject, n, pos, 0, st.data, st.context)
                  : pcre2_match(code, subject, n, pos, 0, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0 && jit_)  // e.g. the JIT stack ran out: the interpreter (heap memory) instead
      rc = pcre2_match(code, subject, n, pos, 0, st.data, nullptr);
    if (rc < 0) {
      // Nothing matched here (an error of the engine): this character is a piece of its own.
      size_t len = char_len(text, pos);
      if (pos > prev) out->push_back(text.substr(prev, pos - prev));
      out->push_back(text.substr(pos, len));
      prev = pos = pos + len;
      continue;
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t s = ov[0], e = ov[1];
    if (e <= s) {  // empty match: skipped
      pos = s + (s < n ? char_len(text, s) : 1);
      continue;
    }
    if (s > prev) out->push_back(text.substr(prev, s - prev));
    out->push_back(text.substr(s, e - s));
    prev = pos = e;
  }
  if (prev < n) out->push_back(text.substr(prev));
}

}  // namespace kiln::prep
