#include "common/text.h"

#include <cctype>
#include <charconv>
#include <climits>
#include <cmath>
#include <cstdint>
#include <cstdio>
#include <stdexcept>
#include <string>

namespace kiln {

std::string human_bytes(uint64_t bytes) {
  const char* units[] = {"B", "KiB", "MiB", "GiB", "TiB"};
  double v = static_cast<double>(bytes);
  int u = 0;
  while (v >= 1024 && u < 4) {
    v /= 1024;
    ++u;
  }
  char buf[48];
  if (u == 0) {
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(bytes));
  } else {
    std::snprintf(buf, sizeof buf, "%.1f %s", v, units[u]);
  }
  return buf;
}

void append_json_string(std::string* out, std::string_view text) {
  out->push_back('"');
  for (char ch : text) {
    const auto c = static_cast<unsigned char>(ch);
    switch (c) {
      case '"': out->append("\\\""); break;
      case '\\': out->append("\\\\"); break;
      case '\b': out->append("\\b"); break;
      case '\f': out->append("\\f"); break;
      case '\n': out->append("\\n"); break;
      case '\r': out->append("\\r"); break;
      case '\t': out->append("\\t"); break;
      default:
        if (c < 0x20) {
          char buf[8];
          std::snprintf(buf, sizeof buf, "\\u%04x", c);
          out->append(buf);
        } else {
          out->push_back(ch);
        }
    }
  }
  out->push_back('"');
}

std::string bytes_in(uint64_t bytes, ByteUnit unit, int decimals) {
  static const char* const names[] = {"KiB", "MiB", "GiB"};
  const int u = static_cast<int>(unit);
  const double v = static_cast<double>(bytes) / static_cast<double>(uint64_t{1} << (10 * (u + 1)));
  char buf[48];
  std::snprintf(buf, sizeof buf, "%.*f %s", decimals, v, names[u]);
  return buf;
}

Result<uint64_t> parse_byte_size(std::string_view text) {
  std::string s;
  for (char ch : text)
    if (!std::isspace(static_cast<unsigned char>(ch))) s += ch;
  // (Appended piece by piece: g++ 12 warns, wrongly, about '"'" + std::string + "..."'.)
  auto error = [&](const char* what) {
    std::string m(1, '\'');
    m.append(text).append("'").append(what);
    return Status::usage(m);
  };
  auto not_a_size = [&] {
    return error(" is not a size (examples: 80GiB, 16GB, 512M, 1.5G, 1e9)");
  };
  // The number: digits, '.', and an exponent; std::stod would also take "inf", "nan" and hex.
  size_t used = 0;
  while (used < s.size() && (std::isdigit(static_cast<unsigned char>(s[used])) || s[used] == '.'))
    ++used;
  if (used == 0) return not_a_size();
  if (used < s.size() && (s[used] == 'e' || s[used] == 'E')) {
    size_t e = used + 1;
    if (e < s.size() && (s[e] == '+' || s[e] == '-')) ++e;
    const size_t digits = e;
    while (e < s.size() && std::isdigit(static_cast<unsigned char>(s[e]))) ++e;
    if (e > digits) used = e;
  }
  double v = 0;
  try {
    size_t read = 0;
    v = std::stod(s.substr(0, used), &read);
    if (read != used) return not_a_size();
  } catch (const std::exception&) {
    return not_a_size();
  }
  std::string unit = s.substr(used);
  for (char& ch : unit) ch = static_cast<char>(std::toupper(static_cast<unsigned char>(ch)));
  const bool integer = s.find_first_not_of("0123456789") >= used;  // exact, past 2^53 too
  if (!unit.empty() && unit.back() == 'B') unit.pop_back();
  if (unit.size() == 2 && unit.back() == 'I') unit.pop_back();
  int shift = -1;
  if (unit.empty())
    shift = 0;
  else if (unit == "K")
    shift = 10;
  else if (unit == "M")
    shift = 20;
  else if (unit == "G")
    shift = 30;
  else if (unit == "T")
    shift = 40;
  if (shift < 0) {
    return error(": unknown unit (use K, M, G or T, with or without iB)");
  }
  if (integer) {
    uint64_t n = 0;
    const auto [end, ec] = std::from_chars(s.data(), s.data() + used, n);
    if (ec != std::errc() || end != s.data() + used || (shift > 0 && n > (UINT64_MAX >> shift))) {
      return error(" is too large a size (2^64 bytes or more)");
    }
    return n << shift;
  }
  const double bytes = std::round(v * std::ldexp(1.0, shift));
  if (!std::isfinite(bytes) || bytes >= 18446744073709551616.0) {
    return error(" is too large a size (2^64 bytes or more)");
  }
  return static_cast<uint64_t>(bytes);
}

double seconds_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
}

double ms_since(std::chrono::steady_clock::time_point t0) {
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count();
}

}  // namespace kiln
