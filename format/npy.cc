#include "format/npy.h"

#include <bit>
#include <cstring>

namespace kiln {
namespace {

constexpr char kMagic[] = "\x93NUMPY";
constexpr size_t kMagicLen = 6;
constexpr size_t kAlign = 64;
// numpy >= 1.23 leaves room after the shape so the first axis can grow in place; copying that
// keeps our bytes identical to numpy.save's.
constexpr size_t kGrowthAxisDigits = 21;
constexpr size_t kMaxHeaderLen = 1 << 16;  // far above any real header; bounds the parse

template <typename T>
T byteswap(T v) {
  if constexpr (sizeof(T) == 2) return static_cast<T>(__builtin_bswap16(v));
  else return static_cast<T>(__builtin_bswap32(v));
}

template <typename T>
T load_le(const char* p) {
  T v;
  std::memcpy(&v, p, sizeof v);
  if constexpr (std::endian::native == std::endian::big) v = byteswap(v);
  return v;
}

void append_header(std::string* out, NpyDtype dtype, uint64_t n) {
  std::string dict = "{'descr': '";
  dict += npy_descr(dtype);
  dict += "', 'fortran_order': False, 'shape': (";
  std::string count = std::to_string(n);
  dict += count;
  dict += ",), }";
  if (count.size() < kGrowthAxisDigits) dict.append(kGrowthAxisDigits - count.size(), ' ');
  size_t unpadded = kMagicLen + 2 + 2 + dict.size() + 1;  // + '\n'
  size_t pad = (kAlign - unpadded % kAlign) % kAlign;
  dict.append(pad, ' ');
  dict += '\n';
  size_t header_len = dict.size();
  out->append(kMagic, kMagicLen);
  out->push_back('\x01');
  out->push_back('\x00');
  out->push_back(static_cast<char>(header_len & 0xff));
  out->push_back(static_cast<char>((header_len >> 8) & 0xff));
  out->append(dict);
}

template <typename Src, typename Dst>
void append_values(std::string* out, std::span<const Src> values) {
  size_t start = out->size();
  out->resize(start + values.size() * sizeof(Dst));
  char* p = out->data() + start;
  if constexpr (std::is_same_v<Src, Dst> && std::endian::native == std::endian::little) {
    if (!values.empty()) std::memcpy(p, values.data(), values.size() * sizeof(Dst));
  } else {
    for (Src v : values) {
      KILN_CHECK(v <= static_cast<Src>(~Dst{0}), "npy: value does not fit the dtype");
      Dst d = static_cast<Dst>(v);
      if constexpr (std::endian::native == std::endian::big) d = byteswap(d);
      std::memcpy(p, &d, sizeof d);
      p += sizeof d;
    }
  }
}

// A tiny strict parser for the header dict numpy writes: {'key': value, ...} with string,
// boolean and tuple-of-integer values, single or double quotes, optional trailing comma.
class HeaderParser {
 public:
  explicit HeaderParser(std::string_view s) : s_(s) {}

  Status parse(NpyDtype* dtype, uint64_t* count) {
    bool have_descr = false, have_order = false, have_shape = false;
    skip_ws();
    if (!eat('{')) return fail("header is not a dict (expected '{')");
    skip_ws();
    while (!peek('}')) {
      std::string key;
      KILN_RETURN_IF_ERROR(parse_string(&key, "dict key"));
      skip_ws();
      if (!eat(':')) return fail("expected ':' after '" + key + "'");
      skip_ws();
      if (key == "descr") {
        if (have_descr) return fail("duplicate key 'descr'");
        have_descr = true;
        std::string descr;
        KILN_RETURN_IF_ERROR(parse_string(&descr, "'descr'"));
        if (descr == "<u2") {
          *dtype = NpyDtype::kU16;
        } else if (descr == "<u4") {
          *dtype = NpyDtype::kU32;
        } else if (descr == "|u1" || descr == "<u1") {
          *dtype = NpyDtype::kU8;
        } else {
          return fail("unsupported descr '" + descr + "' (expected '<u2', '<u4' or '|u1')");
        }
      } else if (key == "fortran_order") {
        if (have_order) return fail("duplicate key 'fortran_order'");
        have_order = true;
        if (s_.substr(pos_, 5) == "False") {
          pos_ += 5;
        } else if (s_.substr(pos_, 4) == "True") {
          return fail("fortran_order True is not supported");
        } else {
          return fail("'fortran_order' must be False");
        }
      } else if (key == "shape") {
        if (have_shape) return fail("duplicate key 'shape'");
        have_shape = true;
        KILN_RETURN_IF_ERROR(parse_shape(count));
      } else {
        return fail("unexpected key '" + key + "'");
      }
      skip_ws();
      if (eat(',')) {
        skip_ws();
        continue;
      }
      if (!peek('}')) return fail("expected ',' or '}'");
    }
    eat('}');
    // numpy pads with spaces and ends the header with '\n'.
    while (pos_ < s_.size() && s_[pos_] == ' ') ++pos_;
    if (pos_ + 1 != s_.size() || s_[pos_] != '\n') {
      return fail("header must end with spaces and a newline after the dict");
    }
    if (!have_descr) return fail("missing key 'descr'");
    if (!have_order) return fail("missing key 'fortran_order'");
    if (!have_shape) return fail("missing key 'shape'");
    return Status::ok();
  }

 private:
  Status fail(const std::string& what) const {
    return Status::data("npy: malformed header: " + what + " (at byte " + std::to_string(pos_) +
                        " of the header)");
  }
  void skip_ws() {
    while (pos_ < s_.size() && (s_[pos_] == ' ' || s_[pos_] == '\t')) ++pos_;
  }
  bool peek(char c) const { return pos_ < s_.size() && s_[pos_] == c; }
  bool eat(char c) {
    if (!peek(c)) return false;
    ++pos_;
    return true;
  }
  Status parse_string(std::string* out, const char* what) {
    if (pos_ >= s_.size() || (s_[pos_] != '\'' && s_[pos_] != '"')) {
      return fail(std::string("expected a quoted string for ") + what);
    }
    char quote = s_[pos_++];
    size_t end = s_.find(quote, pos_);
    if (end == std::string_view::npos) return fail(std::string("unterminated string in ") + what);
    std::string_view body = s_.substr(pos_, end - pos_);
    if (body.find('\\') != std::string_view::npos || body.find('\n') != std::string_view::npos) {
      return fail(std::string("unsupported escape or newline in ") + what);
    }
    out->assign(body);
    pos_ = end + 1;
    return Status::ok();
  }
  Status parse_shape(uint64_t* count) {
    if (!eat('(')) return fail("'shape' must be a tuple");
    skip_ws();
    if (peek(')')) return fail("'shape' is () (a scalar); expected a 1-D shape (N,)");
    uint64_t n = 0;
    size_t digits = 0;
    while (pos_ < s_.size() && s_[pos_] >= '0' && s_[pos_] <= '9') {
      uint64_t d = static_cast<uint64_t>(s_[pos_] - '0');
      if (n > (UINT64_MAX - d) / 10) return fail("'shape' dimension overflows");
      n = n * 10 + d;
      ++pos_;
      ++digits;
    }
    if (digits == 0) return fail("'shape' must hold a non-negative integer");
    skip_ws();
    if (!eat(',')) return fail("'shape' must be 1-D: (N,)");
    skip_ws();
    if (!eat(')')) return fail("'shape' must be 1-D: (N,) with exactly one dimension");
    *count = n;
    return Status::ok();
  }

  std::string_view s_;
  size_t pos_ = 0;
};

}  // namespace

size_t npy_itemsize(NpyDtype dtype) {
  return dtype == NpyDtype::kU16 ? 2 : dtype == NpyDtype::kU8 ? 1 : 4;
}
const char* npy_descr(NpyDtype dtype) {
  return dtype == NpyDtype::kU16 ? "<u2" : dtype == NpyDtype::kU8 ? "|u1" : "<u4";
}

NpyDtype npy_token_dtype(uint64_t vocab_size) {
  return vocab_size <= 65536 ? NpyDtype::kU16 : NpyDtype::kU32;
}

void npy_append(std::string* out, std::span<const uint16_t> values) {
  append_header(out, NpyDtype::kU16, values.size());
  append_values<uint16_t, uint16_t>(out, values);
}

void npy_append(std::string* out, std::span<const uint32_t> values, NpyDtype dtype) {
  KILN_CHECK(dtype != NpyDtype::kU8, "npy_append: token ids are stored as <u2 or <u4");
  append_header(out, dtype, values.size());
  if (dtype == NpyDtype::kU16) {
    append_values<uint32_t, uint16_t>(out, values);
  } else {
    append_values<uint32_t, uint32_t>(out, values);
  }
}

std::string npy_encode(std::span<const uint16_t> values) {
  std::string out;
  npy_append(&out, values);
  return out;
}

std::string npy_encode(std::span<const uint32_t> values, NpyDtype dtype) {
  std::string out;
  npy_append(&out, values, dtype);
  return out;
}

std::string npy_encode(std::span<const uint8_t> values) {
  std::string out;
  append_header(&out, NpyDtype::kU8, values.size());
  out.append(reinterpret_cast<const char*>(values.data()), values.size());
  return out;
}

uint32_t NpyView::at(uint64_t i) const {
  if (dtype == NpyDtype::kU8) return static_cast<unsigned char>(data[i]);
  if (dtype == NpyDtype::kU16) return load_le<uint16_t>(data + i * 2);
  return load_le<uint32_t>(data + i * 4);
}

Result<NpyView> npy_parse(std::string_view bytes) {
  if (bytes.size() < kMagicLen + 2 || std::memcmp(bytes.data(), kMagic, kMagicLen) != 0) {
    return Status::data("npy: not a .npy file (bad magic)");
  }
  auto major = static_cast<uint8_t>(bytes[6]);
  auto minor = static_cast<uint8_t>(bytes[7]);
  size_t len_bytes;
  if (major == 1 && minor == 0) {
    len_bytes = 2;
  } else if ((major == 2 || major == 3) && minor == 0) {
    len_bytes = 4;
  } else {
    return Status::data("npy: unsupported format version " + std::to_string(major) + "." +
                        std::to_string(minor));
  }
  size_t prefix = kMagicLen + 2 + len_bytes;
  if (bytes.size() < prefix) return Status::data("npy: truncated header length");
  uint64_t header_len = len_bytes == 2 ? load_le<uint16_t>(bytes.data() + 8)
                                       : load_le<uint32_t>(bytes.data() + 8);
  if (header_len > kMaxHeaderLen) {
    return Status::data("npy: header length " + std::to_string(header_len) +
                        " is over the limit of " + std::to_string(kMaxHeaderLen) + " bytes");
  }
  if (bytes.size() < prefix + header_len) {
    return Status::data("npy: truncated header (needs " + std::to_string(header_len) +
                        " bytes, file has " + std::to_string(bytes.size() - prefix) + ")");
  }
  std::string_view header = bytes.substr(prefix, header_len);
  for (char c : header) {
    auto u = static_cast<unsigned char>(c);
    if (u >= 0x80 || (u < 0x20 && c != '\n' && c != '\t')) {
      return Status::data("npy: header holds a non-ASCII or control byte");
    }
  }
  NpyView view;
  HeaderParser parser(header);
  KILN_RETURN_IF_ERROR(parser.parse(&view.dtype, &view.size));
  uint64_t data_bytes = bytes.size() - prefix - header_len;
  size_t item = npy_itemsize(view.dtype);
  if (view.size > data_bytes / item || view.size * item != data_bytes) {
    return Status::data("npy: shape (" + std::to_string(view.size) + ",) of " +
                        npy_descr(view.dtype) + " needs " +
                        (view.size > UINT64_MAX / item ? std::string("too many")
                                                       : std::to_string(view.size * item)) +
                        " data bytes, file has " + std::to_string(data_bytes));
  }
  view.data = bytes.data() + prefix + header_len;
  return view;
}

Status npy_decode(std::string_view bytes, std::vector<uint32_t>* out) {
  out->clear();
  KILN_ASSIGN_OR_RETURN(NpyView view, npy_parse(bytes));
  out->resize(view.size);
  if (view.dtype == NpyDtype::kU32 && std::endian::native == std::endian::little) {
    if (view.size) std::memcpy(out->data(), view.data, view.size * 4);
  } else {
    for (uint64_t i = 0; i < view.size; ++i) (*out)[i] = view.at(i);
  }
  return Status::ok();
}

}  // namespace kiln
