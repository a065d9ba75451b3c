#include "dataprep/tokenizer/charsmap.h"

#include <utf8proc.h>

#include <cstring>

namespace kiln::prep {
namespace {

// darts-clone's unit fields.
inline bool has_leaf(uint32_t u) { return (u >> 8) & 1; }
inline uint32_t value(uint32_t u) { return u & ((1u << 31) - 1); }
inline uint32_t label(uint32_t u) { return u & ((1u << 31) | 0xFF); }
inline uint32_t offset(uint32_t u) { return (u >> 10) << ((u & (1u << 9)) >> 6); }

struct Parsed {
  std::vector<uint32_t> units;
  std::string strings;
};

Status parse_blob(std::string_view blob, Parsed* out) {
  if (blob.size() < 4) return Status::data("precompiled charsmap: shorter than its 4-byte header");
  uint32_t trie_size = 0;
  std::memcpy(&trie_size, blob.data(), 4);
  if (uint64_t(trie_size) + 4 > blob.size())
    return Status::data("precompiled charsmap: its trie size " + std::to_string(trie_size) +
                        " passes the end of the " + std::to_string(blob.size()) + "-byte map");
  if (trie_size % 4 != 0 || trie_size == 0)
    return Status::data("precompiled charsmap: trie size " + std::to_string(trie_size) +
                        " is not a positive multiple of 4");
  out->units.resize(trie_size / 4);
  std::memcpy(out->units.data(), blob.data() + 4, trie_size);
  out->strings.assign(blob.substr(4 + trie_size));
  const auto& units = out->units;
  const size_t n = units.size();
  // Every node reachable from the root: children inside the array, values inside the strings,
  // each replacement NUL-terminated. Visited nodes are marked (a corrupt array may loop).
  std::vector<uint8_t> seen(n, 0);
  std::vector<uint32_t> stack = {0};
  seen[0] = 1;
  while (!stack.empty()) {
    uint32_t pos = stack.back();
    stack.pop_back();
    const uint32_t base = pos ^ offset(units[pos]);
    for (uint32_t c = 0; c < 256; ++c) {
      const uint32_t child = base ^ c;
      // A lookup of any byte reads this unit (the library without a bounds check): in a valid
      // array every block of 256 units is whole.
      if (child >= n)
        return Status::data("precompiled charsmap: trie node " + std::to_string(pos) +
                            " has children past the array (" + std::to_string(n) + " units)");
      if (label(units[child]) != c) continue;
      if (c == 0) continue;  // a leaf unit, checked below
      if (!seen[child]) {
        seen[child] = 1;
        stack.push_back(child);
      }
      if (has_leaf(units[child])) {
        const uint32_t leaf = child ^ offset(units[child]);
        if (leaf >= n)
          return Status::data("precompiled charsmap: trie node " + std::to_string(child) +
                              " points past the array (" + std::to_string(n) + " units)");
        const uint32_t v = value(units[leaf]);
        if (v >= out->strings.size() ||
            std::memchr(out->strings.data() + v, 0, out->strings.size() - v) == nullptr)
          return Status::data("precompiled charsmap: value " + std::to_string(v) +
                              " is not a NUL-terminated replacement inside the map (" +
                              std::to_string(out->strings.size()) + " bytes)");
      }
    }
  }
  return Status::ok();
}

// Protobuf wire format: reads a varint at *p (bounded by end).
bool read_varint(const uint8_t** p, const uint8_t* end, uint64_t* v) {
  *v = 0;
  for (int shift = 0; shift < 64 && *p < end; shift += 7) {
    uint8_t b = *(*p)++;
    *v |= uint64_t(b & 0x7F) << shift;
    if (!(b & 0x80)) return true;
  }
  return false;
}

// Walks one message; for each length-delimited field `want`, calls on(bytes).
template <class On>
Status walk_message(std::string_view msg, const char* what, uint32_t want, const On& on) {
  const auto* p = reinterpret_cast<const uint8_t*>(msg.data());
  const auto* end = p + msg.size();
  while (p < end) {
    const size_t at = size_t(p - reinterpret_cast<const uint8_t*>(msg.data()));
    uint64_t key = 0;
    if (!read_varint(&p, end, &key))
      return Status::data(std::string("SentencePiece model: truncated field key in ") + what +
                          " at byte " + std::to_string(at));
    const uint32_t field = uint32_t(key >> 3), wire = uint32_t(key & 7);
    uint64_t len = 0;
    switch (wire) {
      case 0:
        if (!read_varint(&p, end, &len))
          return Status::data(std::string("SentencePiece model: truncated varint in ") + what);
        break;
      case 1:
      case 5: {
        const size_t w = wire == 1 ? 8 : 4;
        if (size_t(end - p) < w)
          return Status::data(std::string("SentencePiece model: truncated fixed field in ") + what);
        p += w;
        break;
      }
      case 2:
        if (!read_varint(&p, end, &len) || len > uint64_t(end - p))
          return Status::data(std::string("SentencePiece model: field ") + std::to_string(field) +
                              " of " + what + " at byte " + std::to_string(at) + " has length " +
                              std::to_string(len) + ", past the end of its message");
        if (field == want)
          KILN_RETURN_IF_ERROR(on(std::string_view(reinterpret_cast<const char*>(p), len)));
        p += len;
        break;
      default:
        return Status::data(std::string("SentencePiece model: field ") + std::to_string(field) +
                            " of " + what + " has wire type " + std::to_string(wire) +
                            " (not a valid protobuf)");
    }
  }
  return Status::ok();
}

}  // namespace

Result<std::shared_ptr<const PrecompiledCharsmap>> PrecompiledCharsmap::parse(
    std::string_view blob) {
  Parsed p;
  KILN_RETURN_IF_ERROR(parse_blob(blob, &p));
  auto m = std::make_shared<PrecompiledCharsmap>();
  m->units_ = std::move(p.units);
  m->strings_ = std::move(p.strings);
  return std::shared_ptr<const PrecompiledCharsmap>(std::move(m));
}

Status PrecompiledCharsmap::validate(std::string_view blob) {
  Parsed p;
  return parse_blob(blob, &p);
}

const char* PrecompiledCharsmap::transform(std::string_view s) const {
  const size_t n = units_.size();
  uint32_t pos = offset(units_[0]);
  for (size_t i = 0; i < s.size(); ++i) {
    const auto c = static_cast<unsigned char>(s[i]);
    pos ^= c;
    if (pos >= n || label(units_[pos]) != c) return nullptr;
    const uint32_t unit = units_[pos];
    pos ^= offset(unit);
    if (pos >= n) return nullptr;
    if (has_leaf(unit)) return strings_.data() + value(units_[pos]);  // (checked by parse)
  }
  return nullptr;
}

std::string PrecompiledCharsmap::normalize(std::string_view text) const {
  std::string out;
  out.reserve(text.size());
  auto cp_len = [&](size_t i, int32_t* cp) -> size_t {
    utf8proc_int32_t c = -1;
    auto n = utf8proc_iterate(reinterpret_cast<const utf8proc_uint8_t*>(text.data() + i),
                              static_cast<utf8proc_ssize_t>(text.size() - i), &c);
    *cp = n > 0 ? c : -1;
    return n > 0 ? size_t(n) : 1;
  };
  size_t i = 0;
  while (i < text.size()) {
    // One extended grapheme cluster [i, j) (utf8proc's rules); a byte that is not UTF-8 alone.
    int32_t cp = -1;
    size_t j = i + cp_len(i, &cp);
    if (cp >= 0) {
      utf8proc_int32_t state = 0;
      int32_t prev = cp;
      while (j < text.size()) {
        int32_t next = -1;
        size_t len = cp_len(j, &next);
        if (next < 0 || utf8proc_grapheme_break_stateful(prev, next, &state)) break;
        prev = next;
        j += len;
      }
    }
    std::string_view g = text.substr(i, j - i);
    const char* r = g.size() < 6 ? transform(g) : nullptr;
    if (r) {
      out += r;
    } else {
      for (size_t k = 0; k < g.size();) {
        int32_t c = -1;
        size_t len = cp_len(i + k, &c);
        const char* rc = transform(g.substr(k, len));
        if (rc)
          out += rc;
        else
          out.append(g.substr(k, len));
        k += len;
      }
    }
    i = j;
  }
  return out;
}

Status validate_sentencepiece_model(std::string_view bytes) {
  // ModelProto: 3 = normalizer_spec, 5 = denormalizer_spec; NormalizerSpec: 2 = the charsmap.
  for (uint32_t spec : {3u, 5u}) {
    const char* what = spec == 3 ? "normalizer_spec" : "denormalizer_spec";
    KILN_RETURN_IF_ERROR(walk_message(bytes, "ModelProto", spec, [&](std::string_view sub) {
      return walk_message(sub, what, 2, [&](std::string_view blob) -> Status {
        if (blob.empty()) return Status::ok();
        Status st = PrecompiledCharsmap::validate(blob);
        if (!st.is_ok())
          return Status::data(std::string("SentencePiece model: ") + what + ": " + st.message());
        return Status::ok();
      });
    }));
  }
  return Status::ok();
}

}  // namespace kiln::prep
