// The Jinja engine behind dataprep/chat/jinja.h: a lexer that applies Jinja's whitespace rules
// (trim_blocks, lstrip_blocks, `-` / `+`), a recursive-descent parser following jinja2/parser.py's
// precedence (so `not x is defined` and `a + b | trim` group as Jinja groups them), and a
// tree-walking evaluator over Python-like values. Internally errors are exceptions (the evaluator
// is deeply recursive); the public functions turn them into Status values.
#include "dataprep/chat/jinja.h"

#include <utf8proc.h>

#include <algorithm>
#include <charconv>
#include <cmath>
#include <cstdint>
#include <ctime>
#include <functional>
#include <map>
#include <stdexcept>
#include <unordered_map>

namespace kiln::chat {
namespace {

struct TemplateError : std::runtime_error {
  using std::runtime_error::runtime_error;
};
[[noreturn]] void fail(const std::string& msg) { throw TemplateError(msg); }

// ---------------------------------------------------------------- values

struct Value;
struct Dict;
using List = std::vector<Value>;
struct Args;
using Fn = std::function<Value(Args&)>;

enum class K { kUndef, kNone, kBool, kInt, kFloat, kStr, kList, kDict, kNs, kFn };

struct Value {
  K k = K::kUndef;
  bool b = false;
  int64_t i = 0;
  double f = 0;
  std::string s;            // kStr; kUndef: the hint for error messages
  std::shared_ptr<List> l;  // kList (tuple when is_tuple)
  std::shared_ptr<Dict> d;  // kDict, kNs
  std::shared_ptr<Fn> fn;   // kFn
  bool is_tuple = false;

  static Value undef(std::string hint = "") {
    Value v;
    v.s = std::move(hint);
    return v;
  }
  static Value none() {
    Value v;
    v.k = K::kNone;
    return v;
  }
  static Value boolean(bool x) {
    Value v;
    v.k = K::kBool;
    v.b = x;
    return v;
  }
  static Value integer(int64_t x) {
    Value v;
    v.k = K::kInt;
    v.i = x;
    return v;
  }
  static Value real(double x) {
    Value v;
    v.k = K::kFloat;
    v.f = x;
    return v;
  }
  static Value str(std::string x) {
    Value v;
    v.k = K::kStr;
    v.s = std::move(x);
    return v;
  }
  static Value list(List x, bool tuple = false) {
    Value v;
    v.k = K::kList;
    v.l = std::make_shared<List>(std::move(x));
    v.is_tuple = tuple;
    return v;
  }
  static Value dict();
  static Value function(Fn f) {
    Value v;
    v.k = K::kFn;
    v.fn = std::make_shared<Fn>(std::move(f));
    return v;
  }
  bool undefined() const { return k == K::kUndef; }
  bool number() const { return k == K::kBool || k == K::kInt || k == K::kFloat; }
  double as_double() const { return k == K::kFloat ? f : k == K::kBool ? (b ? 1 : 0) : double(i); }
  int64_t as_int() const { return k == K::kBool ? (b ? 1 : 0) : i; }
};

struct Dict {
  std::vector<std::pair<std::string, Value>> items;
  const Value* find(std::string_view key) const {
    for (auto& [k, v] : items)
      if (k == key) return &v;
    return nullptr;
  }
  void set(const std::string& key, Value v) {
    for (auto& [k, old] : items)
      if (k == key) {
        old = std::move(v);
        return;
      }
    items.emplace_back(key, std::move(v));
  }
};

Value Value::dict() {
  Value v;
  v.k = K::kDict;
  v.d = std::make_shared<Dict>();
  return v;
}

struct Args {
  std::vector<Value> pos;
  std::vector<std::pair<std::string, Value>> kw;
  // Positional argument `index` or keyword `name`, else `fallback`.
  Value get(size_t index, const char* name, Value fallback = Value::undef()) const {
    for (auto& [k, v] : kw)
      if (k == name) return v;
    if (index < pos.size()) return pos[index];
    return fallback;
  }
  bool has(size_t index, const char* name) const {
    if (index < pos.size()) return true;
    for (auto& [k, v] : kw)
      if (k == name) return true;
    return false;
  }
};

// ---------------------------------------------------------------- UTF-8 and Python str helpers

std::u32string decode_utf8(std::string_view s) {
  std::u32string out;
  out.reserve(s.size());
  for (size_t p = 0; p < s.size();) {
    unsigned char c = s[p];
    char32_t cp;
    int n;
    if (c < 0x80) {
      cp = c;
      n = 1;
    } else if ((c >> 5) == 6) {
      cp = c & 0x1f;
      n = 2;
    } else if ((c >> 4) == 14) {
      cp = c & 0x0f;
      n = 3;
    } else if ((c >> 3) == 30) {
      cp = c & 0x07;
      n = 4;
    } else {
      cp = 0xfffd;
      n = 1;
    }
    if (p + n > s.size()) {
      cp = 0xfffd;
      n = 1;
    }
    for (int j = 1; j < n; ++j) cp = (cp << 6) | (static_cast<unsigned char>(s[p + j]) & 0x3f);
    out.push_back(cp);
    p += n;
  }
  return out;
}

void append_utf8(std::string& out, char32_t cp) {
  if (cp < 0x80)
    out += char(cp);
  else if (cp < 0x800) {
    out += char(0xc0 | (cp >> 6));
    out += char(0x80 | (cp & 0x3f));
  } else if (cp < 0x10000) {
    out += char(0xe0 | (cp >> 12));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  } else {
    out += char(0xf0 | (cp >> 18));
    out += char(0x80 | ((cp >> 12) & 0x3f));
    out += char(0x80 | ((cp >> 6) & 0x3f));
    out += char(0x80 | (cp & 0x3f));
  }
}

std::string encode_utf8(std::u32string_view s) {
  std::string out;
  for (char32_t c : s) append_utf8(out, c);
  return out;
}

// Python's str.isspace().
bool py_space(char32_t c) {
  return (c >= 9 && c <= 13) || (c >= 0x1c && c <= 0x20) || c == 0x85 || c == 0xa0 || c == 0x1680 ||
         (c >= 0x2000 && c <= 0x200a) || c == 0x2028 || c == 0x2029 || c == 0x202f || c == 0x205f ||
         c == 0x3000;
}

// Python's str.upper / lower / title / capitalize, with Unicode's simple case mappings (utf8proc;
// Python also applies the few one-to-many mappings such as U+00DF -> "SS", which are left alone).
bool is_cased(char32_t c) {
  auto cat = utf8proc_category(utf8proc_int32_t(c));
  return cat == UTF8PROC_CATEGORY_LU || cat == UTF8PROC_CATEGORY_LL || cat == UTF8PROC_CATEGORY_LT;
}
std::string case_map(const std::string& s, const std::string& how) {
  std::string out;
  bool prev_cased = false;
  size_t idx = 0;
  for (char32_t c : decode_utf8(s)) {
    utf8proc_int32_t x = utf8proc_int32_t(c), y = x;
    if (how == "upper")
      y = utf8proc_toupper(x);
    else if (how == "lower")
      y = utf8proc_tolower(x);
    else if (how == "title")
      y = prev_cased ? utf8proc_tolower(x) : utf8proc_totitle(x);
    else
      y = idx == 0 ? utf8proc_totitle(x) : utf8proc_tolower(x);  // capitalize
    prev_cased = is_cased(c) || (prev_cased && utf8proc_category(x) == UTF8PROC_CATEGORY_MN);
    append_utf8(out, char32_t(y));
    ++idx;
  }
  return out;
}

size_t str_len(const std::string& s) {
  size_t n = 0;
  for (unsigned char c : s) n += (c & 0xc0) != 0x80;
  return n;
}

std::string py_strip(const std::string& s, const Value& chars, bool left, bool right) {
  std::u32string u = decode_utf8(s);
  std::u32string set;
  bool custom = chars.k == K::kStr;
  if (custom)
    set = decode_utf8(chars.s);
  else if (chars.k != K::kNone && !chars.undefined())
    fail("strip arg must be None or str");
  auto strip_it = [&](char32_t c) {
    return custom ? set.find(c) != std::u32string::npos : py_space(c);
  };
  size_t b = 0, e = u.size();
  if (left)
    while (b < e && strip_it(u[b])) ++b;
  if (right)
    while (e > b && strip_it(u[e - 1])) --e;
  return encode_utf8(std::u32string_view(u).substr(b, e - b));
}

std::vector<std::string> py_split(const std::string& s, const Value& sep, int64_t maxsplit) {
  std::vector<std::string> out;
  if (sep.k == K::kNone || sep.undefined()) {
    std::u32string u = decode_utf8(s);
    size_t p = 0;
    while (true) {
      while (p < u.size() && py_space(u[p])) ++p;
      if (p >= u.size()) break;
      if (maxsplit >= 0 && int64_t(out.size()) == maxsplit) {
        out.push_back(encode_utf8(std::u32string_view(u).substr(p)));  // the rest, as it is
        break;
      }
      size_t q = p;
      while (q < u.size() && !py_space(u[q])) ++q;
      out.push_back(encode_utf8(std::u32string_view(u).substr(p, q - p)));
      p = q;
    }
    return out;
  }
  if (sep.k != K::kStr) fail("must be str or None, not " + std::string("other"));
  if (sep.s.empty()) fail("empty separator");
  size_t p = 0;
  while (true) {
    size_t q = s.find(sep.s, p);
    if (q == std::string::npos || (maxsplit >= 0 && int64_t(out.size()) == maxsplit)) {
      out.push_back(s.substr(p));
      break;
    }
    out.push_back(s.substr(p, q - p));
    p = q + sep.s.size();
  }
  return out;
}

std::string py_float_repr(double x) {
  if (std::isnan(x)) return "nan";
  if (std::isinf(x)) return x < 0 ? "-inf" : "inf";
  if (x == 0) return std::signbit(x) ? "-0.0" : "0.0";
  char buf[64];
  auto r = std::to_chars(buf, buf + sizeof buf, x, std::chars_format::scientific);
  std::string sci(buf, r.ptr);  // d.ddde[+-]XX
  size_t epos = sci.find('e');
  std::string mant = sci.substr(0, epos);
  int exp = std::stoi(sci.substr(epos + 1));
  bool neg = mant[0] == '-';
  if (neg) mant.erase(0, 1);
  std::string digits;
  for (char c : mant)
    if (c != '.') digits += c;
  std::string out;
  if (exp < -4 || exp >= 16) {
    out = digits.substr(0, 1);
    if (digits.size() > 1) out += "." + digits.substr(1);
    char eb[16];
    std::snprintf(eb, sizeof eb, "e%c%02d", exp < 0 ? '-' : '+', std::abs(exp));
    out += eb;
  } else if (exp < 0) {
    out = "0." + std::string(size_t(-exp - 1), '0') + digits;
  } else {
    if (int(digits.size()) <= exp + 1) {
      out = digits + std::string(size_t(exp + 1 - int(digits.size())), '0') + ".0";
    } else {
      out = digits.substr(0, size_t(exp + 1)) + "." + digits.substr(size_t(exp + 1));
    }
  }
  return neg ? "-" + out : out;
}

std::string py_str_repr(const std::string& s) {
  bool has_single = s.find('\'') != std::string::npos,
       has_double = s.find('"') != std::string::npos;
  char q = (has_single && !has_double) ? '"' : '\'';
  std::string out(1, q);
  for (char32_t c : decode_utf8(s)) {
    if (c == char32_t(q) || c == '\\') {
      out += '\\';
      out += char(c);
    } else if (c == '\n')
      out += "\\n";
    else if (c == '\r')
      out += "\\r";
    else if (c == '\t')
      out += "\\t";
    else if (c < 0x20 || c == 0x7f || (c >= 0x80 && c < 0xa0)) {
      char b[8];
      std::snprintf(b, sizeof b, "\\x%02x", unsigned(c));
      out += b;
    } else if (c == 0xad || c == 0x2028 || c == 0x2029 || (c >= 0x200b && c <= 0x200f) ||
               c == 0xfeff) {
      char b[12];
      std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
      out += b;
    } else
      append_utf8(out, c);
  }
  return out + q;
}

std::string to_str(const Value& v);

std::string repr(const Value& v) {
  switch (v.k) {
    case K::kStr:
      return py_str_repr(v.s);
    case K::kUndef:
      return "Undefined";
    default:
      return to_str(v);
  }
}

std::string to_str(const Value& v) {
  switch (v.k) {
    case K::kUndef:
      return "";
    case K::kNone:
      return "None";
    case K::kBool:
      return v.b ? "True" : "False";
    case K::kInt:
      return std::to_string(v.i);
    case K::kFloat:
      return py_float_repr(v.f);
    case K::kStr:
      return v.s;
    case K::kList: {
      std::string out = v.is_tuple ? "(" : "[";
      for (size_t j = 0; j < v.l->size(); ++j) out += (j ? ", " : "") + repr((*v.l)[j]);
      if (v.is_tuple && v.l->size() == 1) out += ",";
      return out + (v.is_tuple ? ")" : "]");
    }
    case K::kDict: {
      std::string out = "{";
      bool first = true;
      for (auto& [k, x] : v.d->items) {
        out += (first ? "" : ", ") + py_str_repr(k) + ": " + repr(x);
        first = false;
      }
      return out + "}";
    }
    case K::kNs:
      return "<Namespace>";
    case K::kFn:
      return "<function>";
  }
  return "";
}

const char* type_name(const Value& v) {
  switch (v.k) {
    case K::kUndef:
      return "Undefined";
    case K::kNone:
      return "NoneType";
    case K::kBool:
      return "bool";
    case K::kInt:
      return "int";
    case K::kFloat:
      return "float";
    case K::kStr:
      return "str";
    case K::kList:
      return v.is_tuple ? "tuple" : "list";
    case K::kDict:
      return "dict";
    case K::kNs:
      return "Namespace";
    case K::kFn:
      return "function";
  }
  return "?";
}

[[noreturn]] void undefined_error(const Value& v) {
  fail("" + (v.s.empty() ? std::string("value is undefined") : v.s));
}

bool truthy(const Value& v) {
  switch (v.k) {
    case K::kUndef:
    case K::kNone:
      return false;
    case K::kBool:
      return v.b;
    case K::kInt:
      return v.i != 0;
    case K::kFloat:
      return v.f != 0;
    case K::kStr:
      return !v.s.empty();
    case K::kList:
      return !v.l->empty();
    case K::kDict:
      return !v.d->items.empty();
    default:
      return true;
  }
}

bool py_eq(const Value& a, const Value& b) {
  if (a.number() && b.number()) {
    if (a.k == K::kFloat || b.k == K::kFloat) return a.as_double() == b.as_double();
    return a.as_int() == b.as_int();
  }
  if (a.k != b.k) return false;
  switch (a.k) {
    case K::kUndef:
    case K::kNone:
      return true;
    case K::kStr:
      return a.s == b.s;
    case K::kList:
      if (a.is_tuple != b.is_tuple || a.l->size() != b.l->size()) return false;
      for (size_t j = 0; j < a.l->size(); ++j)
        if (!py_eq((*a.l)[j], (*b.l)[j])) return false;
      return true;
    case K::kDict: {
      if (a.d->items.size() != b.d->items.size()) return false;
      for (auto& [k, x] : a.d->items) {
        const Value* y = b.d->find(k);
        if (!y || !py_eq(x, *y)) return false;
      }
      return true;
    }
    default:
      return a.d == b.d && a.fn == b.fn;
  }
}

int py_cmp(const Value& a, const Value& b, const char* op) {
  if (a.undefined() || b.undefined()) undefined_error(a.undefined() ? a : b);
  if (a.number() && b.number()) {
    double x = a.as_double(), y = b.as_double();
    if (a.k != K::kFloat && b.k != K::kFloat)
      return a.as_int() < b.as_int() ? -1 : a.as_int() > b.as_int();
    return x < y ? -1 : x > y;
  }
  if (a.k == K::kStr && b.k == K::kStr)
    return a.s < b.s ? -1 : a.s > b.s;  // UTF-8 order = code points
  if (a.k == K::kList && b.k == K::kList) {
    for (size_t j = 0; j < std::min(a.l->size(), b.l->size()); ++j) {
      if (py_eq((*a.l)[j], (*b.l)[j])) continue;
      return py_cmp((*a.l)[j], (*b.l)[j], op);
    }
    return a.l->size() < b.l->size() ? -1 : a.l->size() > b.l->size();
  }
  fail(std::string("'") + op + "' not supported between instances of '" + type_name(a) + "' and '" +
       type_name(b) + "'");
}

// Items of an iterable as Python iterates it (dicts give their keys, strings their characters).
List iterate(const Value& v) {
  switch (v.k) {
    case K::kUndef:
      return {};
    case K::kList:
      return *v.l;
    case K::kDict: {
      List out;
      for (auto& [k, x] : v.d->items) out.push_back(Value::str(k));
      return out;
    }
    case K::kStr: {
      List out;
      for (char32_t c : decode_utf8(v.s)) {
        std::string one;
        append_utf8(one, c);
        out.push_back(Value::str(one));
      }
      return out;
    }
    default:
      fail(std::string("'") + type_name(v) + "' object is not iterable");
  }
}

bool py_contains(const Value& container, const Value& item) {
  if (container.k == K::kStr) {
    if (item.k != K::kStr) fail("'in <string>' requires string as left operand");
    return container.s.find(item.s) != std::string::npos;
  }
  if (container.k == K::kDict) return item.k == K::kStr && container.d->find(item.s) != nullptr;
  for (const Value& x : iterate(container))
    if (py_eq(x, item)) return true;
  return false;
}

// ---------------------------------------------------------------- JSON (Python's json.dumps)

void json_string(std::string& out, const std::string& s, bool ensure_ascii) {
  out += '"';
  for (char32_t c : decode_utf8(s)) {
    switch (c) {
      case '"':
        out += "\\\"";
        break;
      case '\\':
        out += "\\\\";
        break;
      case '\n':
        out += "\\n";
        break;
      case '\r':
        out += "\\r";
        break;
      case '\t':
        out += "\\t";
        break;
      case '\b':
        out += "\\b";
        break;
      case '\f':
        out += "\\f";
        break;
      default: {
        char b[16];
        if (c < 0x20 || (ensure_ascii && c >= 0x7f)) {
          if (c >= 0x10000) {
            unsigned v = unsigned(c) - 0x10000;
            std::snprintf(b, sizeof b, "\\u%04x\\u%04x", 0xd800 + (v >> 10), 0xdc00 + (v & 0x3ff));
          } else {
            std::snprintf(b, sizeof b, "\\u%04x", unsigned(c));
          }
          out += b;
        } else {
          append_utf8(out, c);
        }
      }
    }
  }
  out += '"';
}

struct JsonStyle {
  bool ensure_ascii = false;
  int indent = -1;  // -1: none
  std::string indent_str;
  std::string item_sep = ", ", key_sep = ": ";
  bool sort_keys = false;
};

void json_dump(std::string& out, const Value& v, const JsonStyle& st, int level) {
  auto newline = [&](int lvl) {
    out += '\n';
    for (int j = 0; j < lvl; ++j) out += st.indent_str;
  };
  switch (v.k) {
    case K::kNone:
      out += "null";
      return;
    case K::kBool:
      out += v.b ? "true" : "false";
      return;
    case K::kInt:
      out += std::to_string(v.i);
      return;
    case K::kFloat:
      if (std::isnan(v.f))
        out += "NaN";
      else if (std::isinf(v.f))
        out += v.f < 0 ? "-Infinity" : "Infinity";
      else
        out += py_float_repr(v.f);
      return;
    case K::kStr:
      json_string(out, v.s, st.ensure_ascii);
      return;
    case K::kList: {
      if (v.l->empty()) {
        out += "[]";
        return;
      }
      out += '[';
      for (size_t j = 0; j < v.l->size(); ++j) {
        if (j) out += st.item_sep;
        if (st.indent >= 0) newline(level + 1);
        json_dump(out, (*v.l)[j], st, level + 1);
      }
      if (st.indent >= 0) newline(level);
      out += ']';
      return;
    }
    case K::kDict: {
      if (v.d->items.empty()) {
        out += "{}";
        return;
      }
      std::vector<const std::pair<std::string, Value>*> items;
      for (auto& it : v.d->items) items.push_back(&it);
      if (st.sort_keys)
        std::stable_sort(items.begin(), items.end(),
                         [](auto* a, auto* b) { return a->first < b->first; });
      out += '{';
      for (size_t j = 0; j < items.size(); ++j) {
        if (j) out += st.item_sep;
        if (st.indent >= 0) newline(level + 1);
        json_string(out, items[j]->first, st.ensure_ascii);
        out += st.key_sep;
        json_dump(out, items[j]->second, st, level + 1);
      }
      if (st.indent >= 0) newline(level);
      out += '}';
      return;
    }
    default:
      fail(std::string("Object of type ") + type_name(v) + " is not JSON serializable");
  }
}

Value from_json(const nlohmann::ordered_json& j) {
  switch (j.type()) {
    case nlohmann::ordered_json::value_t::null:
      return Value::none();
    case nlohmann::ordered_json::value_t::boolean:
      return Value::boolean(j.get<bool>());
    case nlohmann::ordered_json::value_t::number_integer:
      return Value::integer(j.get<int64_t>());
    case nlohmann::ordered_json::value_t::number_unsigned:
      return Value::integer(int64_t(j.get<uint64_t>()));
    case nlohmann::ordered_json::value_t::number_float:
      return Value::real(j.get<double>());
    case nlohmann::ordered_json::value_t::string:
      return Value::str(j.get<std::string>());
    case nlohmann::ordered_json::value_t::array: {
      List l;
      for (auto& x : j) l.push_back(from_json(x));
      return Value::list(std::move(l));
    }
    case nlohmann::ordered_json::value_t::object: {
      Value d = Value::dict();
      for (auto& [k, x] : j.items()) d.d->set(k, from_json(x));
      return d;
    }
    default:
      return Value::none();
  }
}

// ---------------------------------------------------------------- lexer

enum class T {
  kText,
  kVarBegin,
  kVarEnd,
  kBlockBegin,
  kBlockEnd,
  kName,
  kStr,
  kInt,
  kFloat,
  kOp,
  kEof
};

struct Tok {
  T t;
  std::string v;
  int line = 1;
  int64_t i = 0;
  double f = 0;
};

bool is_name_start(char c) { return std::isalpha(static_cast<unsigned char>(c)) || c == '_'; }
bool is_name_char(char c) { return std::isalnum(static_cast<unsigned char>(c)) || c == '_'; }

// Python's "unicode-escape" decoding of a string literal's body (as jinja2's lexer does it).
std::string unescape(std::string_view body, int line) {
  std::string out;
  for (size_t p = 0; p < body.size(); ++p) {
    char c = body[p];
    if (c != '\\' || p + 1 >= body.size()) {
      out += c;
      continue;
    }
    char e = body[++p];
    auto hex = [&](int n) {
      uint32_t v = 0;
      for (int j = 0; j < n; ++j) {
        if (p + 1 >= body.size())
          fail("chat template line " + std::to_string(line) + ": truncated escape");
        char h = body[++p];
        if (!std::isxdigit(static_cast<unsigned char>(h)))
          fail("chat template line " + std::to_string(line) + ": bad escape");
        v = v * 16 + uint32_t(std::isdigit(static_cast<unsigned char>(h))
                                  ? h - '0'
                                  : (std::tolower(h) - 'a' + 10));
      }
      append_utf8(out, char32_t(v));
    };
    switch (e) {
      case 'n':
        out += '\n';
        break;
      case 't':
        out += '\t';
        break;
      case 'r':
        out += '\r';
        break;
      case '\\':
        out += '\\';
        break;
      case '\'':
        out += '\'';
        break;
      case '"':
        out += '"';
        break;
      case 'a':
        out += '\a';
        break;
      case 'b':
        out += '\b';
        break;
      case 'f':
        out += '\f';
        break;
      case 'v':
        out += '\v';
        break;
      case '\n':
        break;
      case 'x':
        hex(2);
        break;
      case 'u':
        hex(4);
        break;
      case 'U':
        hex(8);
        break;
      default:
        if (e >= '0' && e <= '7') {
          uint32_t v = uint32_t(e - '0');
          for (int j = 0; j < 2 && p + 1 < body.size() && body[p + 1] >= '0' && body[p + 1] <= '7';
               ++j)
            v = v * 8 + uint32_t(body[++p] - '0');
          append_utf8(out, char32_t(v));
        } else {
          out += '\\';
          out += e;
        }
    }
  }
  return out;
}

class Lexer {
 public:
  explicit Lexer(std::string src) : src_(std::move(src)) {}

  std::vector<Tok> run() {
    normalise_newlines();
    size_t pos = 0;
    bool line_starting = true;  // the previous token ended a line (jinja2's lstrip rule)
    bool strip_next = false;    // the previous tag ended with '-'
    while (pos < src_.size()) {
      size_t open = find_open(pos);
      std::string text = src_.substr(pos, open - pos);
      if (strip_next) {
        size_t b = 0;
        while (b < text.size() && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
        text.erase(0, b);
      }
      strip_next = false;
      if (open == src_.size()) {
        emit_text(text, pos);
        break;
      }
      char kind = src_[open + 1];  // '{', '%', '#'
      char mod = open + 2 < src_.size() ? src_[open + 2] : 0;
      if (mod == '-') {
        size_t e = text.size();
        while (e > 0 && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
        text.resize(e);
      } else if (mod != '+' && kind != '{') {
        size_t l_pos = text.rfind('\n');
        l_pos = l_pos == std::string::npos ? 0 : l_pos + 1;
        if (l_pos > 0 || line_starting) {
          bool ws = l_pos < text.size();
          for (size_t j = l_pos; j < text.size(); ++j)
            if (!std::isspace(static_cast<unsigned char>(text[j]))) ws = false;
          if (ws) text.resize(l_pos);
        }
      }
      emit_text(text, pos);
      size_t body = open + 2 + ((mod == '-' || mod == '+') ? 1 : 0);
      if (kind == '#') {
        size_t close = src_.find("#}", body);
        if (close == std::string::npos) error(line_at(open), "unclosed comment");
        bool minus = close > body && src_[close - 1] == '-';
        bool plus = close > body && src_[close - 1] == '+';
        pos = close + 2;
        pos = after_block_end(pos, minus, plus, &strip_next);
        line_starting = pos > 0 && src_[pos - 1] == '\n';
        continue;
      }
      if (kind == '%' && is_raw(body)) {
        pos = lex_raw(body, &strip_next);
        line_starting = pos > 0 && src_[pos - 1] == '\n';
        continue;
      }
      toks_.push_back({kind == '{' ? T::kVarBegin : T::kBlockBegin, "", line_at(open)});
      pos = lex_expr(body, kind, &strip_next);
      line_starting = pos > 0 && src_[pos - 1] == '\n';
    }
    toks_.push_back({T::kEof, "", line_at(src_.size())});
    return std::move(toks_);
  }

 private:
  [[noreturn]] void error(int line, const std::string& msg) {
    fail("chat template line " + std::to_string(line) + ": " + msg);
  }

  void normalise_newlines() {
    std::string out;
    out.reserve(src_.size());
    for (size_t p = 0; p < src_.size(); ++p) {
      if (src_[p] == '\r') {
        out += '\n';
        if (p + 1 < src_.size() && src_[p + 1] == '\n') ++p;
      } else {
        out += src_[p];
      }
    }
    if (!out.empty() && out.back() == '\n') out.pop_back();  // keep_trailing_newline=False
    src_ = std::move(out);
  }

  int line_at(size_t pos) {
    while (line_pos_ < pos && line_pos_ < src_.size()) {
      if (src_[line_pos_] == '\n') ++line_;
      ++line_pos_;
    }
    return line_;
  }

  size_t find_open(size_t pos) const {
    for (size_t p = pos; p + 1 < src_.size(); ++p)
      if (src_[p] == '{' && (src_[p + 1] == '{' || src_[p + 1] == '%' || src_[p + 1] == '#'))
        return p;
    return src_.size();
  }

  void emit_text(const std::string& text, size_t pos) {
    if (!text.empty()) toks_.push_back({T::kText, text, line_at(pos)});
  }

  // After a `%}` or `#}`: trim_blocks drops one newline unless the tag ended in '-' or '+'.
  size_t after_block_end(size_t pos, bool minus, bool plus, bool* strip_next) {
    if (minus)
      *strip_next = true;
    else if (!plus && pos < src_.size() && src_[pos] == '\n')
      ++pos;
    return pos;
  }

  bool is_raw(size_t p) const {
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (src_.compare(p, 3, "raw") != 0) return false;
    p += 3;
    while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
    if (p < src_.size() && src_[p] == '-') ++p;
    return src_.compare(p, 2, "%}") == 0;
  }

  size_t lex_raw(size_t p, bool* strip_next) {
    size_t close = src_.find("%}", p);
    bool minus = src_[close - 1] == '-';
    p = after_block_end(close + 2, minus, false, strip_next);
    size_t search = p;
    while (true) {
      size_t open = src_.find("{%", search);
      if (open == std::string::npos) error(line_at(p), "missing endraw");
      size_t q = open + 2;
      bool lminus = q < src_.size() && src_[q] == '-';
      if (lminus || (q < src_.size() && src_[q] == '+')) ++q;
      while (q < src_.size() && std::isspace(static_cast<unsigned char>(src_[q]))) ++q;
      if (src_.compare(q, 6, "endraw") == 0) {
        std::string text = src_.substr(p, open - p);
        if (*strip_next) {
          size_t b = 0;
          while (b < text.size() && std::isspace(static_cast<unsigned char>(text[b]))) ++b;
          text.erase(0, b);
          *strip_next = false;
        }
        if (lminus) {
          size_t e = text.size();
          while (e > 0 && std::isspace(static_cast<unsigned char>(text[e - 1]))) --e;
          text.resize(e);
        }
        emit_text(text, p);
        size_t c = src_.find("%}", q);
        if (c == std::string::npos) error(line_at(q), "unclosed endraw");
        bool rminus = src_[c - 1] == '-';
        return after_block_end(c + 2, rminus, src_[c - 1] == '+', strip_next);
      }
      search = open + 2;
    }
  }

  size_t lex_expr(size_t p, char kind, bool* strip_next) {
    const char close0 = kind == '{' ? '}' : '%';
    while (true) {
      while (p < src_.size() && std::isspace(static_cast<unsigned char>(src_[p]))) ++p;
      if (p >= src_.size()) error(line_at(p), "unexpected end of template inside a tag");
      int line = line_at(p);
      // The end of the tag, with an optional '-' / '+' before it.
      for (int skip : {0, 1}) {
        if (skip && !(src_[p] == '-' || src_[p] == '+')) continue;
        size_t q = p + size_t(skip);
        if (q + 1 < src_.size() && src_[q] == close0 && src_[q + 1] == '}') {
          toks_.push_back({kind == '{' ? T::kVarEnd : T::kBlockEnd, "", line});
          size_t end = q + 2;
          if (kind == '{') {
            if (skip && src_[p] == '-') *strip_next = true;
            return end;
          }
          return after_block_end(end, skip && src_[p] == '-', skip && src_[p] == '+', strip_next);
        }
      }
      char c = src_[p];
      if (is_name_start(c)) {
        size_t q = p;
        while (q < src_.size() && is_name_char(src_[q])) ++q;
        toks_.push_back({T::kName, src_.substr(p, q - p), line});
        p = q;
      } else if (std::isdigit(static_cast<unsigned char>(c))) {
        size_t q = p;
        auto digits = [&] {
          while (q < src_.size() &&
                 (std::isdigit(static_cast<unsigned char>(src_[q])) || src_[q] == '_'))
            ++q;
        };
        digits();
        bool is_float = false;
        if (q + 1 < src_.size() && src_[q] == '.' &&
            std::isdigit(static_cast<unsigned char>(src_[q + 1]))) {
          is_float = true;
          ++q;
          digits();
        }
        if (q < src_.size() && (src_[q] == 'e' || src_[q] == 'E')) {
          size_t r = q + 1;
          if (r < src_.size() && (src_[r] == '+' || src_[r] == '-')) ++r;
          if (r < src_.size() && std::isdigit(static_cast<unsigned char>(src_[r]))) {
            is_float = true;
            q = r;
            digits();
          }
        }
        std::string text;
        for (size_t j = p; j < q; ++j)
          if (src_[j] != '_') text += src_[j];
        Tok t{is_float ? T::kFloat : T::kInt, text, line};
        if (is_float)
          t.f = std::strtod(text.c_str(), nullptr);
        else
          t.i = std::strtoll(text.c_str(), nullptr, 10);
        toks_.push_back(t);
        p = q;
      } else if (c == '\'' || c == '"') {
        size_t q = p + 1;
        while (q < src_.size() && src_[q] != c) q += src_[q] == '\\' ? 2 : 1;
        if (q >= src_.size()) error(line, "unterminated string");
        toks_.push_back(
            {T::kStr, unescape(std::string_view(src_).substr(p + 1, q - p - 1), line), line});
        p = q + 1;
      } else {
        static const char* ops[] = {"//", "**", "==", "!=", "<=", ">=", "+", "-", "*",
                                    "/",  "%",  "~",  "<",  ">",  "=",  "(", ")", "[",
                                    "]",  "{",  "}",  ",",  ".",  ":",  "|", ";"};
        bool found = false;
        for (const char* op : ops) {
          size_t n = std::strlen(op);
          if (src_.compare(p, n, op) == 0) {
            toks_.push_back({T::kOp, op, line});
            p += n;
            found = true;
            break;
          }
        }
        if (!found) error(line, std::string("unexpected character '") + c + "'");
      }
    }
  }

  std::string src_;
  std::vector<Tok> toks_;
  size_t line_pos_ = 0;
  int line_ = 1;
};

// ---------------------------------------------------------------- AST

struct Expr;
using ExprP = std::unique_ptr<Expr>;
struct Expr {
  enum Kind {
    kConst,
    kName,
    kList,
    kTuple,
    kDict,
    kAttr,
    kItem,
    kSlice,
    kCall,
    kFilter,
    kTest,
    kNeg,
    kPos,
    kNot,
    kAnd,
    kOr,
    kBinary,
    kCompare,
    kCond
  } kind;
  int line = 0;
  Value constant;
  std::string name;         // kName, kAttr, kFilter, kTest; kBinary: the operator
  ExprP a, b, c;            // operands; kSlice: start, stop, step (any may be null)
  std::vector<ExprP> args;  // list / tuple items, dict keys+values interleaved, call args
  std::vector<std::pair<std::string, ExprP>> kwargs;
  std::vector<std::string> ops;  // kCompare: operators between a and args[...]
  bool negated = false;          // kTest: `is not`
};

struct Node;
using Body = std::vector<std::unique_ptr<Node>>;
struct Node {
  enum Kind {
    kText,
    kOutput,
    kIf,
    kFor,
    kSet,
    kSetBlock,
    kMacro,
    kBreak,
    kContinue,
    kGeneration,
    kFilterBlock
  } kind;
  int line = 0;
  std::string text;                              // kText
  ExprP expr;                                    // kOutput, kSet value, kFor iterable
  std::vector<std::pair<ExprP, Body>> branches;  // kIf
  Body body, else_body;
  std::vector<std::string> targets;                   // kFor / kSet / kSetBlock names
  std::string attr;                                   // kSet: ns.attr
  ExprP cond;                                         // kFor: `if` filter
  std::vector<std::pair<std::string, ExprP>> params;  // kMacro (name, default or null)
  std::string name;                                   // kMacro / kFilterBlock name
  ExprP filter;  // kFilterBlock / kSetBlock: a filter chain on a placeholder
};

// ---------------------------------------------------------------- parser

class Parser {
 public:
  explicit Parser(std::vector<Tok> toks) : t_(std::move(toks)) {}

  Body parse_template(bool* uses_generation) {
    Body body = parse_body({});
    if (cur().t != T::kEof) error("unexpected tag '" + pending_tag_ + "'");
    *uses_generation = uses_generation_;
    return body;
  }

 private:
  const Tok& cur() const { return t_[p_]; }
  const Tok& peek(size_t n = 1) const { return t_[std::min(p_ + n, t_.size() - 1)]; }
  void next() {
    if (p_ + 1 < t_.size()) ++p_;
  }
  [[noreturn]] void error(const std::string& msg) const {
    fail("chat template line " + std::to_string(cur().line) + ": " + msg);
  }
  bool is_op(const char* op) const { return cur().t == T::kOp && cur().v == op; }
  bool is_name(const char* n) const { return cur().t == T::kName && cur().v == n; }
  void expect_op(const char* op) {
    if (!is_op(op)) error(std::string("expected '") + op + "'");
    next();
  }
  std::string expect_name() {
    if (cur().t != T::kName) error("expected a name");
    std::string v = cur().v;
    next();
    return v;
  }
  void expect_block_end() {
    if (cur().t != T::kBlockEnd) error("expected the end of the statement");
    next();
  }

  // Parses nodes until a block tag whose name is in `ends` (left as the current token, after
  // kBlockBegin) or the end of the template.
  Body parse_body(const std::vector<std::string>& ends) {
    Body body;
    while (cur().t != T::kEof) {
      if (cur().t == T::kText) {
        auto n = std::make_unique<Node>();
        n->kind = Node::kText;
        n->text = cur().v;
        body.push_back(std::move(n));
        next();
      } else if (cur().t == T::kVarBegin) {
        auto n = std::make_unique<Node>();
        n->kind = Node::kOutput;
        n->line = cur().line;
        next();
        n->expr = parse_expression();
        if (cur().t != T::kVarEnd) error("expected '}}'");
        next();
        body.push_back(std::move(n));
      } else if (cur().t == T::kBlockBegin) {
        const Tok& name = peek();
        if (name.t != T::kName) {
          next();
          error("expected a statement name");
        }
        if (std::find(ends.begin(), ends.end(), name.v) != ends.end()) {
          next();
          return body;
        }
        next();
        body.push_back(parse_statement());
      } else {
        error("unexpected token");
      }
    }
    if (!ends.empty()) error("missing '" + ends.front() + "'");
    return body;
  }

  std::unique_ptr<Node> parse_statement() {
    auto n = std::make_unique<Node>();
    n->line = cur().line;
    std::string kw = expect_name();
    if (kw == "if") {
      n->kind = Node::kIf;
      ExprP cond = parse_expression();
      expect_block_end();
      while (true) {
        Body b = parse_body({"elif", "else", "endif"});
        std::string which = expect_name();
        n->branches.emplace_back(std::move(cond), std::move(b));
        if (which == "elif") {
          cond = parse_expression();
          expect_block_end();
          continue;
        }
        if (which == "else") {
          expect_block_end();
          n->else_body = parse_body({"endif"});
          expect_name();
        }
        expect_block_end();
        break;
      }
    } else if (kw == "for") {
      n->kind = Node::kFor;
      n->targets.push_back(expect_name());
      while (is_op(",")) {
        next();
        n->targets.push_back(expect_name());
      }
      if (!is_name("in")) error("expected 'in'");
      next();
      n->expr = parse_condexpr(false);
      if (is_name("if")) {
        next();
        n->cond = parse_condexpr(true);
      }
      if (is_name("recursive")) error("recursive loops are not supported");
      expect_block_end();
      n->body = parse_body({"else", "endfor"});
      if (expect_name() == "else") {
        expect_block_end();
        n->else_body = parse_body({"endfor"});
        expect_name();
      }
      expect_block_end();
    } else if (kw == "set") {
      n->targets.push_back(expect_name());
      if (is_op(".")) {
        next();
        n->attr = expect_name();
      }
      while (is_op(",")) {
        next();
        n->targets.push_back(expect_name());
      }
      if (is_op("=")) {
        next();
        n->kind = Node::kSet;
        n->expr = parse_tuple_or_expr();
        expect_block_end();
      } else {
        n->kind = Node::kSetBlock;
        if (is_op("|")) n->filter = parse_filter_chain();
        expect_block_end();
        n->body = parse_body({"endset"});
        expect_name();
        expect_block_end();
      }
    } else if (kw == "macro") {
      n->kind = Node::kMacro;
      n->name = expect_name();
      expect_op("(");
      while (!is_op(")")) {
        std::string p = expect_name();
        ExprP def;
        if (is_op("=")) {
          next();
          def = parse_expression();
        }
        n->params.emplace_back(p, std::move(def));
        if (is_op(","))
          next();
        else if (!is_op(")"))
          error("expected ',' or ')'");
      }
      next();
      expect_block_end();
      n->body = parse_body({"endmacro"});
      expect_name();
      if (cur().t == T::kName) next();  // {% endmacro name %}
      expect_block_end();
    } else if (kw == "break" || kw == "continue") {
      n->kind = kw == "break" ? Node::kBreak : Node::kContinue;
      expect_block_end();
    } else if (kw == "generation") {
      n->kind = Node::kGeneration;
      uses_generation_ = true;
      expect_block_end();
      n->body = parse_body({"endgeneration"});
      expect_name();
      expect_block_end();
    } else if (kw == "filter") {
      n->kind = Node::kFilterBlock;
      n->filter = parse_filter_chain(/*leading_pipe=*/false);
      expect_block_end();
      n->body = parse_body({"endfilter"});
      expect_name();
      expect_block_end();
    } else {
      pending_tag_ = kw;
      error("unknown or unsupported tag '" + kw + "'");
    }
    return n;
  }

  // A filter chain applied to a placeholder name "\x01" (for {% filter %} and {% set x | f %}).
  ExprP parse_filter_chain(bool leading_pipe = true) {
    auto e = std::make_unique<Expr>();
    e->kind = Expr::kName;
    e->name = "\x01";
    if (!leading_pipe) {
      // current token is the filter name itself
      e = parse_filter(std::move(e), /*skip_pipe=*/true);
    }
    while (is_op("|")) e = parse_filter(std::move(e), false);
    return e;
  }

  ExprP parse_tuple_or_expr() {
    ExprP first = parse_expression();
    if (!is_op(",")) return first;
    auto t = std::make_unique<Expr>();
    t->kind = Expr::kTuple;
    t->args.push_back(std::move(first));
    while (is_op(",")) {
      next();
      if (cur().t == T::kBlockEnd) break;
      t->args.push_back(parse_expression());
    }
    return t;
  }

  ExprP make(Expr::Kind k) {
    auto e = std::make_unique<Expr>();
    e->kind = k;
    e->line = cur().line;
    return e;
  }

  ExprP parse_expression() { return parse_condexpr(true); }

  ExprP parse_condexpr(bool with_condexpr) {
    ExprP e = parse_or();
    while (with_condexpr && is_name("if")) {
      next();
      auto c = make(Expr::kCond);
      c->b = parse_or();
      if (is_name("else")) {
        next();
        c->c = parse_condexpr(true);
      }
      c->a = std::move(e);
      e = std::move(c);
    }
    return e;
  }

  ExprP parse_or() {
    ExprP e = parse_and();
    while (is_name("or")) {
      next();
      auto o = make(Expr::kOr);
      o->a = std::move(e);
      o->b = parse_and();
      e = std::move(o);
    }
    return e;
  }
  ExprP parse_and() {
    ExprP e = parse_not();
    while (is_name("and")) {
      next();
      auto o = make(Expr::kAnd);
      o->a = std::move(e);
      o->b = parse_not();
      e = std::move(o);
    }
    return e;
  }
  ExprP parse_not() {
    if (is_name("not")) {
      next();
      auto n = make(Expr::kNot);
      n->a = parse_not();
      return n;
    }
    return parse_compare();
  }
  ExprP parse_compare() {
    ExprP e = parse_math1();
    ExprP cmp;
    while (true) {
      std::string op;
      if (cur().t == T::kOp && (cur().v == "==" || cur().v == "!=" || cur().v == "<" ||
                                cur().v == ">" || cur().v == "<=" || cur().v == ">=")) {
        op = cur().v;
        next();
      } else if (is_name("in")) {
        op = "in";
        next();
      } else if (is_name("not") && peek().t == T::kName && peek().v == "in") {
        op = "notin";
        next();
        next();
      } else {
        break;
      }
      if (!cmp) {
        cmp = make(Expr::kCompare);
        cmp->a = std::move(e);
      }
      cmp->ops.push_back(op);
      cmp->args.push_back(parse_math1());
    }
    return cmp ? std::move(cmp) : std::move(e);
  }
  ExprP binary(std::string op, ExprP a, ExprP b) {
    auto e = make(Expr::kBinary);
    e->name = std::move(op);
    e->a = std::move(a);
    e->b = std::move(b);
    return e;
  }
  ExprP parse_math1() {
    ExprP e = parse_concat();
    while (is_op("+") || is_op("-")) {
      std::string op = cur().v;
      next();
      e = binary(op, std::move(e), parse_concat());
    }
    return e;
  }
  ExprP parse_concat() {
    ExprP e = parse_math2();
    while (is_op("~")) {
      next();
      e = binary("~", std::move(e), parse_math2());
    }
    return e;
  }
  ExprP parse_math2() {
    ExprP e = parse_pow();
    while (is_op("*") || is_op("/") || is_op("//") || is_op("%")) {
      std::string op = cur().v;
      next();
      e = binary(op, std::move(e), parse_pow());
    }
    return e;
  }
  ExprP parse_pow() {
    ExprP e = parse_unary(true);
    while (is_op("**")) {
      next();
      e = binary("**", std::move(e), parse_unary(true));
    }
    return e;
  }
  ExprP parse_unary(bool with_filter) {
    ExprP e;
    if (is_op("-") || is_op("+")) {
      auto u = make(is_op("-") ? Expr::kNeg : Expr::kPos);
      next();
      u->a = parse_unary(false);
      e = std::move(u);
    } else {
      e = parse_primary();
    }
    e = parse_postfix(std::move(e));
    if (with_filter) e = parse_filter_expr(std::move(e));
    return e;
  }

  ExprP parse_primary() {
    const Tok& t = cur();
    if (t.t == T::kName) {
      auto e = make(Expr::kConst);
      if (t.v == "true" || t.v == "True")
        e->constant = Value::boolean(true);
      else if (t.v == "false" || t.v == "False")
        e->constant = Value::boolean(false);
      else if (t.v == "none" || t.v == "None")
        e->constant = Value::none();
      else {
        e->kind = Expr::kName;
        e->name = t.v;
      }
      next();
      return e;
    }
    if (t.t == T::kStr) {
      auto e = make(Expr::kConst);
      std::string s;
      while (cur().t == T::kStr) {  // adjacent literals concatenate
        s += cur().v;
        next();
      }
      e->constant = Value::str(s);
      return e;
    }
    if (t.t == T::kInt || t.t == T::kFloat) {
      auto e = make(Expr::kConst);
      e->constant = t.t == T::kInt ? Value::integer(t.i) : Value::real(t.f);
      next();
      return e;
    }
    if (is_op("(")) {
      next();
      if (is_op(")")) {
        next();
        return make(Expr::kTuple);
      }
      ExprP first = parse_expression();
      if (is_op(")")) {
        next();
        return first;
      }
      auto tup = make(Expr::kTuple);
      tup->args.push_back(std::move(first));
      while (is_op(",")) {
        next();
        if (is_op(")")) break;
        tup->args.push_back(parse_expression());
      }
      expect_op(")");
      return tup;
    }
    if (is_op("[")) {
      auto l = make(Expr::kList);
      next();
      while (!is_op("]")) {
        l->args.push_back(parse_expression());
        if (is_op(","))
          next();
        else if (!is_op("]"))
          error("expected ',' or ']'");
      }
      next();
      return l;
    }
    if (is_op("{")) {
      auto d = make(Expr::kDict);
      next();
      while (!is_op("}")) {
        d->args.push_back(parse_expression());
        expect_op(":");
        d->args.push_back(parse_expression());
        if (is_op(","))
          next();
        else if (!is_op("}"))
          error("expected ',' or '}'");
      }
      next();
      return d;
    }
    error("unexpected '" + t.v + "'");
  }

  ExprP parse_postfix(ExprP e) {
    while (true) {
      if (is_op(".")) {
        next();
        auto a = make(Expr::kAttr);
        if (cur().t == T::kInt) {
          a->kind = Expr::kItem;
          auto k = make(Expr::kConst);
          k->constant = Value::integer(cur().i);
          a->b = std::move(k);
        } else if (cur().t == T::kName) {
          a->name = cur().v;
        } else {
          error("expected an attribute name");
        }
        next();
        a->a = std::move(e);
        e = std::move(a);
      } else if (is_op("[")) {
        next();
        e = parse_subscript(std::move(e));
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  ExprP parse_subscript(ExprP target) {
    ExprP start, stop, step;
    bool slice = false;
    if (!is_op(":")) start = parse_expression();
    if (is_op(":")) {
      slice = true;
      next();
      if (!is_op("]") && !is_op(":")) stop = parse_expression();
      if (is_op(":")) {
        next();
        if (!is_op("]")) step = parse_expression();
      }
    }
    expect_op("]");
    auto e = make(slice ? Expr::kSlice : Expr::kItem);
    e->a = std::move(target);
    if (slice) {
      e->args.push_back(std::move(start));
      e->args.push_back(std::move(stop));
      e->args.push_back(std::move(step));
    } else {
      e->b = std::move(start);
    }
    return e;
  }

  void parse_args(Expr* call) {
    expect_op("(");
    while (!is_op(")")) {
      if (cur().t == T::kName && peek().t == T::kOp && peek().v == "=") {
        std::string k = cur().v;
        next();
        next();
        call->kwargs.emplace_back(k, parse_expression());
      } else {
        if (!call->kwargs.empty()) error("positional argument after a keyword argument");
        call->args.push_back(parse_expression());
      }
      if (is_op(","))
        next();
      else if (!is_op(")"))
        error("expected ',' or ')'");
    }
    next();
  }

  ExprP parse_call(ExprP fn) {
    auto c = make(Expr::kCall);
    c->a = std::move(fn);
    parse_args(c.get());
    return c;
  }

  ExprP parse_filter(ExprP target, bool skip_pipe) {
    if (!skip_pipe) next();  // '|'
    auto f = make(Expr::kFilter);
    f->name = expect_name();
    while (is_op(".")) {
      next();
      f->name += "." + expect_name();
    }
    if (is_op("(")) parse_args(f.get());
    f->a = std::move(target);
    return f;
  }

  ExprP parse_filter_expr(ExprP e) {
    while (true) {
      if (is_op("|")) {
        e = parse_filter(std::move(e), false);
      } else if (is_name("is")) {
        next();
        auto t = make(Expr::kTest);
        if (is_name("not")) {
          t->negated = true;
          next();
        }
        t->name = expect_name();
        while (is_op(".")) {
          next();
          t->name += "." + expect_name();
        }
        if (is_op("(")) {
          parse_args(t.get());
        } else if ((cur().t == T::kName && cur().v != "else" && cur().v != "or" &&
                    cur().v != "and") ||
                   cur().t == T::kStr || cur().t == T::kInt || cur().t == T::kFloat || is_op("(") ||
                   is_op("[") || is_op("{")) {
          if (is_name("is")) error("You cannot chain multiple tests with is");
          ExprP arg = parse_primary();
          arg = parse_postfix(std::move(arg));
          t->args.push_back(std::move(arg));
        }
        t->a = std::move(e);
        e = std::move(t);
      } else if (is_op("(")) {
        e = parse_call(std::move(e));
      } else {
        return e;
      }
    }
  }

  std::vector<Tok> t_;
  size_t p_ = 0;
  bool uses_generation_ = false;
  std::string pending_tag_;
};

// ---------------------------------------------------------------- evaluator

enum class Flow { kNormal, kBreak, kContinue };

using Frame = std::vector<std::pair<std::string, Value>>;

struct Renderer {
  std::vector<std::shared_ptr<Frame>> frames;
  std::string* out = nullptr;
  std::vector<std::pair<size_t, size_t>>* spans = nullptr;
  int depth = 0;

  Value lookup(const std::string& name) const {
    for (auto it = frames.rbegin(); it != frames.rend(); ++it)
      for (auto& [k, v] : **it)
        if (k == name) return v;
    return Value::undef("'" + name + "' is undefined");
  }
  void assign(const std::string& name, Value v) {
    Frame& f = *frames.back();
    for (auto& [k, old] : f)
      if (k == name) {
        old = std::move(v);
        return;
      }
    f.emplace_back(name, std::move(v));
  }

  // -------------------------------------------------- attribute / item access

  Value method(const Value& self, const std::string& name) {
    if (self.k == K::kStr) return str_method(self, name);
    if (self.k == K::kDict) {
      if (name == "items" || name == "keys" || name == "values" || name == "get") {
        std::shared_ptr<Dict> d = self.d;
        return Value::function([d, name](Args& a) {
          if (name == "get") {
            if (a.pos.empty()) fail("get expected at least 1 argument");
            const Value* v = a.pos[0].k == K::kStr ? d->find(a.pos[0].s) : nullptr;
            return v ? *v : (a.pos.size() > 1 ? a.pos[1] : Value::none());
          }
          List out;
          for (auto& [k, v] : d->items) {
            if (name == "keys")
              out.push_back(Value::str(k));
            else if (name == "values")
              out.push_back(v);
            else
              out.push_back(Value::list({Value::str(k), v}, true));
          }
          return Value::list(std::move(out));
        });
      }
      if (name == "pop" || name == "update" || name == "setdefault" || name == "clear" ||
          name == "popitem")
        return unsafe(name, "dict");
    }
    if (self.k == K::kList &&
        (name == "append" || name == "extend" || name == "insert" || name == "pop" ||
         name == "remove" || name == "clear" || name == "sort" || name == "reverse"))
      return unsafe(name, "list");
    return Value::undef();
  }

  static Value unsafe(const std::string& name, const char* type) {
    return Value::function([name, type](Args&) -> Value {
      fail("access to attribute '" + name + "' of '" + type + "' object is unsafe.");
    });
  }

  Value str_method(const Value& self, const std::string& name) {
    std::string s = self.s;
    auto fn = [&](std::function<Value(Args&)> f) { return Value::function(std::move(f)); };
    if (name == "strip" || name == "lstrip" || name == "rstrip") {
      bool l = name != "rstrip", r = name != "lstrip";
      return fn([s, l, r](Args& a) { return Value::str(py_strip(s, a.get(0, "chars"), l, r)); });
    }
    if (name == "split" || name == "rsplit") {
      return fn([s](Args& a) {
        Value maxs = a.get(1, "maxsplit", Value::integer(-1));
        List out;
        for (auto& part : py_split(s, a.get(0, "sep"), maxs.as_int()))
          out.push_back(Value::str(part));
        return Value::list(std::move(out));
      });
    }
    if (name == "startswith" || name == "endswith") {
      bool starts = name == "startswith";
      return fn([s, starts](Args& a) {
        Value p = a.get(0, "prefix");
        auto test = [&](const std::string& x) {
          if (x.size() > s.size()) return false;
          return starts ? s.compare(0, x.size(), x) == 0
                        : s.compare(s.size() - x.size(), x.size(), x) == 0;
        };
        if (p.k == K::kStr) return Value::boolean(test(p.s));
        if (p.k == K::kList && p.is_tuple) {
          for (auto& x : *p.l)
            if (x.k == K::kStr && test(x.s)) return Value::boolean(true);
          return Value::boolean(false);
        }
        fail("startswith first arg must be str or a tuple of str");
      });
    }
    if (name == "upper" || name == "lower" || name == "title" || name == "capitalize") {
      return fn([s, name](Args&) { return Value::str(case_map(s, name)); });
    }
    if (name == "replace") {
      return fn([s](Args& a) {
        Value o = a.get(0, "old"), n = a.get(1, "new"), c = a.get(2, "count", Value::integer(-1));
        return Value::str(replace(s, o, n, c.as_int()));
      });
    }
    if (name == "find" || name == "count") {
      bool find = name == "find";
      return fn([s, find](Args& a) {
        Value sub = a.get(0, "sub");
        if (sub.k != K::kStr) fail("must be str");
        if (find) {
          size_t p = s.find(sub.s);
          return Value::integer(p == std::string::npos ? -1 : int64_t(str_len(s.substr(0, p))));
        }
        int64_t n = 0;
        if (sub.s.empty()) return Value::integer(int64_t(str_len(s)) + 1);
        for (size_t p = s.find(sub.s); p != std::string::npos; p = s.find(sub.s, p + sub.s.size()))
          ++n;
        return Value::integer(n);
      });
    }
    if (name == "join") {
      return fn([s](Args& a) {
        std::string out;
        bool first = true;
        for (auto& x : iterate(a.get(0, "iterable"))) {
          if (x.k != K::kStr) fail("sequence item: expected str instance");
          out += (first ? "" : s) + x.s;
          first = false;
        }
        return Value::str(out);
      });
    }
    if (name == "isdigit" || name == "isspace" || name == "isalpha" || name == "isupper" ||
        name == "islower") {
      return fn([s, name](Args&) {
        if (s.empty()) return Value::boolean(false);
        bool ok = true, cased = false;
        for (unsigned char c : s) {
          if (name == "isdigit")
            ok &= std::isdigit(c) != 0;
          else if (name == "isspace")
            ok &= std::isspace(c) != 0;
          else if (name == "isalpha")
            ok &= std::isalpha(c) != 0;
          else if (name == "isupper") {
            ok &= !std::islower(c);
            cased |= std::isupper(c) != 0;
          } else {
            ok &= !std::isupper(c);
            cased |= std::islower(c) != 0;
          }
        }
        if (name == "isupper" || name == "islower") ok &= cased;
        return Value::boolean(ok);
      });
    }
    return Value::undef();
  }

  static std::string replace(const std::string& s, const Value& o, const Value& n, int64_t count) {
    if (o.k != K::kStr || n.k != K::kStr) fail("replace() arguments must be str");
    std::string out;
    if (o.s.empty()) {  // Python inserts `new` between every character
      std::u32string u = decode_utf8(s);
      int64_t done = 0;
      for (size_t j = 0; j <= u.size(); ++j) {
        if (count < 0 || done < count) {
          out += n.s;
          ++done;
        }
        if (j < u.size()) append_utf8(out, u[j]);
      }
      return out;
    }
    size_t p = 0;
    int64_t done = 0;
    while (true) {
      size_t q = s.find(o.s, p);
      if (q == std::string::npos || (count >= 0 && done >= count)) break;
      out += s.substr(p, q - p) + n.s;
      p = q + o.s.size();
      ++done;
    }
    return out + s.substr(p);
  }
  // Jinja's environment.getattr: the Python attribute first, then the item.
  Value getattr(const Value& obj, const std::string& name) {
    if (obj.undefined()) undefined_error(obj);
    if (obj.k == K::kNs) {
      const Value* v = obj.d->find(name);
      return v ? *v : Value::undef("'Namespace' has no attribute '" + name + "'");
    }
    Value m = method(obj, name);
    if (!m.undefined()) return m;
    if (obj.k == K::kDict) {
      const Value* v = obj.d->find(name);
      if (v) return *v;
    }
    return Value::undef("'" + std::string(type_name(obj)) + " object' has no attribute '" + name +
                        "'");
  }

  // Jinja's environment.getitem: the item first, then the attribute.
  Value getitem(const Value& obj, const Value& key) {
    if (obj.undefined()) undefined_error(obj);
    if (obj.k == K::kDict && key.k == K::kStr) {
      const Value* v = obj.d->find(key.s);
      if (v) return *v;
    } else if (obj.k == K::kNs && key.k == K::kStr) {
      const Value* v = obj.d->find(key.s);
      if (v) return *v;
    } else if ((obj.k == K::kList || obj.k == K::kStr) && (key.k == K::kInt || key.k == K::kBool)) {
      int64_t idx = key.as_int();
      if (obj.k == K::kList) {
        int64_t n = int64_t(obj.l->size());
        if (idx < 0) idx += n;
        if (idx >= 0 && idx < n) return (*obj.l)[size_t(idx)];
      } else {
        std::u32string u = decode_utf8(obj.s);
        int64_t n = int64_t(u.size());
        if (idx < 0) idx += n;
        if (idx >= 0 && idx < n) return Value::str(encode_utf8(u.substr(size_t(idx), 1)));
      }
      return Value::undef(std::string(type_name(obj)) + " index out of range");
    }
    if (key.k == K::kStr) return getattr(obj, key.s);
    return Value::undef("'" + std::string(type_name(obj)) + " object' has no element " + repr(key));
  }

  Value slice(const Value& obj, const Value& start, const Value& stop, const Value& step) {
    if (obj.undefined()) undefined_error(obj);
    auto num = [](const Value& v, bool& given) -> int64_t {
      given = !(v.undefined() || v.k == K::kNone);
      if (given && v.k != K::kInt && v.k != K::kBool)
        fail("slice indices must be integers or None");
      return given ? v.as_int() : 0;
    };
    bool has_start, has_stop, has_step;
    int64_t a = num(start, has_start), b = num(stop, has_stop), st = num(step, has_step);
    if (!has_step) st = 1;
    if (st == 0) fail("slice step cannot be zero");
    std::u32string u;
    int64_t n;
    if (obj.k == K::kStr) {
      u = decode_utf8(obj.s);
      n = int64_t(u.size());
    } else if (obj.k == K::kList)
      n = int64_t(obj.l->size());
    else
      fail(std::string("'") + type_name(obj) + "' object is not subscriptable");
    // Python's PySlice_AdjustIndices.
    auto adjust = [&](int64_t v, bool given, int64_t def) {
      if (!given) return def;
      if (v < 0) {
        v += n;
        if (v < 0) v = st < 0 ? -1 : 0;
      } else if (v >= n)
        v = st < 0 ? n - 1 : n;
      return v;
    };
    a = adjust(a, has_start, st < 0 ? n - 1 : 0);
    b = adjust(b, has_stop, st < 0 ? -1 : n);
    std::vector<int64_t> idx;
    if (st > 0)
      for (int64_t j = a; j < b; j += st) idx.push_back(j);
    else
      for (int64_t j = a; j > b; j += st) idx.push_back(j);
    if (obj.k == K::kStr) {
      std::u32string o;
      for (int64_t j : idx) o += u[size_t(j)];
      return Value::str(encode_utf8(o));
    }
    List o;
    for (int64_t j : idx) o.push_back((*obj.l)[size_t(j)]);
    return Value::list(std::move(o), obj.is_tuple);
  }

  // -------------------------------------------------- operators

  Value binary(const std::string& op, const Value& a, const Value& b) {
    if (op == "~") {
      if (a.undefined() && false) undefined_error(a);
      return Value::str(to_str(a) + to_str(b));
    }
    if (a.undefined()) undefined_error(a);
    if (b.undefined()) undefined_error(b);
    auto type_error = [&]() -> Value {
      fail("unsupported operand type(s) for " + op + ": '" + type_name(a) + "' and '" +
           type_name(b) + "'");
    };
    if (op == "+") {
      if (a.k == K::kStr && b.k == K::kStr) return Value::str(a.s + b.s);
      if (a.k == K::kList && b.k == K::kList && a.is_tuple == b.is_tuple) {
        List o = *a.l;
        o.insert(o.end(), b.l->begin(), b.l->end());
        return Value::list(std::move(o), a.is_tuple);
      }
    }
    if (op == "*") {
      const Value* seq = (a.k == K::kStr || a.k == K::kList)   ? &a
                         : (b.k == K::kStr || b.k == K::kList) ? &b
                                                               : nullptr;
      const Value* cnt = seq == &a ? &b : &a;
      if (seq && (cnt->k == K::kInt || cnt->k == K::kBool)) {
        int64_t n = std::max<int64_t>(0, cnt->as_int());
        if (seq->k == K::kStr) {
          std::string o;
          for (int64_t j = 0; j < n; ++j) o += seq->s;
          return Value::str(o);
        }
        List o;
        for (int64_t j = 0; j < n; ++j) o.insert(o.end(), seq->l->begin(), seq->l->end());
        return Value::list(std::move(o), seq->is_tuple);
      }
    }
    if (op == "%" && a.k == K::kStr) return Value::str(percent_format(a.s, b));
    if (op == "+" && (a.k == K::kStr || a.k == K::kList) && !b.number())
      fail(std::string("can only concatenate ") + type_name(a) + " (not \"" + type_name(b) +
           "\") to " + type_name(a));
    if (op == "+" && a.k == K::kStr)
      fail(std::string("can only concatenate str (not \"") + type_name(b) + "\") to str");
    if (!a.number() || !b.number()) return type_error();
    bool ints = a.k != K::kFloat && b.k != K::kFloat;
    int64_t x = a.as_int(), y = b.as_int();
    double fx = a.as_double(), fy = b.as_double();
    if (op == "+") return ints ? Value::integer(x + y) : Value::real(fx + fy);
    if (op == "-") return ints ? Value::integer(x - y) : Value::real(fx - fy);
    if (op == "*") return ints ? Value::integer(x * y) : Value::real(fx * fy);
    if (op == "/") {
      if (fy == 0) fail("division by zero");
      return Value::real(fx / fy);
    }
    if (op == "//" || op == "%") {
      if (ints) {
        if (y == 0) fail("integer division or modulo by zero");
        int64_t q = x / y, r = x % y;
        if (r != 0 && ((r < 0) != (y < 0))) {
          --q;
          r += y;
        }
        return Value::integer(op == "//" ? q : r);
      }
      if (fy == 0) fail("float division by zero");
      double q = std::floor(fx / fy);
      return Value::real(op == "//" ? q : fx - q * fy);
    }
    if (op == "**") {
      if (ints && y >= 0) {
        int64_t r = 1;
        for (int64_t j = 0; j < y; ++j) r *= x;
        return Value::integer(r);
      }
      return Value::real(std::pow(fx, fy));
    }
    return type_error();
  }

  // printf-style `str % args` for %s, %r, %d, %i and %%.
  std::string percent_format(const std::string& fmt, const Value& args) {
    List items = (args.k == K::kList && args.is_tuple) ? *args.l : List{args};
    std::string out;
    size_t next = 0;
    for (size_t p = 0; p < fmt.size(); ++p) {
      if (fmt[p] != '%') {
        out += fmt[p];
        continue;
      }
      if (++p >= fmt.size()) fail("incomplete format");
      char c = fmt[p];
      if (c == '%') {
        out += '%';
        continue;
      }
      if (next >= items.size()) fail("not enough arguments for format string");
      const Value& v = items[next++];
      if (c == 's')
        out += to_str(v);
      else if (c == 'r')
        out += repr(v);
      else if (c == 'd' || c == 'i') {
        if (!v.number()) fail("%d format: a real number is required");
        out += std::to_string(v.k == K::kFloat ? int64_t(v.f) : v.as_int());
      } else
        fail(std::string("unsupported format character '") + c + "'");
    }
    if (next < items.size()) fail("not all arguments converted during string formatting");
    return out;
  }

  bool compare(const std::string& op, const Value& a, const Value& b) {
    if (op == "==") return py_eq(a, b);
    if (op == "!=") return !py_eq(a, b);
    if (op == "in") return py_contains(b, a);
    if (op == "notin") return !py_contains(b, a);
    int c = py_cmp(a, b, op.c_str());
    if (op == "<") return c < 0;
    if (op == ">") return c > 0;
    if (op == "<=") return c <= 0;
    return c >= 0;
  }

  // -------------------------------------------------- expressions

  Args eval_args(const Expr& e) {
    Args a;
    for (auto& x : e.args) a.pos.push_back(eval(*x));
    for (auto& [k, x] : e.kwargs) a.kw.emplace_back(k, eval(*x));
    return a;
  }

  Value call(const Value& fn, Args& args) {
    if (fn.undefined()) undefined_error(fn);
    if (fn.k != K::kFn) fail(std::string("'") + type_name(fn) + "' object is not callable");
    return (*fn.fn)(args);
  }

  Value eval(const Expr& e) {
    switch (e.kind) {
      case Expr::kConst:
        return e.constant;
      case Expr::kName:
        return lookup(e.name);
      case Expr::kList:
      case Expr::kTuple: {
        List l;
        for (auto& x : e.args) l.push_back(eval(*x));
        return Value::list(std::move(l), e.kind == Expr::kTuple);
      }
      case Expr::kDict: {
        Value d = Value::dict();
        for (size_t j = 0; j + 1 < e.args.size(); j += 2) {
          Value k = eval(*e.args[j]);
          if (k.k != K::kStr) fail("dict literal keys must be strings here");
          d.d->set(k.s, eval(*e.args[j + 1]));
        }
        return d;
      }
      case Expr::kAttr:
        return getattr(eval(*e.a), e.name);
      case Expr::kItem:
        return getitem(eval(*e.a), eval(*e.b));
      case Expr::kSlice: {
        Value obj = eval(*e.a);
        auto opt = [&](const ExprP& x) { return x ? eval(*x) : Value::none(); };
        return slice(obj, opt(e.args[0]), opt(e.args[1]), opt(e.args[2]));
      }
      case Expr::kCall: {
        Value fn = eval(*e.a);
        Args a = eval_args(e);
        return call(fn, a);
      }
      case Expr::kFilter: {
        Value v = eval(*e.a);
        Args a = eval_args(e);
        return apply_filter(e.name, v, a);
      }
      case Expr::kTest: {
        Value v = eval(*e.a);
        Args a = eval_args(e);
        bool r = apply_test(e.name, v, a);
        return Value::boolean(e.negated ? !r : r);
      }
      case Expr::kNeg:
      case Expr::kPos: {
        Value v = eval(*e.a);
        if (v.undefined()) undefined_error(v);
        if (!v.number())
          fail(std::string("bad operand type for unary ") + (e.kind == Expr::kNeg ? "-" : "+") +
               ": '" + type_name(v) + "'");
        if (e.kind == Expr::kPos) return v.k == K::kFloat ? v : Value::integer(v.as_int());
        return v.k == K::kFloat ? Value::real(-v.f) : Value::integer(-v.as_int());
      }
      case Expr::kNot:
        return Value::boolean(!truthy(eval(*e.a)));
      case Expr::kAnd: {
        Value a = eval(*e.a);
        return truthy(a) ? eval(*e.b) : a;
      }
      case Expr::kOr: {
        Value a = eval(*e.a);
        return truthy(a) ? a : eval(*e.b);
      }
      case Expr::kBinary:
        return binary(e.name, eval(*e.a), eval(*e.b));
      case Expr::kCompare: {
        Value left = eval(*e.a);
        for (size_t j = 0; j < e.ops.size(); ++j) {
          Value right = eval(*e.args[j]);
          if (!compare(e.ops[j], left, right)) return Value::boolean(false);
          left = std::move(right);
        }
        return Value::boolean(true);
      }
      case Expr::kCond:
        if (truthy(eval(*e.b))) return eval(*e.a);
        return e.c ? eval(*e.c)
                   : Value::undef(
                         "the inline if expression evaluated to false and no else section was "
                         "defined");
    }
    return Value::undef();
  }

  // -------------------------------------------------- filters and tests

  Value apply_filter(const std::string& name, const Value& v, Args& a) {
    auto need_str = [&](const Value& x) { return to_str(x); };
    if (name == "trim") return Value::str(py_strip(need_str(v), a.get(0, "chars"), true, true));
    if (name == "length" || name == "count") {
      switch (v.k) {
        case K::kUndef:
          return Value::integer(0);
        case K::kStr:
          return Value::integer(int64_t(str_len(v.s)));
        case K::kList:
          return Value::integer(int64_t(v.l->size()));
        case K::kDict:
          return Value::integer(int64_t(v.d->items.size()));
        default:
          fail(std::string("object of type '") + type_name(v) + "' has no len()");
      }
    }
    if (name == "tojson") {
      JsonStyle st;
      st.ensure_ascii = truthy(a.get(0, "ensure_ascii", Value::boolean(false)));
      Value indent = a.get(1, "indent", Value::none());
      if (indent.k == K::kInt) {
        st.indent = int(indent.i);
        st.indent_str = std::string(size_t(std::max<int64_t>(0, indent.i)), ' ');
      } else if (indent.k == K::kStr) {
        st.indent = 0;
        st.indent_str = indent.s;
      }
      if (st.indent >= 0) st.item_sep = ",";
      Value seps = a.get(2, "separators", Value::none());
      if (seps.k == K::kList && seps.l->size() == 2) {
        st.item_sep = to_str((*seps.l)[0]);
        st.key_sep = to_str((*seps.l)[1]);
      }
      st.sort_keys = truthy(a.get(3, "sort_keys", Value::boolean(false)));
      std::string out;
      json_dump(out, v, st, 0);
      return Value::str(out);
    }
    if (name == "string") return Value::str(to_str(v));
    if (name == "list") return Value::list(iterate(v));
    if (name == "first" || name == "last") {
      List l = iterate(v);
      if (l.empty()) return Value::undef("No first item, sequence was empty.");
      return name == "first" ? l.front() : l.back();
    }
    if (name == "lower" || name == "upper" || name == "capitalize" || name == "title") {
      Value s = Value::str(to_str(v));
      Args none;
      return call(str_method(s, name), none);
    }
    if (name == "replace") {
      return Value::str(replace(to_str(v), a.get(0, "old"), a.get(1, "new"),
                                a.get(2, "count", Value::integer(-1)).as_int()));
    }
    if (name == "default" || name == "d") {
      Value def = a.get(0, "default_value", Value::str(""));
      bool boolean = truthy(a.get(1, "boolean", Value::boolean(false)));
      if (v.undefined() || (boolean && !truthy(v))) return def;
      return v;
    }
    if (name == "join") {
      std::string sep = to_str(a.get(0, "d", Value::str("")));
      Value attr = a.get(1, "attribute");
      std::string out;
      bool first = true;
      for (auto& x : iterate(v)) {
        out += (first ? "" : sep) + to_str(attr.undefined() ? x : getattr_path(x, attr));
        first = false;
      }
      return Value::str(out);
    }
    if (name == "items") {
      if (v.undefined()) return Value::list({});
      if (v.k != K::kDict) fail("can only get item pairs from a mapping.");
      Args none;
      return call(method(v, "items"), none);
    }
    if (name == "selectattr" || name == "rejectattr" || name == "select" || name == "reject") {
      bool attr = name == "selectattr" || name == "rejectattr";
      bool keep_if = name == "selectattr" || name == "select";
      List out;
      size_t base = attr ? 1 : 0;
      Value attr_name = attr ? a.get(0, "attribute") : Value::undef();
      std::string test = a.pos.size() > base ? to_str(a.pos[base]) : "";
      Args test_args;
      for (size_t j = base + 1; j < a.pos.size(); ++j) test_args.pos.push_back(a.pos[j]);
      for (auto& x : iterate(v)) {
        Value item = attr ? getattr_path(x, attr_name) : x;
        bool r = test.empty() ? truthy(item) : apply_test(test, item, test_args);
        if (r == keep_if) out.push_back(x);
      }
      return Value::list(std::move(out));
    }
    if (name == "map") {
      List out;
      Value attribute = a.get(99, "attribute");
      if (!attribute.undefined()) {
        Value def = a.get(99, "default");
        for (auto& x : iterate(v)) {
          Value r = getattr_path(x, attribute);
          out.push_back(r.undefined() && !def.undefined() ? def : r);
        }
      } else {
        if (a.pos.empty()) fail("map requires a filter argument");
        std::string filter = to_str(a.pos[0]);
        Args rest;
        rest.pos.assign(a.pos.begin() + 1, a.pos.end());
        rest.kw = a.kw;
        for (auto& x : iterate(v)) out.push_back(apply_filter(filter, x, rest));
      }
      return Value::list(std::move(out));
    }
    if (name == "reverse") {
      if (v.k == K::kStr) {
        std::u32string u = decode_utf8(v.s);
        std::reverse(u.begin(), u.end());
        return Value::str(encode_utf8(u));
      }
      List l = iterate(v);
      std::reverse(l.begin(), l.end());
      return Value::list(std::move(l));
    }
    if (name == "unique") {
      List out;
      for (auto& x : iterate(v)) {
        bool seen = false;
        for (auto& y : out) seen |= py_eq(x, y);
        if (!seen) out.push_back(x);
      }
      return Value::list(std::move(out));
    }
    if (name == "sort" || name == "dictsort") {
      List l;
      if (name == "dictsort") {
        if (v.k != K::kDict) fail("dictsort needs a mapping");
        for (auto& [k, x] : v.d->items) l.push_back(Value::list({Value::str(k), x}, true));
      } else {
        l = iterate(v);
      }
      bool reverse = truthy(a.get(name == "sort" ? 0 : 2, "reverse", Value::boolean(false)));
      Value attribute = a.get(99, "attribute");
      auto key = [&](const Value& x) {
        if (name == "dictsort") return (*x.l)[0];
        return attribute.undefined() ? x : getattr_path(x, attribute);
      };
      std::stable_sort(l.begin(), l.end(), [&](const Value& x, const Value& y) {
        Value kx = key(x), ky = key(y);
        if (kx.k == K::kStr && ky.k == K::kStr) {  // case_sensitive=False by default
          std::string lx = kx.s, ly = ky.s;
          for (char& c : lx) c = char(std::tolower(static_cast<unsigned char>(c)));
          for (char& c : ly) c = char(std::tolower(static_cast<unsigned char>(c)));
          return reverse ? ly < lx : lx < ly;
        }
        int c = py_cmp(kx, ky, "<");
        return reverse ? c > 0 : c < 0;
      });
      return Value::list(std::move(l));
    }
    if (name == "sum") {
      Value total = a.get(1, "start", Value::integer(0));
      Value attribute = a.get(0, "attribute");
      for (auto& x : iterate(v))
        total = binary("+", total, attribute.undefined() ? x : getattr_path(x, attribute));
      return total;
    }
    if (name == "min" || name == "max") {
      List l = iterate(v);
      if (l.empty()) return Value::undef("No aggregated item, sequence was empty.");
      Value best = l[0];
      for (auto& x : l) {
        int c = py_cmp(x, best, "<");
        if ((name == "min" && c < 0) || (name == "max" && c > 0)) best = x;
      }
      return best;
    }
    if (name == "int") {
      Value def = a.get(0, "default", Value::integer(0));
      if (v.k == K::kInt || v.k == K::kBool) return Value::integer(v.as_int());
      if (v.k == K::kFloat) return Value::integer(int64_t(v.f));
      if (v.k == K::kStr) {
        std::string t = py_strip(v.s, Value::none(), true, true);
        char* end = nullptr;
        long long x = std::strtoll(t.c_str(), &end, 10);
        if (!t.empty() && end && *end == 0) return Value::integer(x);
        double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end && *end == 0) return Value::integer(int64_t(d));
      }
      return def;
    }
    if (name == "float") {
      Value def = a.get(0, "default", Value::real(0));
      if (v.number()) return Value::real(v.as_double());
      if (v.k == K::kStr) {
        char* end = nullptr;
        std::string t = py_strip(v.s, Value::none(), true, true);
        double d = std::strtod(t.c_str(), &end);
        if (!t.empty() && end && *end == 0) return Value::real(d);
      }
      return def;
    }
    if (name == "abs") {
      if (!v.number()) fail("bad operand type for abs()");
      return v.k == K::kFloat ? Value::real(std::fabs(v.f))
                              : Value::integer(std::llabs(v.as_int()));
    }
    if (name == "round") {
      int64_t prec = a.get(0, "precision", Value::integer(0)).as_int();
      std::string method = to_str(a.get(1, "method", Value::str("common")));
      double m = std::pow(10.0, double(prec)), x = v.as_double() * m;
      double r = method == "floor"  ? std::floor(x)
                 : method == "ceil" ? std::ceil(x)
                                    : std::round(x);
      return Value::real(r / m);
    }
    if (name == "safe") return v;
    if (name == "escape" || name == "e" || name == "forceescape") {
      std::string out;
      for (char c : to_str(v)) {
        switch (c) {
          case '&':
            out += "&amp;";
            break;
          case '<':
            out += "&lt;";
            break;
          case '>':
            out += "&gt;";
            break;
          case '"':
            out += "&#34;";
            break;
          case '\'':
            out += "&#39;";
            break;
          default:
            out += c;
        }
      }
      return Value::str(out);
    }
    if (name == "indent") {
      std::string width = "    ";
      Value w = a.get(0, "width", Value::integer(4));
      if (w.k == K::kStr)
        width = w.s;
      else
        width = std::string(size_t(std::max<int64_t>(0, w.as_int())), ' ');
      bool first = truthy(a.get(1, "first", Value::boolean(false)));
      bool blank = truthy(a.get(2, "blank", Value::boolean(false)));
      std::string s = to_str(v), out;
      std::vector<std::string> lines;
      size_t p = 0;
      while (true) {
        size_t q = s.find('\n', p);
        lines.push_back(s.substr(p, q == std::string::npos ? std::string::npos : q - p));
        if (q == std::string::npos) break;
        p = q + 1;
      }
      for (size_t j = 0; j < lines.size(); ++j) {
        if (j) out += '\n';
        bool ind = j == 0 ? first : (blank || !lines[j].empty());
        if (j > 0 && !blank && lines[j].empty()) ind = false;
        out += (ind ? width : "") + lines[j];
      }
      return Value::str(out);
    }
    if (name == "wordcount")
      return Value::integer(int64_t(py_split(to_str(v), Value::none(), -1).size()));
    if (name == "attr") return getattr(v, to_str(a.get(0, "name")));
    if (name == "batch") fail("the 'batch' filter is not supported");
    fail("no filter named '" + name + "'");
  }

  Value getattr_path(const Value& x, const Value& attribute) {
    if (attribute.k == K::kInt) return getitem(x, attribute);
    Value cur = x;
    for (auto& part : py_split(to_str(attribute), Value::str("."), -1)) {
      bool digits = !part.empty() && std::all_of(part.begin(), part.end(), [](char c) {
        return std::isdigit(static_cast<unsigned char>(c));
      });
      cur =
          digits ? getitem(cur, Value::integer(std::stoll(part))) : getitem(cur, Value::str(part));
      if (cur.undefined()) return cur;
    }
    return cur;
  }

  bool apply_test(const std::string& name, const Value& v, Args& a) {
    Value arg = a.get(0, "other");
    if (name == "defined") return !v.undefined();
    if (name == "undefined") return v.undefined();
    if (name == "none") return v.k == K::kNone;
    if (name == "string") return v.k == K::kStr;
    if (name == "number") return v.number();
    if (name == "integer") return v.k == K::kInt;
    if (name == "float") return v.k == K::kFloat;
    if (name == "boolean") return v.k == K::kBool;
    if (name == "true") return v.k == K::kBool && v.b;
    if (name == "false") return v.k == K::kBool && !v.b;
    if (name == "mapping") return v.k == K::kDict;
    if (name == "sequence")
      return v.k == K::kStr || v.k == K::kList || v.k == K::kDict || v.undefined();
    if (name == "iterable")
      return v.k == K::kStr || v.k == K::kList || v.k == K::kDict || v.undefined();
    if (name == "callable") return v.k == K::kFn;
    if (name == "odd" || name == "even") {
      if (!v.number()) fail("odd/even need a number");
      int64_t r = ((v.as_int() % 2) + 2) % 2;
      return name == "odd" ? r == 1 : r == 0;
    }
    if (name == "divisibleby") {
      int64_t d = arg.as_int();
      if (d == 0) fail("integer division or modulo by zero");
      return v.as_int() % d == 0;
    }
    if (name == "equalto" || name == "eq" || name == "==") return py_eq(v, arg);
    if (name == "ne" || name == "!=") return !py_eq(v, arg);
    if (name == "lt" || name == "<" || name == "lessthan") return py_cmp(v, arg, "<") < 0;
    if (name == "le" || name == "<=") return py_cmp(v, arg, "<=") <= 0;
    if (name == "gt" || name == ">" || name == "greaterthan") return py_cmp(v, arg, ">") > 0;
    if (name == "ge" || name == ">=") return py_cmp(v, arg, ">=") >= 0;
    if (name == "in") return py_contains(arg, v);
    if (name == "sameas") {
      if (v.k != arg.k) return false;
      if (v.k == K::kNone || v.k == K::kUndef) return true;
      if (v.k == K::kBool) return v.b == arg.b;
      if (v.k == K::kInt) return v.i == arg.i && v.i >= -5 && v.i <= 256;  // CPython's cached ints
      return (v.k == K::kList && v.l == arg.l) ||
             ((v.k == K::kDict || v.k == K::kNs) && v.d == arg.d);
    }
    if (name == "lower" || name == "upper") {
      std::string s = to_str(v);
      bool cased = false;
      for (unsigned char c : s) {
        if (name == "lower" ? std::isupper(c) : std::islower(c)) return false;
        cased |= std::isalpha(c) != 0;
      }
      return cased;
    }
    fail("no test named '" + name + "'");
  }

  // -------------------------------------------------- statements

  Flow exec(const Body& body) {
    for (auto& n : body) {
      Flow f = exec(*n);
      if (f != Flow::kNormal) return f;
    }
    return Flow::kNormal;
  }

  void set_targets(const std::vector<std::string>& targets, const Value& v) {
    if (targets.size() == 1) {
      assign(targets[0], v);
      return;
    }
    List items = iterate(v);
    if (items.size() != targets.size())
      fail("cannot unpack " + std::to_string(items.size()) + " values into " +
           std::to_string(targets.size()));
    for (size_t j = 0; j < targets.size(); ++j) assign(targets[j], items[j]);
  }

  Flow exec(const Node& n) {
    switch (n.kind) {
      case Node::kText:
        *out += n.text;
        return Flow::kNormal;
      case Node::kOutput:
        *out += to_str(eval(*n.expr));
        return Flow::kNormal;
      case Node::kIf:
        for (auto& [cond, body] : n.branches)
          if (truthy(eval(*cond))) return exec(body);
        return exec(n.else_body);
      case Node::kFor:
        return exec_for(n);
      case Node::kSet: {
        Value v = eval(*n.expr);
        if (!n.attr.empty()) {
          Value ns = lookup(n.targets[0]);
          if (ns.k != K::kNs) fail("cannot assign attribute on non-namespace object");
          ns.d->set(n.attr, v);
        } else {
          set_targets(n.targets, v);
        }
        return Flow::kNormal;
      }
      case Node::kSetBlock: {
        std::string captured = capture(n.body);
        Value v = Value::str(captured);
        if (n.filter) v = apply_placeholder_filter(*n.filter, v);
        assign(n.targets[0], v);
        return Flow::kNormal;
      }
      case Node::kFilterBlock: {
        std::string captured = capture(n.body);
        *out += to_str(apply_placeholder_filter(*n.filter, Value::str(captured)));
        return Flow::kNormal;
      }
      case Node::kMacro:
        assign(n.name, make_macro(n));
        return Flow::kNormal;
      case Node::kBreak:
        return Flow::kBreak;
      case Node::kContinue:
        return Flow::kContinue;
      case Node::kGeneration: {
        size_t begin = out->size();
        Flow f = exec(n.body);
        if (spans) spans->emplace_back(begin, out->size());
        return f;
      }
    }
    return Flow::kNormal;
  }

  Value apply_placeholder_filter(const Expr& chain, Value v) {
    frames.push_back(std::make_shared<Frame>());
    frames.back()->emplace_back("\x01", v);
    Value r = eval(chain);
    frames.pop_back();
    return r;
  }

  std::string capture(const Body& body) {
    std::string buf;
    std::string* saved = out;
    auto* saved_spans = spans;
    out = &buf;
    spans = nullptr;
    exec(body);
    out = saved;
    spans = saved_spans;
    return buf;
  }

  Flow exec_for(const Node& n) {
    Value iterable = eval(*n.expr);
    List items = iterate(iterable);
    if (n.cond) {
      List kept;
      for (auto& x : items) {
        frames.push_back(std::make_shared<Frame>());
        set_targets(n.targets, x);
        bool keep = truthy(eval(*n.cond));
        frames.pop_back();
        if (keep) kept.push_back(x);
      }
      items = std::move(kept);
    }
    if (items.empty()) {
      frames.push_back(std::make_shared<Frame>());
      exec(n.else_body);
      frames.pop_back();
      return Flow::kNormal;
    }
    int64_t len = int64_t(items.size());
    for (int64_t j = 0; j < len; ++j) {
      frames.push_back(std::make_shared<Frame>());
      Value loop = Value::dict();
      Dict& d = *loop.d;
      d.set("index0", Value::integer(j));
      d.set("index", Value::integer(j + 1));
      d.set("revindex0", Value::integer(len - j - 1));
      d.set("revindex", Value::integer(len - j));
      d.set("first", Value::boolean(j == 0));
      d.set("last", Value::boolean(j == len - 1));
      d.set("length", Value::integer(len));
      d.set("depth", Value::integer(1));
      d.set("depth0", Value::integer(0));
      d.set("previtem", j > 0 ? items[size_t(j - 1)] : Value::undef("there is no previous item"));
      d.set("nextitem", j + 1 < len ? items[size_t(j + 1)] : Value::undef("there is no next item"));
      d.set("cycle", Value::function([j](Args& a) -> Value {
              if (a.pos.empty()) fail("no items for cycling given");
              return a.pos[size_t(j) % a.pos.size()];
            }));
      assign("loop", loop);
      set_targets(n.targets, items[size_t(j)]);
      Flow f = exec(n.body);
      frames.pop_back();
      if (f == Flow::kBreak) break;
    }
    return Flow::kNormal;
  }

  Value make_macro(const Node& n) {
    const Node* node = &n;
    std::shared_ptr<Frame> root = frames.front();
    return Value::function([this, node, root](Args& a) {
      Renderer sub;
      sub.frames = {root, std::make_shared<Frame>()};
      for (size_t j = 0; j < node->params.size(); ++j) {
        const auto& [pname, def] = node->params[j];
        Value v = a.get(j, pname.c_str());
        if (!a.has(j, pname.c_str()) && def) v = sub.eval(*def);
        sub.assign(pname, v);
      }
      if (a.pos.size() > node->params.size())
        fail("macro '" + node->name + "' takes not more than " +
             std::to_string(node->params.size()) + " argument(s)");
      std::string buf;
      sub.out = &buf;
      sub.depth = depth + 1;
      if (sub.depth > 64) fail("macro recursion too deep");
      sub.exec(node->body);
      return Value::str(buf);
    });
  }
};

Value make_namespace(Args& a) {
  Value ns = Value::dict();
  ns.k = K::kNs;
  for (auto& p : a.pos) {
    if (p.k != K::kDict) fail("namespace() positional argument must be a mapping");
    for (auto& [k, v] : p.d->items) ns.d->set(k, v);
  }
  for (auto& [k, v] : a.kw) ns.d->set(k, v);
  return ns;
}

Value make_range(Args& a) {
  int64_t start = 0, stop = 0, step = 1;
  if (a.pos.size() == 1)
    stop = a.pos[0].as_int();
  else if (a.pos.size() >= 2) {
    start = a.pos[0].as_int();
    stop = a.pos[1].as_int();
    if (a.pos.size() > 2) step = a.pos[2].as_int();
  } else
    fail("range expected at least 1 argument");
  if (step == 0) fail("range() arg 3 must not be zero");
  List out;
  for (int64_t j = start; step > 0 ? j < stop : j > stop; j += step) {
    out.push_back(Value::integer(j));
    if (out.size() > 1000000) fail("range too big");
  }
  return Value::list(std::move(out));
}

}  // namespace

struct JinjaTemplate::Impl {
  Body body;
  bool uses_generation = false;
};

JinjaTemplate::JinjaTemplate() = default;
JinjaTemplate::~JinjaTemplate() = default;
JinjaTemplate::JinjaTemplate(JinjaTemplate&&) noexcept = default;
JinjaTemplate& JinjaTemplate::operator=(JinjaTemplate&&) noexcept = default;

Result<JinjaTemplate> JinjaTemplate::parse(std::string_view source) {
  try {
    auto impl = std::make_shared<Impl>();
    Lexer lexer{std::string(source)};
    Parser parser(lexer.run());
    impl->body = parser.parse_template(&impl->uses_generation);
    JinjaTemplate t;
    t.impl_ = std::move(impl);
    return t;
  } catch (const TemplateError& e) {
    return Status::data(e.what());
  }
}

bool JinjaTemplate::has_generation_tags() const { return impl_ && impl_->uses_generation; }

Result<RenderOutput> JinjaTemplate::render(const nlohmann::ordered_json& context) const {
  if (!impl_) return Status::internal("render() on an empty JinjaTemplate");
  if (!context.is_object()) return Status::internal("chat template context must be a JSON object");
  RenderOutput result;
  try {
    Renderer r;
    auto globals = std::make_shared<Frame>();
    globals->emplace_back("namespace", Value::function(make_namespace));
    globals->emplace_back("range", Value::function(make_range));
    globals->emplace_back("dict", Value::function([](Args& a) {
                            Value d = Value::dict();
                            for (auto& [k, v] : a.kw) d.d->set(k, v);
                            return d;
                          }));
    globals->emplace_back("raise_exception", Value::function([](Args& a) -> Value {
                            fail(a.pos.empty() ? std::string("raise_exception") : to_str(a.pos[0]));
                          }));
    globals->emplace_back("strftime_now", Value::function([](Args& a) {
                            std::time_t now = std::time(nullptr);
                            std::tm tm{};
                            localtime_r(&now, &tm);
                            char buf[256];
                            size_t n = std::strftime(buf, sizeof buf,
                                                     to_str(a.get(0, "format")).c_str(), &tm);
                            return Value::str(std::string(buf, n));
                          }));
    for (auto& [k, v] : context.items()) {
      bool replaced = false;
      for (auto& [gk, gv] : *globals)
        if (gk == k) {
          gv = from_json(v);
          replaced = true;
        }
      if (!replaced) globals->emplace_back(k, from_json(v));
    }
    r.frames.push_back(globals);
    r.frames.push_back(std::make_shared<Frame>());
    r.out = &result.text;
    r.spans = &result.generation_spans;
    r.exec(impl_->body);
  } catch (const TemplateError& e) {
    return Status::data(e.what());
  }
  return result;
}

}  // namespace kiln::chat
