// Parsing untrusted JSON with nlohmann::json under a nesting cap.
//
// nlohmann parses iteratively, but dumping, comparing and copying a value recurse, and every level
// costs a node: a file of a million '[' would exhaust the stack or memory later, far from where
// it was read. parse_untrusted_json() refuses input nested deeper than max_depth (counted over
// arrays and objects, outside strings) before nlohmann sees it, with a kData error naming the
// limit and the byte offset. Callers add the file with Status::with_file. Thread-safe.
#pragma once

#include <nlohmann/json.hpp>

#include <cstddef>
#include <string_view>

#include "common/status.h"

namespace kiln {

// Deeper than any JSON Kiln writes or reads (manifests, tokenizers, metadata: under 10 levels).
inline constexpr size_t kMaxJsonDepth = 256;

// OK when no array/object nesting in `text` goes deeper than max_depth.
Status check_json_depth(std::string_view text, size_t max_depth = kMaxJsonDepth);

// check_json_depth, then nlohmann::json::parse; "not valid JSON: ..." on a syntax error.
Result<nlohmann::json> parse_untrusted_json(std::string_view text,
                                            size_t max_depth = kMaxJsonDepth);

}  // namespace kiln
