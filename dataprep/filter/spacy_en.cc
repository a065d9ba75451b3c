// spaCy 3.8's rule-based tokenizer and Sentencizer for English (spacy_en.h), written from
// spacy/tokenizer.pyx (_tokenize_affixes, _split_affixes, _attach_tokens, _apply_special_cases,
// _filter_special_spans), spacy/matcher/phrasematcher.pyx and spacy/pipeline/sentencizer.pyx.
#include "dataprep/filter/spacy_en.h"

#define PCRE2_CODE_UNIT_WIDTH 8
#include <pcre2.h>
#include <utf8proc.h>

#include <algorithm>
#include <atomic>
#include <cstring>
#include <stdexcept>
#include <string>
#include <unordered_map>
#include <unordered_set>

#include "dataprep/filter/text.h"

namespace kiln::prep::filter::spacy {
namespace {

#include "dataprep/filter/spacy_en_rules.inc"

// Decodes the code point at p (valid UTF-8), setting *n to its length.
inline char32_t decode_at(const unsigned char* p, uint32_t* n) {
  const unsigned c = p[0];
  if (c < 0x80) {
    *n = 1;
    return c;
  }
  if (c < 0xE0) {
    *n = 2;
    return (c & 0x1F) << 6 | (p[1] & 0x3F);
  }
  if (c < 0xF0) {
    *n = 3;
    return (c & 0x0F) << 12 | (p[1] & 0x3F) << 6 | (p[2] & 0x3F);
  }
  *n = 4;
  return (c & 0x07) << 18 | (p[1] & 0x3F) << 12 | (p[2] & 0x3F) << 6 | (p[3] & 0x3F);
}

struct Piece {
  uint32_t begin, end;  // bytes, relative to the run
};

struct StringHash {
  using is_transparent = void;
  size_t operator()(std::string_view s) const { return std::hash<std::string_view>{}(s); }
};

class Regex {
 public:
  Regex(const char* pattern, uint32_t match_limit = 0) {
    int err = 0;
    PCRE2_SIZE at = 0;
    code_ = pcre2_compile(reinterpret_cast<PCRE2_SPTR>(pattern), PCRE2_ZERO_TERMINATED,
                          PCRE2_UTF | PCRE2_UCP | PCRE2_NO_UTF_CHECK, &err, &at, nullptr);
    if (!code_) {
      PCRE2_UCHAR msg[256];
      pcre2_get_error_message(err, msg, sizeof msg);
      throw std::runtime_error(std::string("spaCy rule regex: ") + reinterpret_cast<char*>(msg) +
                               " at " + std::to_string(at));
    }
    pcre2_jit_compile(code_, PCRE2_JIT_COMPLETE);
    if (match_limit) {
      context_ = pcre2_match_context_create(nullptr);
      pcre2_set_match_limit(context_, match_limit);
      pcre2_set_depth_limit(context_, match_limit);
    }
  }
  ~Regex() {
    pcre2_code_free(code_);
    pcre2_match_context_free(context_);
  }
  Regex(const Regex&) = delete;
  Regex& operator=(const Regex&) = delete;

  // Python's pattern.search(subject[from:]) seen from subject (lookbehinds see before `from`):
  // the first match at or after from, as [*b, *e); false when none (or past the match limit).
  bool search(std::string_view subject, size_t from, uint32_t options, size_t* b, size_t* e) const {
    pcre2_match_data* md = match_data();
    const int rc = pcre2_match(code_, reinterpret_cast<PCRE2_SPTR>(subject.data()), subject.size(),
                               from, options | PCRE2_NO_UTF_CHECK, md, context_);
    if (rc < 0) return false;
    const PCRE2_SIZE* ov = pcre2_get_ovector_pointer(md);
    *b = ov[0];
    *e = ov[1];
    return true;
  }

 private:
  pcre2_match_data* match_data() const {
    thread_local struct Holder {
      pcre2_match_data* md = pcre2_match_data_create(4, nullptr);
      ~Holder() { pcre2_match_data_free(md); }
    } h;
    return h.md;
  }
  pcre2_code* code_ = nullptr;
  pcre2_match_context* context_ = nullptr;
};

constexpr size_t kSuffixWindow = 32;  // bytes (a suffix rule other than "\.\.+" matches <= 12)

class Rules {
 public:
  Rules()
      : prefix_(kSpacyPrefixes),
        suffix_(kSpacySuffixes),
        infix_(kSpacyInfixes),
        url_(kSpacyUrlMatch, 1000000) {
    for (const auto& [key, pieces] : kSpacySpecials) {
      std::vector<Piece> cut;
      uint32_t at = 0, start = 0;
      for (const char* p = pieces; *p; ++p) {
        if (*p == '\x01') {
          cut.push_back({start, at});
          start = at;
        } else {
          ++at;
        }
      }
      const std::string k(key);
      max_special_ = std::max(max_special_, k.size());
      specials_[k] = std::move(cut);
      // (add_special_case: a special case that affixes or infixes would split, or that holds a
      // space, is also matched over the token sequence, as the tokens it would get without the
      // special cases)
      size_t b, e;
      std::vector<Piece> none;
      if (find_prefix(k) || infix_.search(k, 0, 0, &b, &e) || find_suffix(k) ||
          k.find(' ') != std::string::npos) {
        std::vector<Token> toks;
        tokenize(k, false, &toks);
        if (toks.empty()) continue;
        int node = 0;
        for (const Token& t : toks) {
          const std::string piece = k.substr(t.begin, t.end - t.begin);
          if (node == 0) first_bytes_[static_cast<unsigned char>(piece[0])] = true;
          auto it = trie_[node].next.find(piece);
          if (it == trie_[node].next.end()) {
            trie_.push_back({});
            it = trie_[node].next.emplace(piece, static_cast<int>(trie_.size() - 1)).first;
          }
          node = it->second;
        }
        trie_[node].terminal = true;
      }
    }
  }

  const std::vector<Piece>* special(std::string_view s) const {
    if (s.size() > max_special_) return nullptr;
    auto it = specials_.find(s);
    return it == specials_.end() ? nullptr : &it->second;
  }

  // tokenizer._tokenize_affixes(text, with_special_cases), appended to *out.
  void tokenize(std::string_view text, bool with_specials, std::vector<Token>* out) const;
  // The phrase-matcher pass (_apply_special_cases) over *toks.
  void apply_special_cases(std::string_view text, std::vector<Token>* toks) const;
  // One run's tokens (relative to the run), memoised when `memo`.
  void run_tokens(std::string_view run, bool with_specials, std::vector<Piece>* out) const;

 private:
  size_t find_prefix(std::string_view s) const {
    size_t b, e;
    return prefix_.search(s, 0, 0, &b, &e) ? e - b : 0;
  }
  size_t find_suffix(std::string_view s) const {
    size_t b, e;
    if (s.size() > kSuffixWindow) {
      size_t from = s.size() - kSuffixWindow;
      while ((static_cast<unsigned char>(s[from]) & 0xC0) == 0x80) ++from;
      // (a match that starts after the window's start is the leftmost one: every rule that
      // could start earlier and still reach the end is "\.\.+", which would then match at the
      // window's start)
      if (suffix_.search(s, from, 0, &b, &e) && b > from) return e - b;
    }
    return suffix_.search(s, 0, 0, &b, &e) ? e - b : 0;
  }
  void chunk(std::string_view run, bool with_specials, std::vector<Piece>* out) const;

  struct Node {
    std::unordered_map<std::string, int, StringHash, std::equal_to<>> next;
    bool terminal = false;
  };
  Regex prefix_, suffix_, infix_, url_;
  std::unordered_map<std::string, std::vector<Piece>, StringHash, std::equal_to<>> specials_;
  size_t max_special_ = 0;
  std::vector<Node> trie_{Node{}};
  bool first_bytes_[256] = {};

 public:
  bool trie_may_start(std::string_view tok) const {
    return !tok.empty() && first_bytes_[static_cast<unsigned char>(tok[0])];
  }
  const Node& node(int i) const { return trie_[i]; }
};

const Rules& rules() {
  static const Rules r;
  return r;
}

std::atomic<bool> g_memo{true};

// _split_affixes + _attach_tokens for one run (special cases first).
void Rules::chunk(std::string_view run, bool sp, std::vector<Piece>* out) const {
  if (sp) {
    if (const auto* s = special(run)) {
      out->insert(out->end(), s->begin(), s->end());
      return;
    }
  }
  thread_local std::vector<Piece> prefixes, suffixes;
  prefixes.clear();
  suffixes.clear();
  uint32_t lo = 0, hi = static_cast<uint32_t>(run.size());
  size_t last_size = 0;
  while (hi > lo && hi - lo != last_size) {
    const std::string_view s = run.substr(lo, hi - lo);
    if (sp && special(s)) break;
    last_size = s.size();
    const uint32_t pre = static_cast<uint32_t>(find_prefix(s));
    if (pre != 0) {
      const std::string_view minus_pre = s.substr(pre);
      if (!minus_pre.empty() && sp && special(minus_pre)) {
        prefixes.push_back({lo, lo + pre});
        lo += pre;
        break;
      }
    }
    const uint32_t suf = static_cast<uint32_t>(find_suffix(s.substr(pre)));
    if (suf != 0) {
      const std::string_view minus_suf = s.substr(0, s.size() - suf);
      if (!minus_suf.empty() && sp && special(minus_suf)) {
        suffixes.push_back({hi - suf, hi});
        hi -= suf;
        break;
      }
    }
    if (pre && suf && pre + suf <= s.size()) {
      prefixes.push_back({lo, lo + pre});
      suffixes.push_back({hi - suf, hi});
      lo += pre;
      hi -= suf;
    } else if (pre) {
      prefixes.push_back({lo, lo + pre});
      lo += pre;
    } else if (suf) {
      suffixes.push_back({hi - suf, hi});
      hi -= suf;
    }
  }
  out->insert(out->end(), prefixes.begin(), prefixes.end());
  if (hi > lo) {
    const std::string_view s = run.substr(lo, hi - lo);
    const std::vector<Piece>* spec = sp ? special(s) : nullptr;
    size_t b, e;
    if (spec) {
      for (const Piece& p : *spec) out->push_back({lo + p.begin, lo + p.end});
    } else if (url_.search(s, 0, PCRE2_ANCHORED, &b, &e)) {
      out->push_back({lo, hi});
    } else {
      // finditer: non-overlapping matches left to right (after an empty match, the next may
      // not be empty at the same place)
      uint32_t start = 0;
      const uint32_t start_before_infixes = 0;
      size_t from = 0;
      uint32_t options = 0;
      bool any = false;
      while (from <= s.size() && infix_.search(s, from, options, &b, &e)) {
        any = true;
        const uint32_t is = static_cast<uint32_t>(b), ie = static_cast<uint32_t>(e);
        if (is != start_before_infixes) {
          if (is != start) out->push_back({lo + start, lo + is});
          if (is != ie) out->push_back({lo + is, lo + ie});
          start = ie;
        }
        from = e;
        options = b == e ? PCRE2_NOTEMPTY_ATSTART : 0;
      }
      if (!any) {
        out->push_back({lo, hi});
      } else if (start < s.size()) {
        out->push_back({lo + start, hi});
      }
    }
  }
  for (auto it = suffixes.rbegin(); it != suffixes.rend(); ++it) out->push_back(*it);
}

// A run's tokens, memoised per thread (runs up to 64 bytes; the memo is dropped when it holds
// 1 << 18 of them).
struct Memo {
  std::unordered_map<std::string, std::vector<Piece>, StringHash, std::equal_to<>> map;
};

void Rules::run_tokens(std::string_view run, bool sp, std::vector<Piece>* out) const {
  out->clear();
  if (!sp || run.size() > 64 || !g_memo.load(std::memory_order_relaxed)) {
    chunk(run, sp, out);
    return;
  }
  thread_local Memo memo;
  auto it = memo.map.find(run);
  if (it != memo.map.end()) {
    *out = it->second;
    return;
  }
  chunk(run, sp, out);
  if (memo.map.size() >= (1u << 18)) memo.map.clear();
  memo.map.emplace(std::string(run), *out);
}

void Rules::tokenize(std::string_view text, bool sp, std::vector<Token>* out) const {
  if (text.empty()) return;
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  const uint32_t n = static_cast<uint32_t>(text.size());
  thread_local std::vector<Piece> pieces;
  auto emit = [&](uint32_t b, uint32_t e) {
    run_tokens(text.substr(b, e - b), sp, &pieces);
    for (const Piece& q : pieces) out->push_back({b + q.begin, b + q.end, false});
  };
  uint32_t len = 0;
  bool in_ws = is_space(decode_at(p, &len));
  uint32_t start = 0, i = 0;
  while (i < n) {
    const char32_t c = decode_at(p + i, &len);
    const bool ws = is_space(c);
    if (ws != in_ws) {
      if (start < i) emit(start, i);
      if (c == ' ') {
        // (spaCy sets the last token's trailing space; a ' ' only ever follows a token here)
        if (!out->empty()) out->back().space_after = true;
        start = i + 1;
      } else {
        start = i;
      }
      in_ws = ws;
    }
    i += len;
  }
  if (start < i) {
    emit(start, i);
    if (!out->empty()) out->back().space_after = text.back() == ' ' && !in_ws;
  }
}

void Rules::apply_special_cases(std::string_view text, std::vector<Token>* toks) const {
  const size_t n = toks->size();
  auto str = [&](size_t k) {
    const Token& t = (*toks)[k];
    return text.substr(t.begin, t.end - t.begin);
  };
  thread_local std::vector<std::pair<uint32_t, uint32_t>> matches;
  matches.clear();
  for (size_t idx = 0; idx < n; ++idx) {
    const std::string_view w = str(idx);
    if (!trie_may_start(w)) continue;
    auto it = trie_[0].next.find(w);
    if (it == trie_[0].next.end()) continue;
    int nd = it->second;
    size_t idy = idx + 1;
    for (;;) {
      if (trie_[nd].terminal) matches.push_back({uint32_t(idx), uint32_t(idy)});
      if (idy >= n) break;
      auto nx = trie_[nd].next.find(str(idy));
      if (nx == trie_[nd].next.end()) break;
      nd = nx->second;
      ++idy;
    }
  }
  if (matches.empty()) return;
  // _filter_special_spans: longest first, then leftmost; a span is kept when neither its first
  // nor its last token is covered by a span visited before (every visited span covers its
  // tokens).
  std::stable_sort(matches.begin(), matches.end(), [](const auto& a, const auto& b) {
    const uint32_t la = a.second - a.first, lb = b.second - b.first;
    return la != lb ? la > lb : a.first < b.first;
  });
  thread_local std::vector<uint8_t> seen;
  seen.assign(n, 0);
  thread_local std::vector<std::pair<uint32_t, uint32_t>> kept;
  kept.clear();
  for (const auto& [s, e] : matches) {
    if (!seen[s] && !seen[e - 1]) kept.push_back({s, e});
    for (uint32_t k = s; k < e; ++k) seen[k] = 1;
  }
  std::sort(kept.begin(), kept.end());
  thread_local std::vector<Token> result;
  result.clear();
  size_t i = 0, m = 0;
  std::string joined;
  while (i < n) {
    if (m < kept.size() && kept[m].first == i) {
      const uint32_t s = kept[m].first, e = kept[m].second;
      ++m;
      joined.clear();
      for (uint32_t k = s; k < e; ++k) {
        joined.append(str(k));
        if (k + 1 < e && (*toks)[k].space_after) joined.push_back(' ');
      }
      const std::vector<Piece>* sp = special(joined);
      if (!sp) {
        for (uint32_t k = s; k < e; ++k) result.push_back((*toks)[k]);
      } else {
        // (the span's text is the special case's string, and it lies in the text as it is:
        // only single ' ' are absorbed as trailing spaces)
        const uint32_t base = (*toks)[s].begin;
        for (const Piece& q : *sp) result.push_back({base + q.begin, base + q.end, false});
        result.back().space_after = (*toks)[e - 1].space_after;
      }
      i = e;
      continue;
    }
    result.push_back((*toks)[i]);
    ++i;
  }
  toks->swap(result);
}

bool is_sentence_punct(char32_t c) {
  return std::binary_search(std::begin(kSpacySentencePunct), std::end(kSpacySentencePunct), c);
}

}  // namespace

void tokenize(std::string_view text, std::vector<Token>* out) {
  out->clear();
  const Rules& r = rules();
  r.tokenize(text, true, out);
  r.apply_special_cases(text, out);
}

bool is_space_token(std::string_view text, const Token& t) {
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  for (uint32_t i = t.begin; i < t.end;) {
    uint32_t n = 0;
    if (!is_space(decode_at(p + i, &n))) return false;
    i += n;
  }
  return true;
}

void sentence_starts(std::string_view text, const std::vector<Token>& tokens,
                     std::vector<uint32_t>* starts) {
  starts->clear();
  if (tokens.empty()) return;
  starts->push_back(0);
  const auto* p = reinterpret_cast<const unsigned char*>(text.data());
  bool seen_period = false;
  for (uint32_t i = 0; i < tokens.size(); ++i) {
    const Token& t = tokens[i];
    // token.text in punct_chars: a one-character token in the list
    uint32_t n = 0;
    const char32_t c0 = t.end > t.begin ? decode_at(p + t.begin, &n) : 0;
    const bool in_punct_chars = t.end > t.begin && t.begin + n == t.end && is_sentence_punct(c0);
    if (seen_period && !in_punct_chars) {
      bool punct = true;  // token.is_punct: every character is P*
      for (uint32_t k = t.begin; k < t.end && punct; k += n)
        punct = is_punctuation_category(decode_at(p + k, &n));
      if (!punct) {
        starts->push_back(i);
        seen_period = false;
      }
    } else if (in_punct_chars) {
      seen_period = true;
    }
  }
}

void set_memo(bool on) { g_memo.store(on, std::memory_order_relaxed); }

}  // namespace kiln::prep::filter::spacy
