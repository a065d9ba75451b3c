// Parsing untrusted JSON with nlohmann::json under a nesting cap.
//
// nlohmann parses iteratively, but dumping, comparing and copying a value recurse, and every level
// costs a node: a file of a million '[' would exhaust the stack or memory later, far from where
// it was read. parse_untrusted_json() refuses input nested deeper than max_depth (counted over
// arrays and objects, outside strings) before nlohmann sees it, with a kData error naming the
// limit and the byte offset. Callers add the file with Status::with_file. Thread-safe.
//
// Integers read back from JSON (checkpoints, metrics, stage and index files, headers) go through
// json_integer*(): nlohmann keeps an integer past 64 bits, or one written 1e3 or 1.5, as a
// double, and get<int64_t>() of a double outside the type's range is undefined behaviour (and a
// fractional one is silently truncated); get<uint64_t>() of -1 wraps. These take only a JSON
// integer within T's range, else throw nlohmann::json::type_error (302) naming the key and the
// value, so a caller's existing `catch (const nlohmann::json::exception&)` turns it into its
// usual data error naming the file.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <cstdint>
#include <limits>
#include <map>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <vector>

#include "common/status.h"

namespace kiln {

// Deeper than any JSON Kiln writes or reads (manifests, tokenizers, metadata: under 10 levels).
inline constexpr size_t kMaxJsonDepth = 256;

// OK when no array/object nesting in `text` goes deeper than max_depth.
Status check_json_depth(std::string_view text, size_t max_depth = kMaxJsonDepth);

// check_json_depth, then nlohmann::json::parse; "not valid JSON: ..." on a syntax error.
Result<nlohmann::json> parse_untrusted_json(std::string_view text,
                                            size_t max_depth = kMaxJsonDepth);

// v for an error message: a scalar as JSON, an array or object by kind and size only (dumping one
// recurses as deep as it nests, and it may be large). Cut to 40 bytes.
template <typename Json>
std::string json_shown(const Json& v) {
  std::string s = v.is_array()    ? "an array of " + std::to_string(v.size())
                  : v.is_object() ? "an object of " + std::to_string(v.size()) + " keys"
                                  : v.dump();
  if (s.size() > 40) s = s.substr(0, 37) + "...";
  return s;
}

// parse_untrusted_json, or a discarded value (is_discarded()) when the text is not valid JSON or
// nests deeper than max_depth: for readers that skip what does not parse (lines of a log).
nlohmann::json parse_untrusted_json_or_discarded(std::string_view text,
                                                 size_t max_depth = kMaxJsonDepth);
// parse_untrusted_json for code that handles nlohmann's exceptions: nesting deeper than max_depth
// throws nlohmann::json::parse_error naming the limit, as invalid JSON does.
nlohmann::json parse_untrusted_json_or_throw(std::string_view text, size_t max_depth = kMaxJsonDepth);

namespace detail {
// Throws nlohmann::json::type_error (302): "<expected>, not <shown>".
[[noreturn]] void throw_json_type_error(const std::string& expected, const std::string& shown);
}  // namespace detail

// v as T when it is a JSON integer within T's range; `what` names it in the error ("step").
template <typename T, typename Json>
T json_integer(const Json& v, std::string_view what) {
  static_assert(std::is_integral_v<T> && !std::is_same_v<T, bool>);
  if (v.is_number_unsigned()) {
    const uint64_t u = v.template get<uint64_t>();
    if (std::in_range<T>(u)) return static_cast<T>(u);
  } else if (v.is_number_integer()) {
    const int64_t i = v.template get<int64_t>();
    if (std::in_range<T>(i)) return static_cast<T>(i);
  }
  detail::throw_json_type_error("'" + std::string(what) + "' must be an integer from " +
                                    std::to_string(std::numeric_limits<T>::min()) + " to " +
                                    std::to_string(std::numeric_limits<T>::max()),
                                json_shown(v));
}

// obj.at(key) as T (at() throws out_of_range when the key is missing).
template <typename T, typename Json>
T json_integer_at(const Json& obj, const char* key) {
  return json_integer<T>(obj.at(key), key);
}

// obj[key] as T, or `fallback` when obj has no such key (nlohmann's value(key, fallback)).
template <typename T, typename Json>
T json_integer_or(const Json& obj, const char* key, T fallback) {
  auto it = obj.find(key);
  return it == obj.end() ? fallback : json_integer<T>(*it, key);
}

// A JSON array of integers; `what` names the array ("shape").
template <typename T, typename Json>
std::vector<T> json_integers(const Json& a, std::string_view what) {
  if (!a.is_array())
    detail::throw_json_type_error("'" + std::string(what) + "' must be an array of integers",
                                  json_shown(a));
  std::vector<T> out;
  out.reserve(a.size());
  for (const auto& x : a) out.push_back(json_integer<T>(x, what));
  return out;
}

// A JSON object whose values are integers; `what` names the object.
template <typename T, typename Json>
std::map<std::string, T> json_integer_map(const Json& o, std::string_view what) {
  if (!o.is_object())
    detail::throw_json_type_error("'" + std::string(what) + "' must be an object of integers",
                                  json_shown(o));
  std::map<std::string, T> out;
  for (auto it = o.begin(); it != o.end(); ++it)
    out[it.key()] = json_integer<T>(it.value(), std::string(what) + "." + it.key());
  return out;
}

}  // namespace kiln
