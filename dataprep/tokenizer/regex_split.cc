#include "dataprep/tokenizer/regex_split.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>

#include <algorithm>
#include <cstdio>

#include "dataprep/tokenizer/unicode_data.h"

namespace kiln::prep {
namespace {

// Unicode White_Space, as a character-class body (what Oniguruma's \s matches).
constexpr const char* kSpaceBody =
    "\\t-\\r\\x{20}\\x{85}\\x{A0}\\x{1680}\\x{2000}-\\x{200A}\\x{2028}\\x{2029}\\x{202F}"
    "\\x{205F}\\x{3000}";
constexpr const char* kWordBody = "\\p{L}\\p{M}\\p{Nd}\\p{Pc}";
constexpr const char* kHexBody = "0-9a-fA-F";

// The code points of a category that Unicode 16.0 (Oniguruma's tables) has and PCRE2 10.42's
// Unicode 14.0 lacks, as a character-class body.
std::string added_body(std::string_view cat) {
  std::string out;
  char buf[40];
  for (unicode::CpRange r : unicode::added_since_pcre2(cat)) {
    if (r.lo == r.hi)
      std::snprintf(buf, sizeof buf, "\\x{%X}", unsigned(r.lo));
    else
      std::snprintf(buf, sizeof buf, "\\x{%X}-\\x{%X}", unsigned(r.lo), unsigned(r.hi));
    out += buf;
  }
  return out;
}

// The category name of a \p escape at p[i] (p[i] is 'p' or 'P'): sets *len to the characters
// after the backslash it spans, *negated for \P or \p{^..}. "" when not a short category name.
std::string category_escape(std::string_view p, size_t i, size_t* len, bool* negated) {
  *negated = p[i] == 'P';
  if (i + 1 >= p.size()) return "";
  if (p[i + 1] != '{') {
    *len = 2;
    return std::string(1, p[i + 1]);
  }
  size_t close = p.find('}', i + 2);
  if (close == std::string_view::npos) return "";
  std::string name(p.substr(i + 2, close - i - 2));
  *len = close - i + 1;
  if (!name.empty() && name[0] == '^') {
    *negated = !*negated;
    name.erase(0, 1);
  }
  static const char* kNames[] = {"L",  "Lu", "Ll", "Lt", "Lm", "Lo", "M",  "Mn", "Mc", "Me", "N",
                                 "Nd", "Nl", "No", "P",  "Pc", "Pd", "Ps", "Pe", "Pi", "Pf", "Po",
                                 "S",  "Sm", "Sc", "Sk", "So", "Z",  "Zs", "Zl", "Zp"};
  for (const char* n : kNames)
    if (name == n) return name;
  return "";
}

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
      std::string cat_body;
      bool cat_negated = false;
      if (e == 'p' || e == 'P') {
        size_t len = 0;
        std::string cat = category_escape(p, i, &len, &cat_negated);
        if (!cat.empty()) {
          cat_body = "\\p{" + cat + "}" + added_body(cat);
          i += len - 1;
        }
      } else if (e == 'd' || e == 'D') {
        cat_body = "\\p{Nd}" + added_body("Nd");
        cat_negated = e == 'D';
      } else if (e == 'w' || e == 'W') {
        cat_body = std::string(kWordBody) + added_body("L") + added_body("M") + added_body("Nd") +
                   added_body("Pc");
        cat_negated = e == 'W';
      }
      const char* body = !cat_body.empty()      ? cat_body.c_str()
                         : e == 's' || e == 'S' ? kSpaceBody
                         : e == 'h' || e == 'H' ? kHexBody
                                                : nullptr;
      if (e == 'Q')
        return Status::data("\\Q...\\E quoting is not supported in a pre-tokenizer pattern");
      if (!body) {
        out += '\\';
        out += e;
        continue;
      }
      const bool negated = !cat_body.empty() ? cat_negated : e == 'S' || e == 'H';
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

namespace {
// PCRE2's match limit for one search from `pos`: generous for linear work on the rest of the text,
// small enough that catastrophic backtracking ends in well under a second.
uint32_t match_limit(size_t remaining) {
  return uint32_t(std::min<uint64_t>(10'000'000 + 64 * uint64_t(remaining), 2'000'000'000));
}
}  // namespace

Status RegexSplitter::find_matches(std::string_view text,
                                   std::vector<std::pair<size_t, size_t>>* out) const {
  auto* code = static_cast<const pcre2_code*>(code_);
  MatchState& st = match_state();
  const auto* subject = reinterpret_cast<PCRE2_SPTR>(text.data());
  const size_t n = text.size();
  size_t pos = 0;
  size_t last_end = SIZE_MAX;  // end of the last match (an empty match there is skipped)
  while (pos <= n) {
    pcre2_set_match_limit(st.context, match_limit(n - pos));
    int rc = jit_ ? pcre2_jit_match(code, subject, n, pos, 0, st.data, st.context)
                  : pcre2_match(code, subject, n, pos, 0, st.data, st.context);
    if (rc == PCRE2_ERROR_JIT_STACKLIMIT)  // the interpreter (heap memory) instead
      rc = pcre2_match(code, subject, n, pos, 0, st.data, st.context);
    if (rc == PCRE2_ERROR_NOMATCH) break;
    if (rc < 0) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(rc, msg, sizeof msg);
      return Status::data("pre-tokenizer pattern '" + pattern_ + "' failed at byte " +
                          std::to_string(pos) + " of a " + std::to_string(n) +
                          "-byte text: " + reinterpret_cast<const char*>(msg) +
                          (rc == PCRE2_ERROR_MATCHLIMIT || rc == PCRE2_ERROR_DEPTHLIMIT ||
                                   rc == PCRE2_ERROR_HEAPLIMIT
                               ? " (catastrophic backtracking: the pattern needs exponential "
                                 "time on this text)"
                               : ""));
    }
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(st.data);
    size_t s = ov[0], e = ov[1];
    if (e <= s) {  // an empty match: kept (as Oniguruma's iteration), unless right after a match
      if (s != last_end) out->emplace_back(s, s);
      if (s >= n) break;
      pos = s + char_len(text, s);
      continue;
    }
    out->emplace_back(s, e);
    last_end = pos = e;
  }
  return Status::ok();
}

Status RegexSplitter::split(std::string_view text, std::vector<std::string_view>* out) const {
  thread_local std::vector<std::pair<size_t, size_t>> matches;
  matches.clear();
  KILN_RETURN_IF_ERROR(find_matches(text, &matches));
  size_t prev = 0;
  for (auto [s, e] : matches) {
    if (e == s) continue;
    if (s > prev) out->push_back(text.substr(prev, s - prev));
    out->push_back(text.substr(s, e - s));
    prev = e;
  }
  if (prev < text.size()) out->push_back(text.substr(prev));
  return Status::ok();
}

}  // namespace kiln::prep
