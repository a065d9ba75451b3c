#include "dataprep/tokenizer/hf_pipeline.h"

#include <utf8proc.h>

#include <algorithm>
#include <cctype>
#include <cstdlib>
#include <cstring>

#include "dataprep/tokenizer/charsmap.h"
#include "dataprep/tokenizer/pretokenize.h"
#include "dataprep/tokenizer/regex_split.h"
#include "dataprep/tokenizer/unicode_data.h"

namespace kiln::prep {
namespace {

// The code point at text[i] and its length; -1 (length 1) for a byte that is not valid UTF-8.
int32_t cp_at(std::string_view text, size_t i, size_t* len) {
  auto b = static_cast<unsigned char>(text[i]);
  if (b < 0x80) {
    *len = 1;
    return b;
  }
  utf8proc_int32_t cp = -1;
  auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                            static_cast<utf8proc_ssize_t>(text.size() - i), &cp);
  if (n <= 0) {
    *len = 1;
    return -1;
  }
  *len = size_t(n);
  return cp;
}

void append_cp(std::string* out, int32_t cp) {
  utf8proc_uint8_t buf[4];
  auto n = utf8proc_encode_char(cp, buf);
  out->append(reinterpret_cast<char*>(buf), size_t(n));
}

void replace_all(std::string* s, std::string_view from, std::string_view to) {
  if (from.empty()) return;
  std::string out;
  size_t prev = 0;
  for (size_t at = s->find(from); at != std::string::npos; at = s->find(from, at + from.size())) {
    out.append(*s, prev, at - prev);
    out.append(to);
    prev = at + from.size();
  }
  if (prev == 0) return;
  out.append(*s, prev);
  *s = std::move(out);
}

// Matches of a character predicate: each matching character is a match of its own.
template <class Pred>
void char_matches(std::string_view text, const Pred& pred,
                  std::vector<std::pair<size_t, size_t>>* out) {
  size_t len = 0;
  for (size_t i = 0; i < text.size(); i += len) {
    int32_t cp = cp_at(text, i, &len);
    if (cp >= 0 && pred(cp)) out->emplace_back(i, i + len);
  }
}

// Hugging Face's NormalizedString::split: the matches and the text between them, combined as the
// behaviour says; pieces that are removed or empty are dropped.
void split_pieces(const Piece& piece, const std::vector<std::pair<size_t, size_t>>& found,
                  SplitBehavior behavior, bool invert, std::vector<Piece>* out) {
  const std::string& text = piece.text;
  struct Part {
    size_t s, e;
    bool match;
  };
  std::vector<Part> parts;
  size_t prev = 0;
  for (auto [s, e] : found) {
    if (prev != s) parts.push_back({prev, s, false});
    parts.push_back({s, e, true});
    prev = e;
  }
  if (prev != text.size() || parts.empty()) parts.push_back({prev, text.size(), false});
  if (invert)
    for (Part& p : parts) p.match = !p.match;
  struct Out {
    size_t s, e;
    bool remove;
  };
  std::vector<Out> splits;
  bool previous_match = false;
  switch (behavior) {
    case SplitBehavior::kIsolated:
      for (const Part& p : parts) splits.push_back({p.s, p.e, false});
      break;
    case SplitBehavior::kRemoved:
      for (const Part& p : parts) splits.push_back({p.s, p.e, p.match});
      break;
    case SplitBehavior::kContiguous:
      for (const Part& p : parts) {
        if (p.match == previous_match && !splits.empty())
          splits.back().e = p.e;
        else
          splits.push_back({p.s, p.e, false});
        previous_match = p.match;
      }
      break;
    case SplitBehavior::kMergedWithPrevious:
      for (const Part& p : parts) {
        if (p.match && !previous_match && !splits.empty())
          splits.back().e = p.e;
        else
          splits.push_back({p.s, p.e, false});
        previous_match = p.match;
      }
      break;
    case SplitBehavior::kMergedWithNext:
      for (size_t k = parts.size(); k-- > 0;) {
        const Part& p = parts[k];
        if (p.match && !previous_match && !splits.empty())
          splits.back().s = p.s;
        else
          splits.push_back({p.s, p.e, false});
        previous_match = p.match;
      }
      std::reverse(splits.begin(), splits.end());
      break;
  }
  for (const Out& o : splits) {
    if (o.remove || o.e <= o.s) continue;
    out->push_back({text.substr(o.s, o.e - o.s), piece.first && o.s == 0});
  }
}

}  // namespace

Status HfPattern::find(std::string_view text, std::vector<std::pair<size_t, size_t>>* out) const {
  if (regex) return regex->find_matches(text, out);
  if (literal.empty()) return Status::ok();
  for (size_t at = text.find(literal); at != std::string_view::npos;
       at = text.find(literal, at + literal.size()))
    out->emplace_back(at, at + literal.size());
  return Status::ok();
}

std::string unicode_normalize(std::string_view text, NormalizerStep::Kind form) {
  int options = UTF8PROC_STABLE;
  if (form == NormalizerStep::kNfc || form == NormalizerStep::kNfkc) options |= UTF8PROC_COMPOSE;
  if (form == NormalizerStep::kNfd || form == NormalizerStep::kNfkd) options |= UTF8PROC_DECOMPOSE;
  if (form == NormalizerStep::kNfkc || form == NormalizerStep::kNfkd) options |= UTF8PROC_COMPAT;
  std::string out;
  out.reserve(text.size() + text.size() / 8);
  size_t i = 0;
  while (i < text.size()) {
    // A run of valid code points that Unicode 9.0 has; then what ends it, kept as it is (bytes
    // that are not UTF-8, code points Hugging Face's tables do not know: starters that never
    // compose, so normalizing around them equals normalizing the whole).
    size_t j = i, len = 0;
    bool ascii = true;
    while (j < text.size()) {
      int32_t cp = cp_at(text, j, &len);
      if (cp < 0 || unicode::new_since_unicode9(cp)) break;
      ascii = ascii && cp < 0x80;
      j += len;
    }
    if (ascii) {
      out.append(text.substr(i, j - i));
    } else if (j > i) {
      utf8proc_uint8_t* mapped = nullptr;
      auto n =
          utf8proc_map(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                       static_cast<utf8proc_ssize_t>(j - i), &mapped, utf8proc_option_t(options));
      if (n >= 0)
        out.append(reinterpret_cast<const char*>(mapped), size_t(n));
      else
        out.append(text.substr(i, j - i));
      std::free(mapped);
    }
    if (j < text.size()) {
      cp_at(text, j, &len);
      out.append(text.substr(j, len));
      j += len;
    }
    i = j;
  }
  return out;
}

Status HfNormalizer::apply(std::string_view text, std::string* out) const {
  std::string s(text);
  std::vector<std::pair<size_t, size_t>> found;
  for (const NormalizerStep& step : steps) {
    switch (step.kind) {
      case NormalizerStep::kNfc:
      case NormalizerStep::kNfd:
      case NormalizerStep::kNfkc:
      case NormalizerStep::kNfkd:
        s = unicode_normalize(s, step.kind);
        break;
      case NormalizerStep::kLowercase: {
        // Rust's char::to_lowercase: the one multi-character mapping is U+0130.
        std::string t;
        t.reserve(s.size());
        size_t len = 0;
        for (size_t i = 0; i < s.size(); i += len) {
          int32_t cp = cp_at(s, i, &len);
          if (cp < 0x80) {
            t.push_back(cp >= 'A' && cp <= 'Z' ? char(cp + 32) : s[i]);
          } else if (cp == 0x130) {
            t.append("i\xCC\x87");
          } else {
            append_cp(&t, utf8proc_tolower(cp));
          }
        }
        s = std::move(t);
        break;
      }
      case NormalizerStep::kReplace: {
        found.clear();
        KILN_RETURN_IF_ERROR(step.pattern.find(s, &found));
        if (found.empty()) break;
        std::string t;
        size_t prev = 0;
        for (auto [b, e] : found) {
          if (e == b) continue;
          t.append(s, prev, b - prev);
          t.append(step.content);
          prev = e;
        }
        t.append(s, prev);
        s = std::move(t);
        break;
      }
      case NormalizerStep::kPrepend:
        if (!s.empty()) s.insert(0, step.content);
        break;
      case NormalizerStep::kStrip: {
        size_t b = 0, e = s.size(), len = 0;
        if (step.left)
          while (b < e && unicode::is_white_space(cp_at(s, b, &len))) b += len;
        if (step.right)
          while (e > b) {
            size_t k = e - 1;
            while (k > b && (static_cast<unsigned char>(s[k]) & 0xC0) == 0x80) --k;
            if (!unicode::is_white_space(cp_at(s, k, &len)) || k + len != e) break;
            e = k;
          }
        s = s.substr(b, e - b);
        break;
      }
      case NormalizerStep::kPrecompiled:
        s = step.charsmap->normalize(s);
        break;
    }
  }
  *out = std::move(s);
  return Status::ok();
}

Status HfPreTokenizer::apply(std::string_view text, bool first, std::vector<Piece>* out) const {
  std::vector<Piece> pieces, next;
  pieces.push_back({std::string(text), first});
  std::vector<std::pair<size_t, size_t>> found;
  std::vector<std::string_view> views;
  for (const PreTokenizerStep& step : steps) {
    next.clear();
    for (Piece& piece : pieces) {
      found.clear();
      switch (step.kind) {
        case PreTokenizerStep::kSplit:
          KILN_RETURN_IF_ERROR(step.pattern.find(piece.text, &found));
          split_pieces(piece, found, step.behavior, step.invert, &next);
          break;
        case PreTokenizerStep::kDigits:
          char_matches(
              piece.text, [](int32_t c) { return unicode::is_number(unicode::category(c)); },
              &found);
          split_pieces(
              piece, found,
              step.individual_digits ? SplitBehavior::kIsolated : SplitBehavior::kContiguous, false,
              &next);
          break;
        case PreTokenizerStep::kPunctuation:
          char_matches(
              piece.text,
              [](int32_t c) {
                return (c < 0x80 && std::ispunct(c)) ||
                       unicode::is_punctuation(unicode::category(c));
              },
              &found);
          split_pieces(piece, found, step.behavior, false, &next);
          break;
        case PreTokenizerStep::kWhitespace:
          KILN_RETURN_IF_ERROR(step.pattern.find(piece.text, &found));
          split_pieces(piece, found, SplitBehavior::kRemoved, true, &next);
          break;
        case PreTokenizerStep::kWhitespaceSplit:
          char_matches(piece.text, unicode::is_white_space, &found);
          split_pieces(piece, found, SplitBehavior::kRemoved, false, &next);
          break;
        case PreTokenizerStep::kMetaspace: {
          replace_all(&piece.text, " ", step.replacement);
          const bool starts = piece.text.compare(0, step.replacement.size(), step.replacement) == 0;
          if (!starts && (step.prepend == PreTokenizerStep::kAlways ||
                          (step.prepend == PreTokenizerStep::kFirst && piece.first)))
            piece.text.insert(0, step.replacement);
          if (!step.split) {
            if (!piece.text.empty()) next.push_back(std::move(piece));
            break;
          }
          HfPattern lit{step.replacement, nullptr};
          KILN_RETURN_IF_ERROR(lit.find(piece.text, &found));
          split_pieces(piece, found, SplitBehavior::kMergedWithNext, false, &next);
          break;
        }
        case PreTokenizerStep::kByteLevel: {
          if (step.add_prefix_space && piece.text.compare(0, 1, " ") != 0)
            piece.text.insert(0, " ");
          if (!step.use_regex) {
            if (!piece.text.empty()) next.push_back(std::move(piece));
            break;
          }
          views.clear();
          PretokenizerSpec gpt2;
          gpt2.kind = PretokenizerKind::kGpt2;
          KILN_RETURN_IF_ERROR(pretokenize(piece.text, gpt2, &views));
          for (std::string_view v : views)
            next.push_back({std::string(v), piece.first && v.data() == piece.text.data()});
          break;
        }
      }
    }
    pieces.swap(next);
  }
  for (Piece& p : pieces) out->push_back(std::move(p));
  return Status::ok();
}

std::string HfDecoder::decode(std::vector<std::string> tokens) const {
  auto byte_token = [](const std::string& t, unsigned* b) {
    if (t.size() != 6 || t.compare(0, 3, "<0x") != 0 || t[5] != '>') return false;
    char* end = nullptr;
    unsigned long v = std::strtoul(t.substr(3, 2).c_str(), &end, 16);
    if (end != nullptr && *end != 0) return false;
    *b = unsigned(v);
    return true;
  };
  for (const DecoderStep& step : steps) {
    switch (step.kind) {
      case DecoderStep::kByteLevel:  // byte-level tokens are their bytes already
        break;
      case DecoderStep::kReplace:
        for (std::string& t : tokens) replace_all(&t, step.pattern, step.content);
        break;
      case DecoderStep::kByteFallback: {
        std::vector<std::string> out;
        std::string bytes;
        auto flush = [&] {
          if (bytes.empty()) return;
          // Valid UTF-8 is one token; otherwise each byte becomes U+FFFD (as Hugging Face).
          size_t len = 0;
          bool ok = true;
          for (size_t i = 0; i < bytes.size() && ok; i += len) ok = cp_at(bytes, i, &len) >= 0;
          if (ok)
            out.push_back(bytes);
          else
            for (size_t i = 0; i < bytes.size(); ++i) out.push_back("\xEF\xBF\xBD");
          bytes.clear();
        };
        for (std::string& t : tokens) {
          unsigned b = 0;
          if (byte_token(t, &b)) {
            bytes.push_back(char(b));
            continue;
          }
          flush();
          out.push_back(std::move(t));
        }
        flush();
        tokens = std::move(out);
        break;
      }
      case DecoderStep::kFuse: {
        std::string all;
        for (const std::string& t : tokens) all += t;
        tokens.assign(1, std::move(all));
        break;
      }
      case DecoderStep::kStrip:
        for (std::string& t : tokens) {
          const std::string& c = step.content;
          size_t b = 0, e = t.size();
          for (size_t k = 0; k < step.start && !c.empty() && t.compare(b, c.size(), c) == 0; ++k)
            b += c.size();
          for (size_t k = 0; k < step.stop && !c.empty() && e >= b + c.size() &&
                             t.compare(e - c.size(), c.size(), c) == 0;
               ++k)
            e -= c.size();
          t = t.substr(b, e - b);
        }
        break;
      case DecoderStep::kMetaspace:
        for (size_t i = 0; i < tokens.size(); ++i)
          replace_all(&tokens[i], step.replacement, i == 0 && step.prepend ? "" : " ");
        break;
    }
  }
  std::string out;
  for (const std::string& t : tokens) out += t;
  return out;
}

}  // namespace kiln::prep
